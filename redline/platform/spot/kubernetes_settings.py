"""The spot agent's `kubernetes:` block: the API connection (in-cluster by default: the API
server from `KUBERNETES_SERVICE_HOST`/`_PORT`, the service-account token re-read on every
request since it rotates, its CA) and what a notice does to the node; `resolve` checks it and
returns a `KubernetesTarget`."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from redline.platform.endpoints import check_base_url
from redline.platform.spot.errors import KubernetesError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_TAINT_KEY = "redline.dev/spot-preempted"
DEFAULT_CONDITION_TYPE = "redline.dev/spot-safe"


class KubernetesSettings(BaseModel):
    """The agent's `kubernetes:` block: the API connection, and what a notice does to the node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False, description="Taint the node and mark its serving pods not ready on a notice."
    )
    node_name: str | None = Field(
        None, description="The Kubernetes node (None: env NODE_NAME, from the downward API)."
    )
    namespace: str | None = Field(
        None,
        description="Namespace of the serving pods (None: env POD_NAMESPACE, else the service "
        "account's namespace file).",
    )
    pod_selector: str | None = Field(
        None, description="Label selector of the serving pods, e.g. `app=chat` (required)."
    )
    taint_key: str = Field(DEFAULT_TAINT_KEY, min_length=1, description="The NoSchedule taint.")
    condition_type: str = Field(
        DEFAULT_CONDITION_TYPE,
        min_length=1,
        description="The pods' readiness gate (spec.readinessGates[].conditionType).",
    )
    api_url: str | None = Field(
        None,
        description="API server (None: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).",
    )
    token_file: Path = Field(
        SERVICE_ACCOUNT / "token", description="Bearer token file (re-read on every request)."
    )
    ca_file: Path | None = Field(
        SERVICE_ACCOUNT / "ca.crt", description="CA bundle of the API server (None: system CAs)."
    )
    namespace_file: Path = Field(
        SERVICE_ACCOUNT / "namespace", description="Read when no namespace is set or in env."
    )
    insecure_skip_tls_verify: bool = Field(
        False, description="Do not verify the API server's certificate (a WARNING; tests only)."
    )
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="Timeout of one API request.")
    ready_interval_seconds: float = Field(
        30.0, gt=0, description="How often pods that lack the condition are marked ready."
    )

    @field_validator("api_url")
    @classmethod
    def _api(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value, "api_url")

    @field_validator("node_name", "namespace", "pod_selector")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank (leave it unset instead)")
        return value

    def resolve(
        self, environ: Mapping[str, str] | None = None, *, node_actions: bool | None = None
    ) -> KubernetesTarget:
        """The connection and the node this agent acts on; KubernetesError naming the missing
        setting (`node_actions`: whether node, namespace and selector are needed; default
        `enabled`)."""
        env = os.environ if environ is None else environ
        if self.api_url is not None:
            api_url = self.api_url
        elif env.get("KUBERNETES_SERVICE_HOST"):
            host = env["KUBERNETES_SERVICE_HOST"]
            host = f"[{host}]" if ":" in host else host
            api_url = f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        else:
            raise KubernetesError(
                "kubernetes.api_url: required outside a cluster (KUBERNETES_SERVICE_HOST is not "
                "in the environment)"
            )
        if not self.token_file.is_file():
            raise KubernetesError(
                f"kubernetes.token_file: {self.token_file} does not exist (mount the service "
                "account token, automountServiceAccountToken: true)"
            )
        verify: ssl.SSLContext | bool = False  # plain http (kubectl proxy, a test): no TLS
        if api_url.startswith("https://"):
            if self.insecure_skip_tls_verify:
                verify = False
            elif self.ca_file is None:
                verify = ssl.create_default_context()
            elif not self.ca_file.is_file():
                raise KubernetesError(f"kubernetes.ca_file: {self.ca_file} does not exist")
            else:
                try:
                    verify = ssl.create_default_context(cafile=str(self.ca_file))
                except (OSError, ssl.SSLError) as exc:
                    raise KubernetesError(
                        f"kubernetes.ca_file: {self.ca_file} is unusable: {exc}"
                    ) from None
        wanted = self.enabled if node_actions is None else node_actions
        node = self.node_name or env.get("NODE_NAME") or None
        namespace = self.namespace or env.get("POD_NAMESPACE") or None
        if namespace is None and self.namespace_file.is_file():
            namespace = self.namespace_file.read_text("utf-8").strip() or None
        if wanted:
            if node is None:
                raise KubernetesError(
                    "kubernetes.node_name: required (set it, or NODE_NAME from the downward API: "
                    "env valueFrom.fieldRef.fieldPath: spec.nodeName)"
                )
            if namespace is None:
                raise KubernetesError(
                    "kubernetes.namespace: required (set it, or POD_NAMESPACE from the downward "
                    "API: env valueFrom.fieldRef.fieldPath: metadata.namespace)"
                )
            if self.pod_selector is None:
                raise KubernetesError(
                    "kubernetes.pod_selector: required (the label selector of the serving pods, "
                    "e.g. app.kubernetes.io/name=chat)"
                )
        return KubernetesTarget(
            api_url=api_url,
            token_file=self.token_file,
            verify=verify,
            timeout_seconds=self.timeout_seconds,
            node_name=node,
            namespace=namespace,
            pod_selector=self.pod_selector,
            taint_key=self.taint_key,
            condition_type=self.condition_type,
            insecure=api_url.startswith("https://") and self.insecure_skip_tls_verify,
        )


@dataclass(frozen=True)
class KubernetesTarget:
    """Resolved settings: where the API is, how to authenticate, which node and pods."""

    api_url: str
    token_file: Path
    verify: ssl.SSLContext | bool
    timeout_seconds: float
    node_name: str | None
    namespace: str | None
    pod_selector: str | None
    taint_key: str = DEFAULT_TAINT_KEY
    condition_type: str = DEFAULT_CONDITION_TYPE
    insecure: bool = False
