"""The Kubernetes side of a spot notice: taint the node `NoSchedule` and take its serving pods out
of their Services without killing them, through a small API client on httpx.

Serving pods declare a readiness gate::

    spec:
      readinessGates:
        - conditionType: redline.dev/spot-safe

so a pod is Ready only while its `redline.dev/spot-safe` condition is True. The agent sets it True
on the pods of its node that lack it (at start and every `ready_interval_seconds`), False on a
notice (the kubelet then reports the pod not ready and the EndpointSlices drop it while it keeps
serving what it has), and True again when the node recovers. The taint (key
`redline.dev/spot-preempted`, effect `NoSchedule`) keeps new pods off the node; it is also how a
restarted agent knows its node is the preempted one.

- `KubernetesSettings` (`kubernetes_settings`): the agent's `kubernetes:` block; `resolve` checks
  it and returns a `KubernetesTarget`;
- `KubernetesClient`: the calls (nodes, pods, pods/status, deployments/scale), read-modify-write
  with `resourceVersion` and a retry on 409, errors naming the missing RBAC verb or object;
- `NodeActions`: preempt (pods not ready, taint), restore (untaint, pods ready), reconcile;
- pure builders of the patch bodies (`build_taint_patch`, `build_untaint_patch`,
  `build_condition_patch`) and `RBAC_RULES`, the rules the agent needs.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from redline.platform.spot.errors import KubernetesConflictError, KubernetesError
from redline.platform.spot.kubernetes_settings import (
    DEFAULT_CONDITION_TYPE,
    DEFAULT_TAINT_KEY,
    KubernetesTarget,
)

log = logging.getLogger(__name__)

TAINT_EFFECT = "NoSchedule"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
CONFLICT_RETRIES = 5
"""Read-modify-write attempts before a 409 is reported (another writer kept winning)."""
TRANSIENT_ATTEMPTS = 3
"""Attempts of one request on transport errors, 429 and 5xx (every call here is idempotent)."""
_PAGE = 500

RBAC_RULES: tuple[dict[str, tuple[str, ...]], ...] = (
    {"apiGroups": ("",), "resources": ("nodes",), "verbs": ("get", "patch")},
    {"apiGroups": ("",), "resources": ("pods",), "verbs": ("list",)},
    {"apiGroups": ("",), "resources": ("pods/status",), "verbs": ("patch",)},
)
"""What `NodeActions` calls: nodes are cluster-scoped (a ClusterRole); pods may be granted by a
Role in the serving namespace."""
SCALE_RBAC_RULES: tuple[dict[str, tuple[str, ...]], ...] = (
    {"apiGroups": ("apps",), "resources": ("deployments/scale",), "verbs": ("get", "patch")},
)
"""What the `kubernetes` replacement provider calls (a Role in the Deployment's namespace)."""


# ---- pure builders --------------------------------------------------------------------------


def _rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = node.get("spec") or {}
    return [dict(t) for t in spec.get("taints") or [] if isinstance(t, Mapping)]


def _resource_version(obj: Mapping[str, Any]) -> str:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise KubernetesError("the API answered an object without metadata.resourceVersion")
    return str(version)


def has_taint(node: Mapping[str, Any], key: str, effect: str = TAINT_EFFECT) -> bool:
    """Whether `node` carries the taint `key` with `effect`."""
    return any(t.get("key") == key and t.get("effect") == effect for t in _taints(node))


def build_taint_patch(
    node: Mapping[str, Any], key: str, value: str, effect: str = TAINT_EFFECT
) -> dict[str, Any] | None:
    """A JSON merge patch adding the taint to `node`'s, or None when it is already there.

    A merge patch replaces the whole `spec.taints` list, so it carries every existing taint, and
    `metadata.resourceVersion` makes the API server refuse it (409) if the node changed since it
    was read (a taint added meanwhile would otherwise be lost)."""
    if has_taint(node, key, effect):
        return None
    taints = [*_taints(node), {"key": key, "value": value, "effect": effect}]
    return {"metadata": {"resourceVersion": _resource_version(node)}, "spec": {"taints": taints}}


def build_untaint_patch(node: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """A JSON merge patch removing every taint with `key` (others kept), or None if it has none."""
    taints = _taints(node)
    kept = [t for t in taints if t.get("key") != key]
    if len(kept) == len(taints):
        return None
    return {
        "metadata": {"resourceVersion": _resource_version(node)},
        "spec": {"taints": kept or None},  # null deletes the field (RFC 7386)
    }


def pod_condition(pod: Mapping[str, Any], condition_type: str) -> str | None:
    """The status ("True", "False", "Unknown") of the pod's condition, None if it has none."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == condition_type:
            status = condition.get("status")
            return None if status is None else str(status)
    return None


def pod_has_gate(pod: Mapping[str, Any], condition_type: str) -> bool:
    """Whether the pod declares the readiness gate (else the condition does not affect it)."""
    gates = (pod.get("spec") or {}).get("readinessGates") or []
    return any(isinstance(g, Mapping) and g.get("conditionType") == condition_type for g in gates)


def build_condition_patch(
    condition_type: str, ready: bool, reason: str, message: str, now: float
) -> dict[str, Any]:
    """A strategic merge patch of `pods/<name>/status` setting one condition.

    Strategic merge, because `status.conditions` merges by `type` there: the kubelet's own
    conditions (Ready, ContainersReady, ...) are kept. A JSON merge patch would replace them all.
    """
    return {
        "status": {
            "conditions": [
                {
                    "type": condition_type,
                    "status": "True" if ready else "False",
                    "reason": reason,
                    "message": message[:500],
                    "lastTransitionTime": _rfc3339(now),
                }
            ]
        }
    }


# ---- the client -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """What a request does, for its error messages: the verb, the resource, the object."""

    verb: str
    resource: str
    name: str
    group: str = ""
    namespace: str | None = None

    @property
    def kind(self) -> str:
        """The object, e.g. `node ip-10-0-1-2` or `pod serving/chat-0`."""
        noun = self.resource.split("/")[0].removesuffix("s")
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{noun} {where}{self.name}" if self.name else f"{self.resource} in {where or '*'}"

    @property
    def rule(self) -> str:
        """The RBAC rule that grants it."""
        return (
            f'apiGroups: ["{self.group}"], resources: ["{self.resource}"], verbs: ["{self.verb}"]'
        )


def _status_message(response: httpx.Response) -> str:
    try:
        data = response.json()
        message = data.get("message") if isinstance(data, dict) else None
    except ValueError:
        message = None
    return str(message or response.text[:300] or response.reason_phrase)


def build_api_error(
    access: Access, status: int, message: str, token_file: Path | None = None
) -> KubernetesError:
    """The error for a non-2xx answer: 401 and 403 say what to fix, 404 names the object."""
    scope = f" in namespace {access.namespace}" if access.namespace else ""
    if status == 401:
        where = f" in {token_file}" if token_file is not None else ""
        return KubernetesError(
            f"kubernetes {access.verb} {access.kind}: 401 Unauthorized: the API server refused "
            f"the token{where} (expired, revoked, or not a service-account token)",
            permanent=True,
            status=status,
        )
    if status == 403:
        return KubernetesError(
            f"kubernetes {access.verb} {access.kind}: 403 Forbidden: the service account may "
            f"not `{access.verb}` `{access.resource}`{scope}; grant it in its "
            f"{'Role' if access.namespace else 'ClusterRole'} ({access.rule}). API: {message}",
            permanent=True,
            status=status,
        )
    if status == 404:
        return KubernetesError(
            f"kubernetes {access.verb} {access.kind}: 404: not found{scope}",
            permanent=True,
            status=status,
        )
    if status == 409:
        return KubernetesConflictError(
            f"kubernetes {access.verb} {access.kind}: 409 Conflict: it changed since it was read",
            status=status,
        )
    return KubernetesError(
        f"kubernetes {access.verb} {access.kind}: HTTP {status}: {message}",
        permanent=status < 500 and status != 429,
        status=status,
    )


class KubernetesClient:
    """The few API calls the agent makes, with the service-account token read on every call."""

    def __init__(
        self,
        api_url: str,
        token_file: Path | None,
        *,
        verify: ssl.SSLContext | bool = True,
        timeout_seconds: float = 5.0,
        client: httpx.Client | None = None,
        backoff_seconds: float = 0.2,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.token_file = token_file
        self.backoff_seconds = backoff_seconds
        self._owned = client is None
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(timeout_seconds, connect=min(2.0, timeout_seconds)),
            verify=verify,
            trust_env=False,
        )

    @classmethod
    def from_target(cls, target: KubernetesTarget) -> KubernetesClient:
        """A client of the resolved settings."""
        return cls(
            target.api_url,
            target.token_file,
            verify=target.verify,
            timeout_seconds=target.timeout_seconds,
        )

    def close(self) -> None:
        """Close the connection pool (when this client made it)."""
        if self._owned:
            self.client.close()

    def token(self) -> str | None:
        """The bearer token, read now: projected service-account tokens rotate (None: the
        client authenticates with a client certificate instead)."""
        if self.token_file is None:
            return None
        try:
            text = self.token_file.read_text("utf-8").strip()
        except OSError as exc:
            raise KubernetesError(
                f"kubernetes: cannot read the token file {self.token_file}: {exc.strerror}"
            ) from None
        if not text:
            raise KubernetesError(f"kubernetes: the token file {self.token_file} is empty")
        return text

    def request(
        self,
        method: str,
        path: str,
        access: Access,
        *,
        body: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One API call; the decoded object. KubernetesError (409: KubernetesConflictError)
        unless 2xx; transport errors, 429 and 5xx are retried, since every call is idempotent."""
        url = self.api_url + path
        for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
            headers = {"Accept": "application/json"}
            token = self.token()
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            if content_type is not None:
                headers["Content-Type"] = content_type
            try:
                response = self.client.request(
                    method,
                    url,
                    headers=headers,
                    params=dict(params) if params else None,
                    content=None if body is None else _json_bytes(body),
                )
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}"
                if attempt == TRANSIENT_ATTEMPTS:
                    raise KubernetesError(
                        f"kubernetes {access.verb} {access.kind}: {method} {url}: {failure}"
                    ) from None
            else:
                if response.is_success:
                    try:
                        data = response.json()
                    except ValueError:
                        raise KubernetesError(
                            f"kubernetes {access.verb} {access.kind}: not JSON"
                        ) from None
                    if not isinstance(data, dict):
                        raise KubernetesError(
                            f"kubernetes {access.verb} {access.kind}: not an object"
                        )
                    return data
                if response.status_code != 429 and response.status_code < 500:
                    raise build_api_error(
                        access, response.status_code, _status_message(response), self.token_file
                    )
                if attempt == TRANSIENT_ATTEMPTS:
                    raise build_api_error(
                        access, response.status_code, _status_message(response), self.token_file
                    )
            time.sleep(self.backoff_seconds * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # the loop returns or raises

    # -- nodes

    def get_node(self, name: str) -> dict[str, Any]:
        """The Node object."""
        return self.request("GET", f"/api/v1/nodes/{_seg(name)}", Access("get", "nodes", name))

    def _modify_node(
        self, name: str, build: Callable[[Mapping[str, Any]], dict[str, Any] | None]
    ) -> tuple[bool, dict[str, Any]]:
        """Read, build a patch, write with the read's resourceVersion; again on 409."""
        for attempt in range(1, CONFLICT_RETRIES + 1):
            node = self.get_node(name)
            patch = build(node)
            if patch is None:
                return False, node
            try:
                written = self.request(
                    "PATCH",
                    f"/api/v1/nodes/{_seg(name)}",
                    Access("patch", "nodes", name),
                    body=patch,
                    content_type=MERGE_PATCH,
                )
            except KubernetesConflictError:
                if attempt == CONFLICT_RETRIES:
                    raise
                log.info("node %s changed while tainting it; reading it again", name)
                continue
            return True, written
        raise AssertionError("unreachable")

    def taint_node(self, name: str, key: str, value: str) -> bool:
        """Add the `NoSchedule` taint, keeping the node's others; False if it was there."""
        changed, _ = self._modify_node(name, lambda n: build_taint_patch(n, key, value))
        return changed

    def untaint_node(self, name: str, key: str) -> bool:
        """Remove the taint `key`, keeping the others; False if the node did not have it."""
        changed, _ = self._modify_node(name, lambda n: build_untaint_patch(n, key))
        return changed

    # -- pods

    def list_pods(self, namespace: str, node: str, selector: str | None) -> list[dict[str, Any]]:
        """The pods of `namespace` scheduled on `node` that match the label selector."""
        path = f"/api/v1/namespaces/{_seg(namespace)}/pods"
        params = {"fieldSelector": f"spec.nodeName={node}", "limit": str(_PAGE)}
        if selector:
            params["labelSelector"] = selector
        access = Access("list", "pods", "", namespace=namespace)
        items: list[dict[str, Any]] = []
        while True:
            data = self.request("GET", path, access, params=params)
            page = data.get("items")
            if not isinstance(page, list):
                raise KubernetesError(f"kubernetes list pods in {namespace}: not a PodList")
            items += [item for item in page if isinstance(item, dict)]
            follow = (data.get("metadata") or {}).get("continue")
            if not follow:
                return items
            params = {**params, "continue": str(follow)}

    def patch_pod_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Apply a strategic merge patch to `pods/<name>/status`."""
        self.request(
            "PATCH",
            f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}/status",
            Access("patch", "pods/status", name, namespace=namespace),
            body=patch,
            content_type=STRATEGIC_MERGE_PATCH,
        )

    # -- deployments/scale

    def _scale_path(self, namespace: str, name: str) -> str:
        return f"/apis/apps/v1/namespaces/{_seg(namespace)}/deployments/{_seg(name)}/scale"

    def get_scale(self, namespace: str, name: str) -> dict[str, Any]:
        """The Deployment's Scale (`spec.replicas`, `metadata.resourceVersion`)."""
        return self.request(
            "GET",
            self._scale_path(namespace, name),
            Access("get", "deployments/scale", name, "apps", namespace),
        )

    def patch_scale(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a JSON merge patch to the Deployment's Scale."""
        return self.request(
            "PATCH",
            self._scale_path(namespace, name),
            Access("patch", "deployments/scale", name, "apps", namespace),
            body=patch,
            content_type=MERGE_PATCH,
        )


def _seg(value: str) -> str:
    return quote(value, safe="")


def _json_bytes(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


# ---- what a notice does to the node ---------------------------------------------------------


@dataclass
class PodMarks:
    """Pods whose condition was set, left alone (already so), or that lack the gate."""

    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    without_gate: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        """JSON form."""
        return {
            "changed": self.changed,
            "unchanged": self.unchanged,
            "without_gate": self.without_gate,
        }


class NodeActions:
    """Taint the node and take its serving pods out of their Services; undo both."""

    def __init__(
        self,
        client: KubernetesClient,
        node_name: str,
        namespace: str,
        pod_selector: str | None,
        taint_key: str = DEFAULT_TAINT_KEY,
        condition_type: str = DEFAULT_CONDITION_TYPE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.namespace = namespace
        self.pod_selector = pod_selector
        self.taint_key = taint_key
        self.condition_type = condition_type
        self.clock = clock

    @classmethod
    def from_target(cls, client: KubernetesClient, target: KubernetesTarget) -> NodeActions:
        """Actions of resolved settings (node, namespace and selector required)."""
        if target.node_name is None or target.namespace is None:
            raise KubernetesError("kubernetes: node_name and namespace are required")
        return cls(
            client,
            target.node_name,
            target.namespace,
            target.pod_selector,
            target.taint_key,
            target.condition_type,
        )

    def pods(self) -> list[dict[str, Any]]:
        """The serving pods on this node."""
        return self.client.list_pods(self.namespace, self.node_name, self.pod_selector)

    def mark(
        self,
        ready: bool,
        reason: str,
        message: str,
        pods: Sequence[Mapping[str, Any]] | None = None,
    ) -> PodMarks:
        """Set the condition on every serving pod of the node whose condition differs."""
        marks = PodMarks()
        wanted = "True" if ready else "False"
        for pod in self.pods() if pods is None else pods:
            name = str((pod.get("metadata") or {}).get("name", ""))
            if not pod_has_gate(pod, self.condition_type):
                # Set anyway (harmless), but it does not take the pod out of its Service.
                marks.without_gate.append(name)
            if pod_condition(pod, self.condition_type) == wanted:
                marks.unchanged.append(name)
                continue
            patch = build_condition_patch(self.condition_type, ready, reason, message, self.clock())
            self.client.patch_pod_status(self.namespace, name, patch)
            marks.changed.append(name)
        if marks.without_gate:
            log.warning(
                "pods %s on node %s lack readinessGates conditionType %s: a notice does not take "
                "them out of their Services",
                ", ".join(marks.without_gate),
                self.node_name,
                self.condition_type,
            )
        return marks

    def preempt(self, value: str, reason: str) -> dict[str, Any]:
        """On a notice: serving pods not ready (out of their Services), then the taint. Both are
        attempted; KubernetesError naming every failure."""
        done: dict[str, Any] = {"node": self.node_name}
        failures = []
        try:
            done["pods"] = self.mark(False, "SpotPreemption", reason).as_dict()
        except KubernetesError as exc:
            failures.append(str(exc))
        try:
            done["tainted"] = self.client.taint_node(self.node_name, self.taint_key, value)
        except KubernetesError as exc:
            failures.append(str(exc))
        if failures:
            raise KubernetesError("; ".join(failures))
        return done

    def restore(self, reason: str) -> dict[str, Any]:
        """After recovery on this same node: remove the taint, pods ready again."""
        untainted = self.client.untaint_node(self.node_name, self.taint_key)
        marks = self.mark(True, "SpotRecovered", reason)
        return {"node": self.node_name, "untainted": untainted, "pods": marks.as_dict()}

    def reconcile(self, preempted: bool = False) -> dict[str, Any]:
        """Mark ready the serving pods that lack the condition, unless the node is preempted
        (`preempted`, or it carries the taint: a restarted agent on the preempted node)."""
        node = self.client.get_node(self.node_name)
        if preempted or has_taint(node, self.taint_key):
            return {"node": self.node_name, "preempted": True}
        marks = self.mark(True, "SpotSafe", "no spot interruption notice for this node")
        return {"node": self.node_name, "preempted": False, "pods": marks.as_dict()}


__all__ = [
    "CONFLICT_RETRIES",
    "MERGE_PATCH",
    "RBAC_RULES",
    "SCALE_RBAC_RULES",
    "STRATEGIC_MERGE_PATCH",
    "TAINT_EFFECT",
    "Access",
    "KubernetesClient",
    "NodeActions",
    "PodMarks",
    "build_api_error",
    "build_condition_patch",
    "build_taint_patch",
    "build_untaint_patch",
    "has_taint",
    "pod_condition",
    "pod_has_gate",
]
