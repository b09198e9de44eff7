"""Kubernetes manifests of redline, built from the spec, for a cluster running prometheus-operator
and Grafana's dashboard sidecar (`kubectl apply -k deploy/kubernetes`).

What runs: the gateway, the exporters, the remediation receiver (with worker threads), the index
replicator and the session CDC consumer as Deployments, and the spot agent as a DaemonSet on spot
nodes; Services and ServiceMonitors (a PodMonitor for the DaemonSet), the `PrometheusRule`, an
`AlertmanagerConfig`, the dashboards as ConfigMaps for the Grafana sidecar, PodDisruptionBudgets,
RBAC. The spec and each process's settings are ConfigMaps; secrets are Secrets the operator
creates (`required_secrets`, docs/kubernetes.md), referenced by name and never written here.

`build_kubernetes_manifests` is pure (the spec and `KubernetesOptions` in, one resource per file
out); `build_kubernetes_outputs` renders them with the DO-NOT-EDIT header. `redline generate`
writes them to `deploy/kubernetes/` with the default options; `redline generate --kubernetes
DIR` writes the same set, with the options given, to DIR.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from redline import __version__
from redline.dashboards.render import DASHBOARDS_DIR, build_dashboard_outputs
from redline.generate.kube_alerting import (
    SecretKey,
    build_alertmanager_config_resource,
    escalation_secrets,
)
from redline.rules.alertmanager import build_prometheus_rule
from redline.rules.build import build_rule_groups
from redline.rules.model import format_duration
from redline.rules.render import render_yaml
from redline.slo.spec import Spec

KUBERNETES_DIR = Path("deploy/kubernetes")
KUSTOMIZATION = "kustomization.yaml"
DEFAULT_NAMESPACE = "redline"
DEFAULT_IMAGE = f"redline:{__version__}"

SpotProvider = Literal["aws", "gcp"]
SPOT_NODE_LABELS: dict[str, tuple[tuple[str, str], ...]] = {
    "aws": (("eks.amazonaws.com/capacityType", "SPOT"), ("karpenter.sh/capacity-type", "spot")),
    "gcp": (("cloud.google.com/gke-spot", "true"), ("cloud.google.com/gke-preemptible", "true")),
}
"""Labels the managed node groups of each cloud put on spot nodes; a node with any one of them
runs the spot agent (EKS managed groups and Karpenter; GKE Spot and preemptible VMs)."""

# Paths inside the containers.
SPEC_PATH = "/etc/redline/spec/spec.yaml"
SETTINGS_DIR = "/etc/redline/settings"
SECRETS_DIR = "/etc/redline/secrets"
DATA_DIR = "/var/lib/redline"
"""The image's home directory (compose/Dockerfile): the audit mirror and snapshots live here, on
an emptyDir, since the root filesystem is read-only."""

COMPONENT_LABEL = "app.kubernetes.io/component"
NAME_LABEL = "app.kubernetes.io/name"
JOB_LABEL = COMPONENT_LABEL
"""The ServiceMonitors take Prometheus' `job` from this label: jobs are named like compose's
(`gateway`, `exporters`, `remediation`, `spot-agent`), which `receiver.scrape_job` matches."""

GATEWAY, EXPORTERS, REMEDIATION = "gateway", "exporters", "remediation"
REPLICATOR, SESSIONS, SPOT_AGENT = "index-replicator", "sessions-replica", "spot-agent"
PORTS = {GATEWAY: 8080, EXPORTERS: 9109, REMEDIATION: 9095, SPOT_AGENT: 9110}
PORT_NAME = "http"
MILVUS_PORT = 19530
SERVING_PORT = 8000
SERVING_POD_SELECTOR = "redline.dev/serving=true"
"""The label of the serving pods the spot agent marks not ready on a notice (they also declare
the `redline.dev/spot-safe` readiness gate; docs/spot.md)."""

REDIS_URL = SecretKey("redline-redis", "url", "every redline process: the Redis URL")
REPLICA_URL = SecretKey(
    "redline-redis", "replica-url", "sessions-replica, exporters: the replica session store URL"
)
WEBHOOK_TOKEN = SecretKey(
    "redline-webhook-token",
    "token",
    "remediation and Alertmanager: the webhook bearer token Alertmanager sends",
)
ADMIN_TOKEN = SecretKey(
    "redline-admin-token",
    "token",
    "gateway (/admin) and spot-agent (calls the gateway; POST /notice): the admin token",
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class KubernetesBuildError(Exception):
    """The options cannot make valid manifests (a bad namespace, image or node label)."""


@dataclass(frozen=True)
class KubernetesOptions:
    """What the manifests are for: namespace, image, spot nodes, where the serving stack is."""

    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_IMAGE
    spot_provider: SpotProvider = "aws"
    spot_node_labels: tuple[tuple[str, str], ...] = ()
    """Labels marking spot nodes (any one matches); empty: the provider's usual ones."""
    serving_namespace: str | None = None
    """Namespace of the serving Services (`llm-<region>`) and Milvus; None: `namespace`."""
    gateway_replicas: int = 2
    remediation_replicas: int = 2
    remediation_workers: int = 2

    def check(self) -> None:
        """KubernetesBuildError naming the first option that cannot be used."""
        for what, value in (("namespace", self.namespace), ("serving namespace", self.serving)):
            if not _DNS_LABEL.match(value) or len(value) > 63:
                raise KubernetesBuildError(f"{what} {value!r} is not a DNS-1123 label")
        if not self.image or any(c.isspace() for c in self.image):
            raise KubernetesBuildError(f"image {self.image!r} is not an image reference")
        for key, value in self.spot_node_labels:
            if not _LABEL_KEY.match(key) or len(value) > 63:
                raise KubernetesBuildError(f"spot node label {key}={value} is not a valid label")
        if self.remediation_workers < 2:
            raise KubernetesBuildError("the receiver runs at least 2 workers")
        if min(self.gateway_replicas, self.remediation_replicas) < 1:
            raise KubernetesBuildError("replicas must be at least 1")

    @property
    def serving(self) -> str:
        """The namespace of the serving Services and Milvus."""
        return self.serving_namespace or self.namespace

    @property
    def node_labels(self) -> tuple[tuple[str, str], ...]:
        """The spot node labels in effect."""
        return self.spot_node_labels or SPOT_NODE_LABELS[self.spot_provider]


