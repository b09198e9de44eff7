"""Asking for a replacement node at notice time, in parallel with the drain.

A preempted node's capacity is gone in 30-120 s; a new node takes minutes to boot and load a
model. So the request for its replacement goes out when the notice arrives, not when the node is
gone, through a `ReplacementProvider`:

- `KubernetesScaleUp`: PATCH `apps/v1` `deployments/<name>/scale` (+`by` replicas, or up to a
  target count, never above `max_replicas`): the new pod is pending until the cluster autoscaler
  or Karpenter brings a node;
- `WebhookReplacement`: POST a JSON request (node, provider, deadline, `request_id`) to a cloud
  hook (a Lambda, a Cloud Function, your provisioning API) with a bearer token read from a file,
  retried with backoff on transport errors, 408, 429 and 5xx.

`ReplacementRunner` runs one request: it claims the notice's `request_id` in Redis first (a
re-seen notice, or a restarted agent, does not ask twice), times it, and records the outcome
(`requested`, `unchanged`, `duplicate`, `failed`) in `<prefix>:replacement:<node>`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import redis
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from redline.platform.spot.errors import KubernetesConflictError, KubernetesError, SpotAgentError
from redline.platform.spot.kubernetes import CONFLICT_RETRIES, KubernetesClient
from redline.platform.spot.kubernetes_settings import KubernetesSettings
from redline.platform.spot.state import Notice

log = logging.getLogger(__name__)

ReplacementKind = Literal["none", "kubernetes", "webhook"]
ReplacementOutcome = Literal["requested", "unchanged", "duplicate", "failed"]
OUTCOMES: tuple[ReplacementOutcome, ...] = ("requested", "unchanged", "duplicate", "failed")
IDEMPOTENCY_HEADER = "Idempotency-Key"
CLAIM_TTL_SECONDS = 7 * 86400
PAYLOAD_VERSION = "1"


class ReplacementError(SpotAgentError):
    """A replacement request failed (refused, unreachable after every retry)."""


# ---- the request ----------------------------------------------------------------------------


def _iso(unix: float | None) -> str | None:
    if unix is None:
        return None
    return (
        datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


@dataclass(frozen=True)
class ReplacementRequest:
    """A replacement for one preemption of one node."""

    request_id: str
    node: str
    provider: str
    kind: str
    action: str
    noticed_at: float
    deadline: float | None
    reason: str
    kubernetes_node: str | None = None

    def payload(self) -> dict[str, Any]:
        """The webhook's JSON body (the contract in docs/spot.md)."""
        return {
            "version": PAYLOAD_VERSION,
            "event": "spot_replacement",
            "request_id": self.request_id,
            "node": self.node,
            "kubernetes_node": self.kubernetes_node,
            "provider": self.provider,
            "kind": self.kind,
            "action": self.action,
            "noticed_at": _iso(self.noticed_at),
            "deadline": _iso(self.deadline),
            "deadline_unix": self.deadline,
            "reason": self.reason,
        }


def build_replacement_request(
    notice: Notice, kubernetes_node: str | None = None
) -> ReplacementRequest:
    """The request for `notice`; its id is the same every time the same notice is seen (an AWS
    instance-action names its termination time), and differs between preemptions."""
    when = notice.terminate_at if notice.terminate_at is not None else notice.noticed_at
    return ReplacementRequest(
        request_id=f"{notice.node}:{notice.provider}:{when:.3f}",
        node=notice.node,
        provider=notice.provider,
        kind=notice.kind,
        action=notice.action,
        noticed_at=notice.noticed_at,
        deadline=notice.terminate_at,
        reason=notice.detail or f"spot {notice.provider} notice",
        kubernetes_node=kubernetes_node,
    )


@dataclass(frozen=True)
class ReplacementResult:
    """What one replacement request did, and when (unix seconds)."""

    request_id: str
    via: str
    outcome: ReplacementOutcome
    detail: str
    started_at: float
    finished_at: float

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "request_id": self.request_id,
            "via": self.via,
            "outcome": self.outcome,
            "detail": self.detail,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


