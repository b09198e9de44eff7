"""deploy/kubernetes: deterministic, and structurally right for a cluster with prometheus-operator
and the Grafana sidecar: every monitor selects something that exists, every port is named, every
probe path is served by the app it probes, every container's argv parses with the real CLI and
its settings file loads with the real settings class, every Secret is documented. The schema
checks (Kubernetes' and the CRDs') are in test_kubernetes_schemas.py."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import yaml
from pydantic import SecretStr
from typer.testing import CliRunner

from redline.agents.spot import SpotAgentSettings, build_agent_app
from redline.cli.main import app as cli_app
from redline.core.settings import ServiceSettings, load_settings
from redline.exporters.app import build_exporter_app
from redline.exporters.settings import load_exporter_settings
from redline.gateway.app import build_gateway_app
from redline.gateway.settings import GatewaySettings
from redline.generate.kube_alerting import AlertingBuildError, parse_matcher
from redline.generate.kubernetes import (
    GPU_PLAYBOOK,
    KUBERNETES_DIR,
    KUSTOMIZATION,
    SPOT_NODE_LABELS,
    KubernetesBuildError,
    KubernetesOptions,
    build_kubernetes_manifests,
    build_kubernetes_outputs,
    required_secrets,
)
from redline.platform.index.settings import IndexSettings
from redline.platform.sessions import SessionSettings
from redline.platform.spot import RBAC_RULES, SCALE_RBAC_RULES
from redline.remediation.app import build_receiver_app
from redline.remediation.catalog import open_registry
from redline.remediation.guards import build_startup_problems, load_policies
from redline.remediation.playbooks.gpu import RBAC_RULES as GPU_RBAC_RULES
from redline.remediation.settings import RemediationSettings
from redline.rules.alertmanager import build_alertmanager_config, build_prometheus_rule
from redline.rules.build import build_rule_groups
from redline.rules.render import HEADER
from redline.slo.load import load_spec, parse_spec
from redline.slo.spec import Spec

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "kubernetes.md"
SOURCE = "slo/specs/default.yaml"

ESCALATION: dict[str, Any] = {
    "receivers": [
        {"name": "pager", "pagerduty": {"routing_key_file": "/run/secrets/pd"}},
        {"name": "legacy_pager", "pagerduty": {"service_key_file": "/run/secrets/pd1"}},
        {"name": "chat", "slack": {"api_url_file": "/run/secrets/slack", "channel": "#oncall"}},
        {
            "name": "mail",
            "email": {
                "to": "oncall@example.com",
                "from": "redline@example.com",
                "smarthost": "smtp.example.com:587",
                "auth_username": "redline",
                "auth_password_file": "/run/secrets/smtp",
            },
        },
        {
            "name": "relay",
            "email": {
                "to": "ops@example.com",
                "from": "redline@example.com",
                "smarthost": "relay.example.com:25",
                "require_tls": False,
            },
        },
        {
            "name": "bot",
            "webhook": {"url": "https://bot.example.com/hook", "bearer_token_file": "/t"},
        },
        {"name": "open-hook", "webhook": {"url": "https://hooks.example.com/in"}},
    ],
    "routes": {"critical": ["pager", "bot"], "page": ["pager", "legacy_pager"]},
    "default": ["chat", "mail", "relay", "open-hook"],
}

SETTINGS_CLASSES: dict[str, type[ServiceSettings]] = {
    "gateway": GatewaySettings,
    "remediation": RemediationSettings,
    "index-replicator": IndexSettings,
    "sessions-replica": SessionSettings,
    "spot-agent": SpotAgentSettings,
}


def escalation_spec() -> Spec:
    """The default spec with every kind of human receiver."""
    data = yaml.safe_load((ROOT / SOURCE).read_text("utf-8"))
    data["escalation"] = ESCALATION
    return parse_spec(yaml.safe_dump(data), "spec.yaml").spec


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return build_kubernetes_manifests(load_spec().spec, SOURCE)


def of_kind(manifests: dict[str, dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests.values() if m["kind"] == kind]


def workloads(manifests: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(manifests, "Deployment") + of_kind(manifests, "DaemonSet")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = pod_spec(workload)["containers"][0]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# ---- determinism and the committed tree ---------------------------------------------------


def test_the_build_is_deterministic() -> None:
    spec = load_spec().spec
    first = build_kubernetes_outputs(spec, SOURCE)
    assert first == build_kubernetes_outputs(spec, SOURCE)
    assert all(path.parent == KUBERNETES_DIR for path in first)
    for path, text in first.items():
        assert text.startswith(HEADER), path
        assert "2026-" not in text, path


def test_the_committed_tree_is_the_generated_one() -> None:
    outputs = build_kubernetes_outputs(load_spec().spec, SOURCE)
    on_disk = {p.relative_to(ROOT) for p in (ROOT / KUBERNETES_DIR).glob("*.yaml")}
    assert on_disk == set(outputs), "run `redline generate` (stale or missing files)"
    for path, text in outputs.items():
        assert (ROOT / path).read_text("utf-8") == text, f"{path}: run `redline generate`"


def test_the_kustomization_lists_every_manifest_and_only_those() -> None:
    directory = ROOT / KUBERNETES_DIR
    kustomization = yaml.safe_load((directory / KUSTOMIZATION).read_text("utf-8"))
    files = {p.name for p in directory.glob("*.yaml")} - {KUSTOMIZATION}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert kustomization["kind"] == "Kustomization"


def test_every_resource_has_a_valid_name_and_its_namespace(
    manifests: dict[str, dict[str, Any]],
) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    names = set()
    for name, resource in manifests.items():
        meta = resource["metadata"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", meta["name"]), name
        assert len(meta["name"]) <= 63, name
        if resource["kind"] not in cluster_scoped:
            assert meta["namespace"] == "redline", name
        for key, value in meta.get("labels", {}).items():
            assert re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", value), key
            assert len(value) <= 63, key
        key = (resource["kind"], meta.get("namespace"), meta["name"])
        assert key not in names, f"{name}: duplicate {key}"
        names.add(key)


def test_options_change_namespace_image_and_spot_nodes() -> None:
    options = KubernetesOptions(
        namespace="ml",
        image="registry.example.com/redline:1.2.3",
        spot_provider="gcp",
        serving_namespace="serving",
    )
    built = build_kubernetes_manifests(load_spec().spec, SOURCE, options)
    for resource in workloads(built):
        assert resource["metadata"]["namespace"] == "ml"
        assert container(resource)["image"] == "registry.example.com/redline:1.2.3"
    daemonset = of_kind(built, "DaemonSet")[0]
    terms = pod_spec(daemonset)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    keys = [(t["matchExpressions"][0]["key"], t["matchExpressions"][0]["values"][0]) for t in terms]
    assert keys == list(SPOT_NODE_LABELS["gcp"])
    settings = yaml.safe_load(of_kind(built, "ConfigMap")[1]["data"]["gateway.yaml"])
    assert settings["upstreams"]["primary"] == "http://llm-primary.serving.svc:8000"
    roles = {r["metadata"]["name"]: r for r in of_kind(built, "Role")}
    assert {r["metadata"]["namespace"] for r in roles.values()} == {"serving"}
    custom = KubernetesOptions(spot_node_labels=(("node.example.com/lifecycle", "spot"),))
    built = build_kubernetes_manifests(load_spec().spec, SOURCE, custom)
    affinity = pod_spec(of_kind(built, "DaemonSet")[0])["affinity"]
    assert "node.example.com/lifecycle" in str(affinity) and "SPOT" not in str(affinity)


@pytest.mark.parametrize(
    "options",
    [
        KubernetesOptions(namespace="Bad_NS"),
        KubernetesOptions(image="has space:1"),
        KubernetesOptions(spot_node_labels=(("bad key!", "x"),)),
        KubernetesOptions(remediation_workers=1),
        KubernetesOptions(serving_namespace="-x"),
    ],
)
def test_unusable_options_are_refused(options: KubernetesOptions) -> None:
    with pytest.raises(KubernetesBuildError):
        build_kubernetes_manifests(load_spec().spec, SOURCE, options)


# ---- selection: monitors, services, pods, ports ---------------------------------------------


def test_every_service_monitor_selects_a_service_with_its_port(
    manifests: dict[str, dict[str, Any]],
) -> None:
    services = of_kind(manifests, "Service")
    monitors = of_kind(manifests, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {"gateway", "exporters", "remediation"}
    for monitor in monitors:
        spec = monitor["spec"]
        chosen = [
            s
            for s in services
            if s["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
            and selects(spec["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert len(chosen) == 1, monitor["metadata"]["name"]
        ports = {p["name"] for p in chosen[0]["spec"]["ports"]}
        assert {e["port"] for e in spec["endpoints"]} <= ports
        assert spec["jobLabel"] in chosen[0]["metadata"]["labels"]


def test_every_service_selects_pods_that_serve_its_target_port(
    manifests: dict[str, dict[str, Any]],
) -> None:
    for service in of_kind(manifests, "Service"):
        pods = [
            w
            for w in workloads(manifests)
            if selects(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(pods) == 1, service["metadata"]["name"]
        names = {p["name"] for p in container(pods[0])["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in names
            assert port["name"]


def test_every_pod_monitor_selects_pods_with_its_port(
    manifests: dict[str, dict[str, Any]],
) -> None:
    monitors = of_kind(manifests, "PodMonitor")
    assert [m["metadata"]["name"] for m in monitors] == ["spot-agent"]
    for monitor in monitors:
        spec = monitor["spec"]
        pods = [
            w
            for w in workloads(manifests)
            if selects(spec["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])
        ]
        assert [p["kind"] for p in pods] == ["DaemonSet"]
        names = {p["name"] for p in container(pods[0])["ports"]}
        assert {e["port"] for e in spec["podMetricsEndpoints"]} <= names
        assert spec["jobLabel"] in pods[0]["spec"]["template"]["metadata"]["labels"]


def test_every_port_is_named(manifests: dict[str, dict[str, Any]]) -> None:
    for resource in workloads(manifests):
        for port in container(resource).get("ports", []):
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", port["name"])
            assert len(port["name"]) <= 15
    for service in of_kind(manifests, "Service"):
        assert all(port.get("name") for port in service["spec"]["ports"])


def test_selectors_match_their_own_pod_templates(manifests: dict[str, dict[str, Any]]) -> None:
    for resource in workloads(manifests):
        labels = resource["spec"]["template"]["metadata"]["labels"]
        assert selects(resource["spec"]["selector"]["matchLabels"], labels)
    for budget in of_kind(manifests, "PodDisruptionBudget"):
        matching = [
            w
            for w in workloads(manifests)
            if selects(
                budget["spec"]["selector"]["matchLabels"],
                w["spec"]["template"]["metadata"]["labels"],
            )
        ]
        assert len(matching) == 1
        assert 0 < budget["spec"]["minAvailable"] < matching[0]["spec"]["replicas"]


def test_the_receiver_job_matches_the_specs_scrape_job(
    manifests: dict[str, dict[str, Any]],
) -> None:
    # ReceiverDown and ReceiverAbsent read up{job=~"<receiver.scrape_job>"}.
    spec = load_spec().spec
    monitor = manifests["remediation-servicemonitor.yaml"]
    service = manifests["remediation-service.yaml"]
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert re.fullmatch(spec.receiver.scrape_job, job)


# ---- the processes: argv, settings, probes ------------------------------------------------


def _parse_argv(args: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse `args` with the real `redline` CLI (no command runs); its command and options."""
    command: Any = typer.main.get_command(cli_app)
    context = command.make_context("redline", list(args))
    while hasattr(command, "get_command"):
        rest = [*context._protected_args, *context.args]
        if not rest:
            break
        name, *rest = rest
        command = command.get_command(context, name)
        assert command is not None, f"no command {name} in {args}"
        context = command.make_context(name, rest, parent=context)
    return str(command.name), dict(context.params)