@dataclass(frozen=True)
class Workload:
    """One redline process as Kubernetes runs it: its argv, settings file and what it needs."""

    name: str
    args: tuple[str, ...]
    settings: dict[str, Any]
    resources: dict[str, dict[str, str]]
    replicas: int = 1
    port: int | None = None
    ready_path: str | None = None
    live_path: str | None = None
    env_secrets: tuple[tuple[str, SecretKey], ...] = ()
    file_secrets: tuple[SecretKey, ...] = ()
    uses_api: bool = False
    """Talks to the Kubernetes API (its service-account token is mounted)."""
    daemonset: bool = False
    recreate: bool = False
    """One at a time (a single consumer): stop the old pod before starting the new one."""
    grace_seconds: int = 30
    extra_env: tuple[dict[str, Any], ...] = field(default_factory=tuple)


def secret_path(key: SecretKey) -> str:
    """Where a Secret key is mounted in the containers that read it as a file."""
    return f"{SECRETS_DIR}/{key.secret}/{key.key}"


def serving_url(region: str, options: KubernetesOptions) -> str:
    """The serving Service of a region (an OpenAI-compatible engine behind `llm-<region>`)."""
    return f"http://llm-{region}.{options.serving}.svc:{SERVING_PORT}"


def milvus_uri(copy: str, options: KubernetesOptions) -> str:
    """The Milvus holding one copy of the index (`milvus-primary`, `milvus-replica`)."""
    return f"http://milvus-{copy}.{options.serving}.svc:{MILVUS_PORT}"


def _resources(cpu: str, memory: str, cpu_limit: str, memory_limit: str) -> dict[str, Any]:
    return {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu_limit, "memory": memory_limit},
    }


def _index_fields(spec: Spec, options: KubernetesOptions) -> dict[str, Any]:
    return {
        "collection": spec.drift.collection,
        "region": spec.regions[0],
        "primary_uri": milvus_uri("primary", options),
        "replica_uri": milvus_uri("replica", options),
    }


def _serve(name: str) -> dict[str, Any]:
    return {"host": "0.0.0.0", "port": PORTS[name], "log_level": "info"}