class ReplacementProvider(Protocol):
    """Asks for a replacement; raises ReplacementError (or KubernetesError) when it cannot."""

    via: str

    def request(self, request: ReplacementRequest) -> tuple[ReplacementOutcome, str]:
        """(`requested` or `unchanged`, what was done)."""
        ...

    def close(self) -> None:
        """Release its connections."""
        ...


# ---- Kubernetes: scale a Deployment ---------------------------------------------------------


def build_scale_patch(
    scale: Mapping[str, Any],
    by: int = 1,
    replicas: int | None = None,
    max_replicas: int | None = None,
) -> tuple[dict[str, Any] | None, int, int]:
    """(a merge patch of the Scale or None when nothing changes, current, target replicas).

    The target is `replicas` when set, else current + `by`, never above `max_replicas`; the patch
    carries the read's `resourceVersion`, so a concurrent change makes it 409 rather than lost."""
    spec = scale.get("spec") or {}
    current = spec.get("replicas", 0)
    current = current if isinstance(current, int) else 0
    target = replicas if replicas is not None else current + by
    if max_replicas is not None:
        target = min(target, max_replicas)
    if target <= current:
        return None, current, current
    version = (scale.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise KubernetesError("the Scale the API answered has no metadata.resourceVersion")
    return (
        {"metadata": {"resourceVersion": str(version)}, "spec": {"replicas": target}},
        current,
        target,
    )


class KubernetesScaleUp:
    """Scale a Deployment up (`deployments/<name>/scale`)."""

    via = "kubernetes"

    def __init__(
        self,
        client: KubernetesClient,
        namespace: str,
        deployment: str,
        by: int = 1,
        replicas: int | None = None,
        max_replicas: int | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.deployment = deployment
        self.by = by
        self.replicas = replicas
        self.max_replicas = max_replicas

    def request(self, request: ReplacementRequest) -> tuple[ReplacementOutcome, str]:
        """Read the Scale, write the new count with its resourceVersion; again on 409."""
        name = f"deployment {self.namespace}/{self.deployment}"
        for attempt in range(1, CONFLICT_RETRIES + 1):
            scale = self.client.get_scale(self.namespace, self.deployment)
            patch, current, target = build_scale_patch(
                scale, self.by, self.replicas, self.max_replicas
            )
            if patch is None:
                cap = "" if self.max_replicas is None else f", max_replicas {self.max_replicas}"
                return "unchanged", f"{name}: already {current} replicas{cap}"
            try:
                self.client.patch_scale(self.namespace, self.deployment, patch)
            except KubernetesConflictError:
                if attempt == CONFLICT_RETRIES:
                    raise
                continue
            return "requested", f"{name}: {current} -> {target} replicas"
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the API client."""
        self.client.close()


# ---- a cloud hook ---------------------------------------------------------------------------


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: the backoff applies


class WebhookReplacement:
    """POST the request to a cloud hook with a bearer token; retried with backoff."""

    via = "webhook"

    def __init__(
        self,
        url: str,
        token_file: Path,
        client: httpx.Client | None = None,
        attempts: int = 5,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 10.0,
        timeout_seconds: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url
        self.token_file = token_file
        # Its own connections: the drain's gateway calls never wait behind a slow hook.
        self._owned = client is None
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(timeout_seconds, connect=min(2.0, timeout_seconds)),
            trust_env=False,
        )
        self.attempts = attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.sleep = sleep

    def token(self) -> str:
        """The hook's token, read now (so a rotated file is picked up)."""
        try:
            text = self.token_file.read_text("utf-8").strip()
        except OSError as exc:
            raise ReplacementError(
                f"replacement hook: cannot read the token file {self.token_file}: {exc.strerror}"
            ) from None
        if not text:
            raise ReplacementError(f"replacement hook: the token file {self.token_file} is empty")
        return text

    def request(self, request: ReplacementRequest) -> tuple[ReplacementOutcome, str]:
        """Deliver the request; 2xx is accepted, 408/429/5xx and transport errors are retried."""
        body = request.payload()
        last = ""
        for attempt in range(1, self.attempts + 1):
            headers = {
                "Authorization": f"Bearer {self.token()}",
                IDEMPOTENCY_HEADER: request.request_id,
            }
            wait = self.backoff_seconds * 2 ** (attempt - 1)
            try:
                response = self.client.post(self.url, json=body, headers=headers)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                code = response.status_code
                if response.is_success:
                    return "requested", f"{self.url}: HTTP {code} (attempt {attempt})"
                last = f"HTTP {code}: {response.text[:200]}"
                if code not in (408, 425, 429) and code < 500:
                    hint = (
                        f" (the hook refused the token in {self.token_file})"
                        if code in (401, 403)
                        else ""
                    )
                    raise ReplacementError(f"replacement hook {self.url}: {last}{hint}")
                wait = max(wait, _retry_after(response) or 0.0)
            if attempt < self.attempts:
                self.sleep(min(self.max_backoff_seconds, wait))
        raise ReplacementError(
            f"replacement hook {self.url}: gave up after {self.attempts} attempts: {last}"
        )

    def close(self) -> None:
        """Close its connections (when it made them)."""
        if self._owned:
            self.client.close()


# ---- the record and the runner --------------------------------------------------------------


class ReplacementLog:
    """Per node in Redis: the claim of each request id, and the last request's outcome."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def key(self, node: str) -> str:
        """The hash of the node's last replacement request."""
        return f"{self.prefix}:replacement:{node}"

    def _claim_key(self, node: str, request_id: str) -> str:
        return f"{self.key(node)}:claim:{request_id}"

    def claim(self, node: str, request_id: str) -> bool:
        """True the first time a request id is claimed (for a week)."""
        return bool(
            self.client.set(self._claim_key(node, request_id), "1", nx=True, ex=CLAIM_TTL_SECONDS)
        )

    def release(self, node: str, request_id: str) -> None:
        """Forget a claim (its request failed: a later sight of the notice may try again)."""
        self.client.delete(self._claim_key(node, request_id))

    def put(self, node: str, result: ReplacementResult) -> None:
        """Replace the node's last outcome."""
        fields = {k: str(v) for k, v in result.as_dict().items()}
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.key(node))
        pipe.hset(self.key(node), mapping=fields)  # type: ignore[arg-type]
        pipe.execute()

    def get(self, node: str) -> dict[str, str] | None:
        """The node's last outcome, or None."""
        raw = self.client.hgetall(self.key(node))
        if not raw:
            return None
        assert isinstance(raw, dict)
        return {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }


class ReplacementRunner:
    """One request end to end: claim, ask, time it, record it; it never raises."""

    def __init__(
        self,
        provider: ReplacementProvider,
        ledger: ReplacementLog | None = None,
        clock: Callable[[], float] = time.time,
        on_result: Callable[[ReplacementResult], None] | None = None,
    ) -> None:
        self.provider = provider
        self.ledger = ledger
        self.clock = clock
        self.on_result = on_result

    def _claim(self, request: ReplacementRequest) -> bool:
        if self.ledger is None:
            return True
        try:
            return self.ledger.claim(request.node, request.request_id)
        except redis.RedisError as exc:
            # Better a request twice than none: the drain needs the capacity.
            log.warning("replacement claim of %s unavailable: %s", request.request_id, exc)
            return True

    def run(self, request: ReplacementRequest) -> ReplacementResult:
        """Ask the provider once for this request id; the outcome."""
        started = self.clock()
        outcome: ReplacementOutcome
        if not self._claim(request):
            outcome, detail = "duplicate", f"{request.request_id} was already requested"
        else:
            try:
                outcome, detail = self.provider.request(request)
            except (SpotAgentError, httpx.HTTPError) as exc:
                outcome, detail = "failed", str(exc)
                if self.ledger is not None:
                    try:
                        self.ledger.release(request.node, request.request_id)
                    except redis.RedisError:
                        pass  # the claim expires on its own
        result = ReplacementResult(
            request.request_id, self.provider.via, outcome, detail, started, self.clock()
        )
        level = logging.ERROR if outcome == "failed" else logging.WARNING
        log.log(level, "replacement of %s via %s: %s: %s", request.node, result.via, outcome,
                detail)  # fmt: skip
        if self.ledger is not None and outcome != "duplicate":
            try:
                self.ledger.put(request.node, result)
            except redis.RedisError as exc:
                log.warning("replacement outcome of %s not recorded: %s", request.node, exc)
        if self.on_result is not None:
            self.on_result(result)
        return result


# ---- settings -------------------------------------------------------------------------------


class ReplacementSettings(BaseModel):
    """The agent's `replacement:` block: how to ask for a replacement at notice time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ReplacementKind = Field(
        "none", description="none, kubernetes (scale a Deployment) or webhook (a cloud hook)."
    )
    deployment: str | None = Field(None, description="kubernetes: the Deployment to scale up.")
    namespace: str | None = Field(
        None,
        description="kubernetes: its namespace (None: kubernetes.namespace, POD_NAMESPACE, or "
        "the service account's namespace).",
    )
    by: int = Field(1, ge=1, le=100, description="kubernetes: replicas to add per notice.")
    replicas: int | None = Field(
        None, ge=1, description="kubernetes: scale up to this count instead of adding `by`."
    )
    max_replicas: int | None = Field(
        None, ge=1, description="kubernetes: never scale above this many replicas."
    )
    url: str | None = Field(None, description="webhook: the hook's URL (POST, JSON).")
    token_file: Path | None = Field(
        None, description="webhook: file with the hook's bearer token (read on every call)."
    )
    attempts: int = Field(5, ge=1, le=20, description="webhook: attempts before giving up.")
    backoff_seconds: float = Field(
        0.5, gt=0, le=60, description="webhook: first retry delay (doubled each time, max 10 s)."
    )
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="webhook: one call's timeout.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value

    @model_validator(mode="after")
    def _complete(self) -> ReplacementSettings:
        if self.kind == "kubernetes" and not self.deployment:
            raise ValueError("replacement.deployment: required when replacement.kind is kubernetes")
        if self.kind == "webhook":
            if not self.url:
                raise ValueError("replacement.url: required when replacement.kind is webhook")
            if self.token_file is None:
                raise ValueError(
                    "replacement.token_file: required when replacement.kind is webhook (the "
                    "hook's bearer token)"
                )
        if self.kind != "kubernetes" and self.deployment:
            raise ValueError("replacement.deployment: only with replacement.kind kubernetes")
        if self.kind != "webhook" and self.url:
            raise ValueError("replacement.url: only with replacement.kind webhook")
        if self.max_replicas is not None and self.replicas is not None:
            if self.replicas > self.max_replicas:
                raise ValueError("replacement.replicas: above replacement.max_replicas")
        return self


def build_replacement_provider(
    settings: ReplacementSettings,
    kubernetes: KubernetesSettings,
    environ: Mapping[str, str] | None = None,
) -> ReplacementProvider | None:
    """The configured provider (None for `none`; `close()` it); KubernetesError or
    ReplacementError naming the setting that is missing."""
    if settings.kind == "none":
        return None
    if settings.kind == "webhook":
        assert settings.url is not None and settings.token_file is not None  # validated
        if not settings.token_file.is_file():
            raise ReplacementError(f"replacement.token_file: {settings.token_file} does not exist")
        return WebhookReplacement(
            settings.url,
            settings.token_file,
            attempts=settings.attempts,
            backoff_seconds=settings.backoff_seconds,
            timeout_seconds=settings.timeout_seconds,
        )
    assert settings.deployment is not None  # validated
    target = kubernetes.resolve(environ, node_actions=False)
    namespace = settings.namespace or target.namespace
    if namespace is None:
        raise ReplacementError(
            "replacement.namespace: required (or kubernetes.namespace, or POD_NAMESPACE)"
        )
    client = KubernetesClient.from_target(target)
    return KubernetesScaleUp(
        client, namespace, settings.deployment, settings.by, settings.replicas,
        settings.max_replicas,
    )  # fmt: skip


__all__ = [
    "IDEMPOTENCY_HEADER",
    "OUTCOMES",
    "PAYLOAD_VERSION",
    "KubernetesScaleUp",
    "ReplacementError",
    "ReplacementKind",
    "ReplacementLog",
    "ReplacementOutcome",
    "ReplacementProvider",
    "ReplacementRequest",
    "ReplacementResult",
    "ReplacementRunner",
    "ReplacementSettings",
    "WebhookReplacement",
    "build_replacement_provider",
    "build_replacement_request",
    "build_scale_patch",
]