def test_every_container_argv_parses_with_the_real_cli(
    manifests: dict[str, dict[str, Any]],
) -> None:
    expected = {
        "gateway": "gateway",
        "exporters": "exporters",
        "remediation": "remediation",
        "index-replicator": "replicate",
        "sessions-replica": "replica",
        "spot-agent": "run",
    }
    for resource in workloads(manifests):
        name = resource["metadata"]["name"]
        command, params = _parse_argv(container(resource)["args"])
        assert command == expected[name], name
        assert str(params["config"]) == f"/etc/redline/settings/{name}.yaml"


def test_a_misspelt_flag_fails_the_argv_check() -> None:
    with pytest.raises(Exception, match="No such option"):
        _parse_argv(["index", "replicate", "--configs", "/x.yaml"])


def test_the_receiver_runs_at_least_two_workers(manifests: dict[str, dict[str, Any]]) -> None:
    _, params = _parse_argv(container(manifests["remediation-deployment.yaml"])["args"])
    assert params["workers"] >= 2


def _settings_text(manifests: dict[str, dict[str, Any]], name: str) -> str:
    text: str = manifests["settings-configmap.yaml"]["data"][f"{name}.yaml"]
    return text


def _env(resource: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The container's environment, secrets as plausible values, downward API as a pod's."""
    values = {"url": "redis://redis:6379/0", "replica-url": "redis://redis-replica:6379/0"}
    fields = {"spec.nodeName": "gke-spot-pool-1a2b", "metadata.name": "spot-agent-x1"}
    for item in container(resource)["env"]:
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            monkeypatch.setenv(item["name"], values[source["secretKeyRef"]["key"]])
        else:
            monkeypatch.setenv(item["name"], fields.get(source["fieldRef"]["fieldPath"], "redline"))


def _load(
    manifests: dict[str, dict[str, Any]],
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    """The workload's settings as its command builds them: file < env < its flags."""
    resource = next(w for w in workloads(manifests) if w["metadata"]["name"] == name)
    _env(resource, monkeypatch)
    config = tmp_path / f"{name}.yaml"
    config.write_text(_settings_text(manifests, name), "utf-8")
    _, params = _parse_argv(container(resource)["args"])
    flags = {k: v for k, v in params.items() if k in ("spec", "workers", "node") and v}
    if name == "spot-agent":
        flags["node"] = "gke-spot-pool-1a2b"  # $(NODE_NAME), as the kubelet expands it
    if name == "exporters":
        return load_exporter_settings(config, **flags)
    return load_settings(SETTINGS_CLASSES[name], config, **flags)


@pytest.mark.parametrize(
    "name",
    ["gateway", "exporters", "remediation", "index-replicator", "sessions-replica", "spot-agent"],
)
def test_every_settings_file_loads_with_its_settings_class(
    manifests: dict[str, dict[str, Any]],
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _load(manifests, name, tmp_path, monkeypatch)
    assert settings.redis_url == "redis://redis:6379/0"  # from the Secret, over the default
    if name == "sessions-replica":
        assert settings.replica_url == "redis://redis-replica:6379/0"
    if name == "exporters":
        assert settings.keepalive.replica_url == "redis://redis-replica:6379/0"
    if name == "spot-agent":
        # The Role of the agent is in the serving namespace: so are the pods it marks and the
        # Deployment it scales.
        role = manifests["spot-agent-role.yaml"]["metadata"]["namespace"]
        assert settings.kubernetes.enabled
        assert settings.kubernetes.namespace == settings.replacement.namespace == role
        assert settings.replacement.kind == "kubernetes"
    if name in ("gateway", "exporters", "remediation", "spot-agent"):
        assert str(settings.spec) == "/etc/redline/spec/spec.yaml"
        assert settings.host == "0.0.0.0"


def test_the_receiver_starts_with_its_settings(
    manifests: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `redline remediation` refuses to start while a playbook that is not off lacks a setting.
    settings = _load(manifests, "remediation", tmp_path, monkeypatch)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # in a pod, the kubelet sets it
    settings = settings.model_copy(update={"spec": None})
    problems = build_startup_problems(open_registry(settings), load_policies(None, None, {}))
    assert problems == []
    assert settings.workers == 2


def _paths(app: Any) -> set[str]:
    """The probe-like paths `app` serves: those it answers with anything but 404 or 405, through
    ASGI without its lifespan (nothing is started, so a health check may well answer 503; the
    route exists)."""
    candidates = ("/healthz", "/readyz", "/metrics", "/livez", "/health", "/ready")

    async def served() -> set[str]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
            answers = {path: (await client.get(path)).status_code for path in candidates}
        return {path for path, status in answers.items() if status not in (404, 405)}

    return asyncio.run(served())


def test_every_probe_path_is_served_by_its_app(
    manifests: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec().spec
    token = tmp_path / "token"
    token.write_text("t0ken", "utf-8")
    apps: dict[str, set[str]] = {}
    gateway = _load(manifests, "gateway", tmp_path, monkeypatch)
    # Nothing listens there: a health check that asks Redis fails at once, without a DNS lookup.
    nowhere = "redis://127.0.0.1:1/0"
    gateway = gateway.model_copy(update={"admin_token_file": token, "redis_url": nowhere})
    apps["gateway"] = _paths(build_gateway_app(gateway, spec))
    exporters = _load(manifests, "exporters", tmp_path, monkeypatch)
    exporters = exporters.model_copy(update={"redis_url": nowhere})
    apps["exporters"] = _paths(build_exporter_app(exporters, spec, probes=[]).app)
    receiver = _load(manifests, "remediation", tmp_path, monkeypatch)
    receiver = receiver.model_copy(update={"spec": None, "redis_url": nowhere})
    apps["remediation"] = _paths(
        build_receiver_app(
            receiver, token=SecretStr("t0ken"), policies=load_policies(None, None, {})
        )
    )
    agent = _load(manifests, "spot-agent", tmp_path, monkeypatch)
    # In a pod: the kubelet's KUBERNETES_SERVICE_HOST and the mounted service-account token.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    cluster = agent.kubernetes.model_copy(update={"token_file": token, "ca_file": None})
    agent = agent.model_copy(
        update={"gateway_token_file": token, "redis_url": nowhere, "kubernetes": cluster}
    )
    apps["spot-agent"] = _paths(build_agent_app(agent, spec.spot))
    probed = 0
    for resource in workloads(manifests):
        name = resource["metadata"]["name"]
        spec_of = container(resource)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in spec_of:
                probed += 1
                assert spec_of[probe]["httpGet"]["path"] in apps[name], (name, probe)
                assert spec_of[probe]["httpGet"]["port"] in {p["name"] for p in spec_of["ports"]}
        if name in apps:
            assert "/metrics" in apps[name]
    assert probed == 3 * len(apps)


def test_only_the_processes_without_http_go_unprobed(manifests: dict[str, dict[str, Any]]) -> None:
    # The replicator and the CDC consumer serve nothing: their health is what the exporter
    # measures of them (index staleness, session RPO), alerting when they stall.
    unprobed = {
        w["metadata"]["name"] for w in workloads(manifests) if "readinessProbe" not in container(w)
    }
    assert unprobed == {"index-replicator", "sessions-replica"}
    for name in unprobed:
        assert "ports" not in container(manifests[f"{name}-deployment.yaml"])


# ---- security, resources ------------------------------------------------------------------


def test_every_pod_runs_as_non_root_with_a_read_only_root(
    manifests: dict[str, dict[str, Any]],
) -> None:
    for resource in workloads(manifests):
        pod = pod_spec(resource)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["securityContext"]["runAsUser"] > 0
        security = container(resource)["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert not pod.get("hostNetwork") and not pod.get("hostPID")
        mounts = {m["mountPath"] for m in container(resource)["volumeMounts"]}
        assert {"/tmp", "/var/lib/redline"} <= mounts  # the writable places
    namespace = manifests["namespace.yaml"]["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"


def test_every_container_has_requests_and_limits(manifests: dict[str, dict[str, Any]]) -> None:
    for resource in workloads(manifests):
        resources = container(resource)["resources"]
        for side in ("requests", "limits"):
            assert set(resources[side]) == {"cpu", "memory"}, resource["metadata"]["name"]


def test_only_the_api_callers_get_a_service_account_token(
    manifests: dict[str, dict[str, Any]],
) -> None:
    mounted = {
        w["metadata"]["name"]
        for w in workloads(manifests)
        if pod_spec(w)["automountServiceAccountToken"]
    }
    assert mounted == {"remediation", "spot-agent"}
    accounts = {a["metadata"]["name"] for a in of_kind(manifests, "ServiceAccount")}
    assert {pod_spec(w)["serviceAccountName"] for w in workloads(manifests)} == accounts


# ---- the spot agent -----------------------------------------------------------------------


def test_the_spot_agent_runs_on_spot_nodes_with_its_identity(
    manifests: dict[str, dict[str, Any]],
) -> None:
    daemonset = manifests["spot-agent-daemonset.yaml"]
    pod = pod_spec(daemonset)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    wanted = [{"key": k, "operator": "In", "values": [v]} for k, v in SPOT_NODE_LABELS["aws"]]
    assert [t["matchExpressions"][0] for t in terms] == wanted
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e["valueFrom"] for e in container(daemonset)["env"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    _, params = _parse_argv(container(daemonset)["args"])
    assert params["node"] == "$(NODE_NAME)"  # the kubelet expands it from the env above


def _granted(manifests: dict[str, dict[str, Any]], account: str) -> set[tuple[str, str, str]]:
    """(namespace or '*', resource, verb) the ServiceAccount `account` may use."""
    roles = {
        (r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"]): r
        for r in of_kind(manifests, "Role") + of_kind(manifests, "ClusterRole")
    }
    granted = set()
    for binding in of_kind(manifests, "RoleBinding") + of_kind(manifests, "ClusterRoleBinding"):
        subjects = {(s["name"], s["namespace"]) for s in binding["subjects"]}
        if (account, "redline") not in subjects:
            continue
        where = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((where or "*", resource, verb))
    return granted


def test_the_spot_agent_may_do_exactly_what_its_helper_does(
    manifests: dict[str, dict[str, Any]],
) -> None:
    # Nodes are cluster-scoped; the rest in the serving namespace, where the agent acts.
    wanted = {
        ("*" if rule["resources"] == ("nodes",) else "redline", resource, verb)
        for rule in (*RBAC_RULES, *SCALE_RBAC_RULES)
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert _granted(manifests, "redline-spot-agent") == wanted
    assert ("*", "nodes", "patch") in wanted and ("redline", "pods/status", "patch") in wanted
    assert _granted(manifests, "redline-gateway") == set()


def test_the_receiver_may_list_endpoints_and_taint_a_gpu_node_only_with_the_gpu_playbook(
    manifests: dict[str, dict[str, Any]],
) -> None:
    # gpu_node_failure's taint: exactly what the playbook declares, on cluster-scoped nodes.
    gpu_node = {
        ("*", resource, verb)
        for rule in GPU_RBAC_RULES
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    endpoints = {("redline", "endpointslices", "list")}
    assert load_spec().spec.gpu.playbook == GPU_PLAYBOOK
    assert _granted(manifests, "redline-remediation") == endpoints | gpu_node
    assert gpu_node == {("*", "nodes", "get"), ("*", "nodes", "patch")}
    spec = load_spec().spec
    without = spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"playbook": None})})
    built = build_kubernetes_manifests(without, SOURCE)
    assert _granted(built, "redline-remediation") == endpoints
    assert "remediation-clusterrole.yaml" not in built


# ---- secrets ------------------------------------------------------------------------------


def referenced_secrets(manifests: dict[str, dict[str, Any]]) -> set[tuple[str, str]]:
    """(Secret, key) every manifest refers to: env, volumes, AlertmanagerConfig selectors."""
    found: set[tuple[str, str]] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "secretKeyRef" in value:
                found.add((value["secretKeyRef"]["name"], value["secretKeyRef"]["key"]))
            if "secret" in value and "secretName" in value["secret"]:
                for item in value["secret"]["items"]:
                    found.add((value["secret"]["secretName"], item["key"]))
            for key in ("credentials", "apiURL", "routingKey", "serviceKey", "authPassword"):
                if isinstance(value.get(key), dict):
                    found.add((value[key]["name"], value[key]["key"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(list(manifests.values()))
    return found


def test_no_secret_is_inlined() -> None:
    built = build_kubernetes_manifests(escalation_spec(), SOURCE)
    assert of_kind(built, "Secret") == []
    for name, resource in built.items():
        if name == "spec-configmap.yaml":
            continue  # the spec names its files; the pods never read the escalation ones
        text = yaml.safe_dump(resource)
        assert "/run/secrets" not in text, name  # the spec's secret files
        if name != "settings-configmap.yaml":
            assert "_file" not in text, name
    for text in built["settings-configmap.yaml"]["data"].values():
        for key, value in yaml.safe_load(text).items():
            if key.endswith("_file") and key != "audit_file":
                assert value.startswith("/etc/redline/secrets/"), key


@pytest.mark.parametrize("escalated", [False, True])
def test_every_secret_referenced_is_required_and_documented(escalated: bool) -> None:
    spec = escalation_spec() if escalated else load_spec().spec
    built = build_kubernetes_manifests(spec, SOURCE)
    required = {(k.secret, k.key) for k in required_secrets(spec)}
    assert referenced_secrets(built) == required
    docs = DOCS.read_text("utf-8")
    for secret, key in sorted(required):
        if secret.startswith("redline-escalation-"):
            # One per human receiver, named after it: the docs give the pattern and each key.
            assert "redline-escalation-<receiver>" in docs
            assert f"--from-file={key}=" in docs or f"--from-literal={key}=" in docs, key
            continue
        commands = [
            line
            for line in docs.splitlines()
            if f"kubectl -n redline create secret generic {secret} " in line
            or line.rstrip().endswith(f"create secret generic {secret} \\")
        ]
        assert commands, f"docs/kubernetes.md: no `kubectl create secret generic {secret}`"
        block = docs[docs.index(commands[0]) :].split("\n\n")[0]
        assert f"{key}=" in block, f"docs/kubernetes.md: {secret} without key {key}"


def test_escalation_secret_names_do_not_collide() -> None:
    data = yaml.safe_load((ROOT / SOURCE).read_text("utf-8"))
    data["escalation"] = {
        "receivers": [
            {
                "name": "on_call",
                "webhook": {"url": "https://a.example.com", "bearer_token_file": "/a"},
            },
            {
                "name": "on-call",
                "webhook": {"url": "https://b.example.com", "bearer_token_file": "/b"},
            },
        ],
        "routes": {"critical": ["on_call"], "page": ["on-call"]},
    }
    spec = parse_spec(yaml.safe_dump(data), "spec.yaml").spec
    with pytest.raises(AlertingBuildError, match="on_call"):
        build_kubernetes_manifests(spec, SOURCE)


# ---- rules, routes, dashboards ------------------------------------------------------------


def test_the_prometheus_rule_is_the_rule_builders_with_the_namespace_on_alerts(
    manifests: dict[str, dict[str, Any]],
) -> None:
    spec = load_spec().spec
    expected = build_prometheus_rule(spec, build_rule_groups(spec))
    rule = manifests["prometheusrule.yaml"]
    assert rule["metadata"]["name"] == expected["metadata"]["name"]
    for group, built in zip(rule["spec"]["groups"], expected["spec"]["groups"], strict=True):
        for mine, theirs in zip(group["rules"], built["rules"], strict=True):
            if "alert" in theirs:
                assert mine["labels"] == {**theirs.get("labels", {}), "namespace": "redline"}
                mine = {k: v for k, v in mine.items() if k != "labels"}
                theirs = {k: v for k, v in theirs.items() if k != "labels"}
            assert mine == theirs


def _plain_route(route: dict[str, Any]) -> dict[str, Any]:
    """An AlertmanagerConfig route back in alertmanager.yml's form."""
    out: dict[str, Any] = {}
    for mine, theirs in (("matchers", "matchers"), ("receiver", "receiver")):
        if mine in route:
            out[theirs] = route[mine]
    out["matchers"] = [
        f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in route.get("matchers", [])
    ]
    out["group_by"] = route.get("groupBy", [])
    out["continue"] = route.get("continue", False)
    out["routes"] = [_plain_route(child) for child in route.get("routes", [])]
    return out


@pytest.mark.parametrize("escalated", [False, True])
def test_the_alertmanager_config_routes_like_alertmanager_yml(escalated: bool) -> None:
    spec = escalation_spec() if escalated else load_spec().spec
    built = build_kubernetes_manifests(spec, SOURCE)["alertmanagerconfig.yaml"]
    plain = build_alertmanager_config(spec, build_rule_groups(spec))

    def normal(route: dict[str, Any]) -> dict[str, Any]:
        return {
            "matchers": list(route.get("matchers", [])),
            "receiver": route["receiver"],
            "group_by": list(route.get("group_by", [])),
            "continue": route.get("continue", False),
            "routes": [normal(child) for child in route.get("routes", [])],
        }

    assert _plain_route(built["spec"]["route"]) == normal(plain["route"])
    assert [r["name"] for r in built["spec"]["receivers"]] == [
        r["name"] for r in plain["receivers"]
    ]
    assert len(built["spec"]["inhibitRules"]) == len(plain["inhibit_rules"])
    hook = built["spec"]["receivers"][0]["webhookConfigs"][0]
    assert hook["url"] == "http://remediation.redline.svc:9095/alerts"


def test_matchers_parse_and_bad_ones_are_refused() -> None:
    assert parse_matcher('slo=~".+"') == {"name": "slo", "matchType": "=~", "value": ".+"}
    assert parse_matcher('severity!="ticket"')["matchType"] == "!="
    with pytest.raises(AlertingBuildError):
        parse_matcher("severity=ticket")


def test_every_dashboard_is_a_configmap_for_the_grafana_sidecar(
    manifests: dict[str, dict[str, Any]],
) -> None:
    dashboards = [
        c
        for c in of_kind(manifests, "ConfigMap")
        if c["metadata"]["name"].startswith("redline-dashboard-")
    ]
    committed = sorted(p.name for p in (ROOT / "dashboards" / "generated").glob("*.json"))
    assert sorted(name for c in dashboards for name in c["data"]) == committed
    for configmap in dashboards:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        for name, text in configmap["data"].items():
            assert text == (ROOT / "dashboards" / "generated" / name).read_text("utf-8")


def test_the_spec_configmap_loads_back_to_the_spec_with_the_cluster_receiver(
    manifests: dict[str, dict[str, Any]],
) -> None:
    text = manifests["spec-configmap.yaml"]["data"]["spec.yaml"]
    loaded = parse_spec(text, "spec.yaml").spec
    spec = load_spec().spec
    assert loaded.model_copy(update={"receiver": spec.receiver}) == spec
    assert loaded.receiver.url == "http://remediation.redline.svc:9095/alerts"
    assert loaded.receiver.bearer_token_file == "/etc/redline/secrets/redline-webhook-token/token"


def test_a_changed_setting_rolls_the_pods(manifests: dict[str, dict[str, Any]]) -> None:
    other = build_kubernetes_manifests(
        load_spec().spec, SOURCE, KubernetesOptions(serving_namespace="serving")
    )
    for name in ("gateway-deployment.yaml", "remediation-deployment.yaml"):
        before = manifests[name]["spec"]["template"]["metadata"]["annotations"]
        after = other[name]["spec"]["template"]["metadata"]["annotations"]
        assert before["checksum/config"] != after["checksum/config"]


# ---- the command ---------------------------------------------------------------------------


def test_generate_kubernetes_writes_the_committed_set_to_a_directory(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli_app, ["generate", "--kubernetes", str(tmp_path / "k8s")])
    assert result.exit_code == 0, result.output
    written = {p.name: p.read_text("utf-8") for p in (tmp_path / "k8s").glob("*.yaml")}
    committed = {p.name: p.read_text("utf-8") for p in (ROOT / KUBERNETES_DIR).glob("*.yaml")}
    assert written == committed
    check = runner.invoke(cli_app, ["generate", "--kubernetes", str(tmp_path / "k8s"), "--check"])
    assert check.exit_code == 0, check.output
    moved = runner.invoke(
        cli_app, ["generate", "--kubernetes", str(tmp_path / "k8s"), "--check", "--namespace", "ml"]
    )
    assert moved.exit_code == 1


def test_generate_kubernetes_options_need_the_directory() -> None:
    result = CliRunner().invoke(cli_app, ["generate", "--namespace", "ml", "--check"])
    assert result.exit_code == 2
    assert "--kubernetes" in result.output