def build_workloads(spec: Spec, options: KubernetesOptions) -> list[Workload]:
    """Every redline process of the deployment, with its exact command line and settings."""
    upstreams = {region: serving_url(region, options) for region in spec.regions}
    gateway_url = f"http://{GATEWAY}:{PORTS[GATEWAY]}"
    redis = (("REDLINE_REDIS_URL", REDIS_URL),)
    index = _index_fields(spec, options)
    spec_args = ("--spec", SPEC_PATH)

    def config(name: str) -> tuple[str, str]:
        return ("--config", f"{SETTINGS_DIR}/{name}.yaml")

    gateway = Workload(
        GATEWAY,
        (GATEWAY, *config(GATEWAY), *spec_args),
        {**_serve(GATEWAY), "upstreams": upstreams, "admin_token_file": secret_path(ADMIN_TOKEN)},
        _resources("250m", "256Mi", "2", "512Mi"),
        replicas=options.gateway_replicas,
        port=PORTS[GATEWAY],
        ready_path="/healthz",
        live_path="/healthz",
        env_secrets=redis,
        file_secrets=(ADMIN_TOKEN,),
        # In-flight streams finish (or are resumed elsewhere) before the pod goes.
        grace_seconds=60,
    )
    exporters = Workload(
        EXPORTERS,
        (EXPORTERS, *config(EXPORTERS), *spec_args),
        {
            **_serve(EXPORTERS),
            "models": {"root": f"{DATA_DIR}/snapshots"},
            "endpoints": {"upstreams": upstreams},
            # Both need the user's data (a golden set, a drift reference): off until given.
            "golden_set": {"enabled": False, "gateway_url": gateway_url},
            "drift": {"enabled": False},
            "index_staleness": index,
        },
        _resources("200m", "384Mi", "1", "768Mi"),
        port=PORTS[EXPORTERS],
        ready_path="/healthz",
        live_path="/healthz",
        env_secrets=(*redis, ("REDLINE_KEEPALIVE__REPLICA_URL", REPLICA_URL)),
    )
    collection = index["collection"]
    remediation = Workload(
        REMEDIATION,
        (
            REMEDIATION,
            *config(REMEDIATION),
            *spec_args,
            "--workers",
            str(options.remediation_workers),
        ),
        {
            **_serve(REMEDIATION),
            "token_file": secret_path(WEBHOOK_TOKEN),
            "audit_file": f"{DATA_DIR}/audit.jsonl",
            "serving": {
                "gateway_url": gateway_url,
                "upstreams": upstreams,
                "pods": {
                    region: {
                        "kubernetes": {"service": f"llm-{region}", "namespace": options.serving}
                    }
                    for region in spec.regions
                },
            },
            "rollback": {"snapshot_root": f"{DATA_DIR}/snapshots"},
            "vector_index": {
                "collections": {
                    collection: {
                        "dim": 384,
                        "primary_uri": index["primary_uri"],
                        "replica_uri": index["replica_uri"],
                    }
                }
            },
        },
        _resources("200m", "256Mi", "1", "512Mi"),
        replicas=options.remediation_replicas,
        port=PORTS[REMEDIATION],
        ready_path="/readyz",
        live_path="/healthz",
        env_secrets=redis,
        file_secrets=(WEBHOOK_TOKEN,),
        uses_api=True,  # the rollback finds every serving pod from EndpointSlices
        grace_seconds=60,
    )
    replicator = Workload(
        REPLICATOR,
        ("index", "replicate", *config(REPLICATOR)),
        {"log_level": "info", "dim": 384, **index},
        _resources("100m", "256Mi", "1", "512Mi"),
        env_secrets=redis,
        recreate=True,
    )
    sessions = Workload(
        SESSIONS,
        ("sessions", "replica", *config(SESSIONS)),
        {"log_level": "info"},
        _resources("50m", "128Mi", "500m", "256Mi"),
        env_secrets=(*redis, ("REDLINE_REPLICA_URL", REPLICA_URL)),
        recreate=True,
    )
    spot_agent = Workload(
        SPOT_AGENT,
        ("spot-agent", "run", *config(SPOT_AGENT), *spec_args, "--node", "$(NODE_NAME)"),
        {
            **_serve(SPOT_AGENT),
            "provider": options.spot_provider,
            "gateway_urls": [gateway_url],
            "gateway_token_file": secret_path(ADMIN_TOKEN),
            "upstream_url": upstreams[spec.regions[0]],
            # On a notice: taint the node, take the serving pods on it out of their Services
            # (their readiness gate), and scale the serving Deployment up at once.
            "kubernetes": {
                "enabled": True,
                "namespace": options.serving,
                "pod_selector": SERVING_POD_SELECTOR,
            },
            "replacement": {
                "kind": "kubernetes",
                "deployment": f"llm-{spec.regions[0]}",
                "namespace": options.serving,
            },
        },
        _resources("50m", "128Mi", "500m", "256Mi"),
        port=PORTS[SPOT_AGENT],
        ready_path="/healthz",
        live_path="/healthz",
        env_secrets=redis,
        file_secrets=(ADMIN_TOKEN,),
        uses_api=True,
        daemonset=True,
        extra_env=tuple(
            {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for name, path in (
                ("NODE_NAME", "spec.nodeName"),
                ("POD_NAME", "metadata.name"),
                ("POD_NAMESPACE", "metadata.namespace"),
            )
        ),
    )
    return [gateway, exporters, remediation, replicator, sessions, spot_agent]


def kubernetes_spec(spec: Spec, options: KubernetesOptions) -> Spec:
    """The spec as the cluster uses it: the receiver is the `remediation` Service, its token
    the mounted Secret."""
    url = f"http://{REMEDIATION}.{options.namespace}.svc:{PORTS[REMEDIATION]}/alerts"
    receiver = spec.receiver.model_copy(
        update={"url": url, "bearer_token_file": secret_path(WEBHOOK_TOKEN)}
    )
    return spec.model_copy(update={"receiver": receiver})


def required_secrets(spec: Spec) -> list[SecretKey]:
    """Every Secret key the manifests reference, in a stable order (none is ever written)."""
    return [REDIS_URL, REPLICA_URL, WEBHOOK_TOKEN, ADMIN_TOKEN, *escalation_secrets(spec)]


# ---- resources ------------------------------------------------------------------------------


def _labels(name: str) -> dict[str, str]:
    return {NAME_LABEL: "redline", COMPONENT_LABEL: name}


def _meta(name: str, namespace: str | None, component: str, **extra: Any) -> dict[str, Any]:
    labels = {
        **_labels(component),
        "app.kubernetes.io/part-of": "redline",
        "app.kubernetes.io/version": __version__,
        "app.kubernetes.io/managed-by": "redline-generate",
    }
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = labels
    meta.update(extra)
    return meta


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
POD_SECURITY: dict[str, Any] = {
    # The image's `redline` user (compose/Dockerfile: useradd --uid 10001).
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _secret_volumes(workload: Workload) -> list[tuple[str, list[str]]]:
    """(Secret, keys) mounted as files, each Secret once."""
    found: dict[str, list[str]] = {}
    for key in workload.file_secrets:
        found.setdefault(key.secret, []).append(key.key)
    return sorted(found.items())


def _container(workload: Workload, options: KubernetesOptions) -> dict[str, Any]:
    env: list[dict[str, Any]] = list(workload.extra_env)
    for variable, key in workload.env_secrets:
        env.append(
            {
                "name": variable,
                "valueFrom": {"secretKeyRef": {"name": key.secret, "key": key.key}},
            }
        )
    mounts = [
        {"name": "spec", "mountPath": str(Path(SPEC_PATH).parent), "readOnly": True},
        {"name": "settings", "mountPath": SETTINGS_DIR, "readOnly": True},
        *(
            {"name": secret, "mountPath": f"{SECRETS_DIR}/{secret}", "readOnly": True}
            for secret, _ in _secret_volumes(workload)
        ),
        {"name": "data", "mountPath": DATA_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    container: dict[str, Any] = {
        "name": workload.name,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": list(workload.args),
    }
    if workload.port is not None:
        container["ports"] = [
            {"name": PORT_NAME, "containerPort": workload.port, "protocol": "TCP"}
        ]
    container["env"] = env
    if workload.ready_path is not None and workload.live_path is not None:
        # Python start-up and imports take seconds on a small CPU request: the startup probe
        # holds the liveness probe off until the process first answers.
        container["startupProbe"] = _probe(workload.live_path, 2, 30)
        container["readinessProbe"] = _probe(workload.ready_path, 5, 3)
        container["livenessProbe"] = _probe(workload.live_path, 10, 3)
    container["resources"] = workload.resources
    container["securityContext"] = CONTAINER_SECURITY
    container["volumeMounts"] = mounts
    return container


def _volumes(workload: Workload) -> list[dict[str, Any]]:
    return [
        {"name": "spec", "configMap": {"name": "redline-spec"}},
        {
            "name": "settings",
            "configMap": {
                "name": "redline-settings",
                "items": [{"key": f"{workload.name}.yaml", "path": f"{workload.name}.yaml"}],
            },
        },
        *(
            {
                "name": secret,
                "secret": {
                    "secretName": secret,
                    "items": [{"key": key, "path": key} for key in keys],
                    "defaultMode": 0o440,
                },
            }
            for secret, keys in _secret_volumes(workload)
        ),
        {"name": "data", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]


def _pod_template(
    workload: Workload, options: KubernetesOptions, checksum: str, extra: dict[str, Any]
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "serviceAccountName": f"redline-{workload.name}",
        "automountServiceAccountToken": workload.uses_api,
        "securityContext": POD_SECURITY,
        "terminationGracePeriodSeconds": workload.grace_seconds,
        **extra,
        "containers": [_container(workload, options)],
        "volumes": _volumes(workload),
    }
    return {
        "metadata": {
            "labels": _labels(workload.name),
            # A changed spec or settings file rolls the pods (ConfigMaps are read at start).
            "annotations": {"checksum/config": checksum},
        },
        "spec": spec,
    }


def _spread(name: str) -> dict[str, Any]:
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": _labels(name)},
            }
        ]
    }


def build_deployment(
    workload: Workload, options: KubernetesOptions, checksum: str
) -> dict[str, Any]:
    """A Deployment running `workload`."""
    extra = _spread(workload.name) if workload.replicas > 1 else {}
    strategy: dict[str, Any] = (
        {"type": "Recreate"}
        if workload.recreate
        else {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(workload.name, options.namespace, workload.name),
        "spec": {
            "replicas": workload.replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": _labels(workload.name)},
            "strategy": strategy,
            "template": _pod_template(workload, options, checksum, extra),
        },
    }


def _spot_affinity(options: KubernetesOptions) -> dict[str, Any]:
    terms = [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
        for key, value in options.node_labels
    ]
    required = {"nodeSelectorTerms": terms}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def build_daemonset(
    workload: Workload, options: KubernetesOptions, checksum: str
) -> dict[str, Any]:
    """The spot agent's DaemonSet: one pod on every spot node, staying on a node it tainted."""
    extra = {
        "affinity": _spot_affinity(options),
        # The agent taints its own node NoSchedule when a notice arrives; it must keep running
        # (and be rescheduled after a restart) there, as on spot pools tainted by the cloud.
        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(workload.name, options.namespace, workload.name),
        "spec": {
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": _labels(workload.name)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": _pod_template(workload, options, checksum, extra),
        },
    }


def build_service(workload: Workload, options: KubernetesOptions) -> dict[str, Any]:
    """The ClusterIP Service in front of a workload's pods (its one port, named)."""
    assert workload.port is not None, "only workloads serving HTTP get a Service"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(workload.name, options.namespace, workload.name),
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(workload.name),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": workload.port,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_service_monitor(
    workload: Workload, options: KubernetesOptions, interval: str
) -> dict[str, Any]:
    """The ServiceMonitor scraping a workload's Service; `job` is the component's name."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(workload.name, options.namespace, workload.name),
        "spec": {
            "jobLabel": JOB_LABEL,
            "selector": {"matchLabels": _labels(workload.name)},
            "namespaceSelector": {"matchNames": [options.namespace]},
            "endpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": interval}],
        },
    }


def build_pod_monitor(
    workload: Workload, options: KubernetesOptions, interval: str
) -> dict[str, Any]:
    """The PodMonitor scraping a workload without a Service (the spot agent on every node)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(workload.name, options.namespace, workload.name),
        "spec": {
            "jobLabel": JOB_LABEL,
            "selector": {"matchLabels": _labels(workload.name)},
            "namespaceSelector": {"matchNames": [options.namespace]},
            "podMetricsEndpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": interval}],
        },
    }


def build_pdb(workload: Workload, options: KubernetesOptions) -> dict[str, Any]:
    """A PodDisruptionBudget keeping all but one replica up through voluntary disruptions."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(workload.name, options.namespace, workload.name),
        "spec": {
            "minAvailable": workload.replicas - 1,
            "selector": {"matchLabels": _labels(workload.name)},
        },
    }


def build_service_account(workload: Workload, options: KubernetesOptions) -> dict[str, Any]:
    """The workload's own ServiceAccount (its token mounted only where it calls the API)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(f"redline-{workload.name}", options.namespace, workload.name),
        "automountServiceAccountToken": workload.uses_api,
    }


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def _binding(
    kind: str, name: str, namespace: str | None, role_kind: str, component: str, sa_namespace: str
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, namespace, component),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": f"redline-{component}", "namespace": sa_namespace}
        ],
    }


GPU_PLAYBOOK = "gpu_node_failure"
"""The playbook whose node taint needs the receiver's ClusterRole (`remediation/playbooks/gpu.py`
declares what it calls in its `RBAC_RULES`; this layer may not import it: a test compares)."""


def build_rbac(options: KubernetesOptions, gpu_nodes: bool = False) -> dict[str, dict[str, Any]]:
    """Roles and bindings, file name -> resource: the spot agent taints its node (`nodes`
    get/patch), marks the serving pods on it not ready (`pods` list, `pods/status` patch) and
    scales the replacement (`deployments/scale` get/patch), exactly what
    `redline.platform.spot.kubernetes` calls; the receiver lists serving EndpointSlices and, with
    `gpu_nodes` (`gpu.playbook` is `gpu_node_failure`), taints a failed GPU node (`nodes`
    get/patch: cluster-scoped, so a ClusterRole)."""
    ns, serving = options.namespace, options.serving
    spot_nodes = f"{options.namespace}-spot-agent"
    spot = "redline-spot-agent"
    receiver = "redline-remediation"
    receiver_nodes = f"{options.namespace}-remediation"
    gpu: dict[str, dict[str, Any]] = {
        "remediation-clusterrole.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(receiver_nodes, None, REMEDIATION),
            "rules": [_rule([""], ["nodes"], ["get", "patch"])],
        },
        "remediation-clusterrolebinding.yaml": _binding(
            "ClusterRoleBinding", receiver_nodes, None, "ClusterRole", REMEDIATION, ns
        ),
    }
    return {
        **(gpu if gpu_nodes else {}),
        "spot-agent-clusterrole.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(spot_nodes, None, SPOT_AGENT),
            "rules": [_rule([""], ["nodes"], ["get", "patch"])],
        },
        "spot-agent-clusterrolebinding.yaml": _binding(
            "ClusterRoleBinding", spot_nodes, None, "ClusterRole", SPOT_AGENT, ns
        ),
        "spot-agent-role.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(spot, serving, SPOT_AGENT),
            "rules": [
                _rule([""], ["pods"], ["list"]),
                _rule([""], ["pods/status"], ["patch"]),
                _rule(["apps"], ["deployments/scale"], ["get", "patch"]),
            ],
        },
        "spot-agent-rolebinding.yaml": _binding(
            "RoleBinding", spot, serving, "Role", SPOT_AGENT, ns
        ),
        "remediation-role.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(receiver, serving, REMEDIATION),
            "rules": [_rule(["discovery.k8s.io"], ["endpointslices"], ["list"])],
        },
        "remediation-rolebinding.yaml": _binding(
            "RoleBinding", receiver, serving, "Role", REMEDIATION, ns
        ),
    }


def render_settings(settings: dict[str, Any]) -> str:
    """A settings file as mounted (stable key order)."""
    return yaml.safe_dump(settings, sort_keys=True, default_flow_style=False)


def render_spec(spec: Spec) -> str:
    """The spec file the pods read (the validated model, so it loads back to the same spec)."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _checksum(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def _configmap(
    name: str, options: KubernetesOptions, component: str, data: dict[str, str], **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(name, options.namespace, component, **extra),
        "data": data,
    }


def build_dashboard_configmaps(
    spec: Spec, source: str, options: KubernetesOptions
) -> dict[str, dict[str, Any]]:
    """One ConfigMap per dashboard, labelled for the Grafana sidecar (file name -> resource)."""
    found: dict[str, dict[str, Any]] = {}
    for path, text in build_dashboard_outputs(spec, source).items():
        stem = path.relative_to(DASHBOARDS_DIR).stem
        configmap = _configmap(
            f"redline-dashboard-{stem}", options, "dashboards", {path.name: text}
        )
        configmap["metadata"]["labels"]["grafana_dashboard"] = "1"
        # Honoured by the sidecar when its folderAnnotation is set (kube-prometheus-stack:
        # grafana.sidecar.dashboards.folderAnnotation=grafana_folder).
        configmap["metadata"]["annotations"] = {"grafana_folder": "redline"}
        found[f"dashboard-{stem}.yaml"] = configmap
    return found


def build_prometheus_rule_resource(spec: Spec, options: KubernetesOptions) -> dict[str, Any]:
    """The `PrometheusRule` of `redline.rules.alertmanager`, in the namespace, each alert
    labelled with it: the operator's AlertmanagerConfig routes only alerts carrying
    `namespace="<its namespace>"`, and most alerts aggregate that label away."""
    resource = build_prometheus_rule(spec, build_rule_groups(spec))
    resource["metadata"]["namespace"] = options.namespace
    for group in resource["spec"]["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["labels"] = {**rule.get("labels", {}), "namespace": options.namespace}
    return resource


def build_kubernetes_manifests(
    spec: Spec, source: str, options: KubernetesOptions | None = None
) -> dict[str, dict[str, Any]]:
    """Every manifest, one resource per file (file name -> resource), in a stable order;
    KubernetesBuildError when the options cannot be used."""
    options = options if options is not None else KubernetesOptions()
    options.check()
    required_secrets(spec)  # AlertingBuildError when two receivers would share a Secret
    spec = kubernetes_spec(spec, options)
    workloads = build_workloads(spec, options)
    spec_text = render_spec(spec)
    settings = {w.name: render_settings(w.settings) for w in workloads}
    interval = format_duration(spec.timing.scrape_interval_seconds)
    manifests: dict[str, dict[str, Any]] = {
        "namespace.yaml": {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": options.namespace,
                "labels": {
                    NAME_LABEL: "redline",
                    # Every pod here meets the restricted Pod Security Standard; enforce it.
                    "pod-security.kubernetes.io/enforce": "restricted",
                },
            },
        },
        "spec-configmap.yaml": _configmap(
            "redline-spec", options, "config", {"spec.yaml": spec_text}
        ),
        "settings-configmap.yaml": _configmap(
            "redline-settings", options, "config", {f"{n}.yaml": t for n, t in settings.items()}
        ),
    }
    for workload in workloads:
        name = workload.name
        checksum = _checksum(spec_text, settings[name])
        manifests[f"{name}-serviceaccount.yaml"] = build_service_account(workload, options)
        if workload.daemonset:
            manifests[f"{name}-daemonset.yaml"] = build_daemonset(workload, options, checksum)
            manifests[f"{name}-podmonitor.yaml"] = build_pod_monitor(workload, options, interval)
            continue
        manifests[f"{name}-deployment.yaml"] = build_deployment(workload, options, checksum)
        if workload.port is not None:
            manifests[f"{name}-service.yaml"] = build_service(workload, options)
            manifests[f"{name}-servicemonitor.yaml"] = build_service_monitor(
                workload, options, interval
            )
        if workload.replicas > 1:
            manifests[f"{name}-pdb.yaml"] = build_pdb(workload, options)
    manifests.update(build_rbac(options, spec.gpu.playbook == GPU_PLAYBOOK))
    manifests["prometheusrule.yaml"] = build_prometheus_rule_resource(spec, options)
    manifests["alertmanagerconfig.yaml"] = build_alertmanager_config_resource(
        spec,
        build_rule_groups(spec),
        "redline",
        options.namespace,
        _meta("redline", None, "alerting")["labels"],
        WEBHOOK_TOKEN,
    )
    manifests.update(build_dashboard_configmaps(spec, source, options))
    return manifests


def build_kustomization(files: list[str]) -> dict[str, Any]:
    """The kustomization listing every manifest (`kubectl apply -k`)."""
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": sorted(files),
    }


def build_kubernetes_outputs(
    spec: Spec,
    source: str,
    options: KubernetesOptions | None = None,
    root: Path = KUBERNETES_DIR,
) -> dict[Path, str]:
    """Every manifest and the kustomization (path under `root` -> text, DO-NOT-EDIT header)."""
    manifests = build_kubernetes_manifests(spec, source, options)
    outputs = {root / name: render_yaml(resource, source) for name, resource in manifests.items()}
    outputs[root / KUSTOMIZATION] = render_yaml(build_kustomization(list(manifests)), source)
    return outputs


__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_NAMESPACE",
    "KUBERNETES_DIR",
    "KUSTOMIZATION",
    "KubernetesBuildError",
    "KubernetesOptions",
    "Workload",
    "build_kubernetes_manifests",
    "build_kubernetes_outputs",
    "build_workloads",
    "required_secrets",
]
