"""The spot agent: one per spot node; notice -> admission closed -> triage -> drained ->
replacement ready, with the node's state in Redis and its series on `/metrics`.

Parts, each usable alone (the `spot_drain` playbook drives the same `SpotDrainFlow`):

- `SpotStateStore`: the node's `NodeRecord` in Redis (`<prefix>:node:<node>`), so the agent of a
  replacement (or the playbook) continues where the preempted node's agent stopped;
- `GatewayAdmin`: the gateways' `/admin/spot` API (drain, in-flight count, release);
- `ReadinessGate`: a replacement is ready only when `/healthz` answers 200 from a new instance
  (its `x-redline-instance` differs from the preempted one's, when the server names instances),
  `/v1/models` lists the model, and a one-token dummy inference succeeds;
- `SpotDrainFlow`: `drain(notice)` (READY/RECOVERED -> DRAINING: close admission in the routing
  store, drain every gateway), `wait_drained` (-> TERMINATING when nothing is in flight or the
  budget is spent), `recover` (-> RECOVERED once the gate passes: admission opens again);
- `SpotAgent`: watches its notice sources (AWS, GCP, manual) in threads and runs the flow;
- `build_agent_app`: `/metrics`, `/state`, `/healthz` and `POST /notice` (the manual trigger).

Series: `llm_node_state{node,state}` (1 for the current state), the histogram
`llm_spot_notice_to_draining_seconds{node,provider}`, `llm_spot_replacement_ready_latency_seconds
{node,provider}` (TERMINATING -> RECOVERED; while still waiting, the time waited so far, so an
alert can fire on a replacement that never becomes ready), `llm_spot_drain_budget_seconds{node}`,
`llm_spot_notices_total{node,provider,kind}`, `llm_spot_agent_errors_total{node}`.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx
import redis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import Counter, Histogram
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, field_validator

from redline.core.settings import ServiceSettings, SettingsError, read_secret
from redline.platform.routing import DEFAULT_PREFIX as ROUTING_PREFIX
from redline.platform.routing import RoutingError, RoutingStore
from redline.platform.spot import (
    AwsImdsSource,
    GcpMetadataSource,
    ManualSource,
    NodeRecord,
    NodeState,
    Notice,
    NoticeSource,
    NoticeWatcher,
    SpotError,
    SpotStateError,
    build_drain_budget,
    build_transition,
)
from redline.slo.spec import Spot

log = logging.getLogger(__name__)

DEFAULT_AGENT_PORT = 9110
DEFAULT_STATE_PREFIX = "redline:spot"
INSTANCE_HEADER = "x-redline-instance"
RECHECK_SECONDS = 10.0
"""How often an agent whose replacement missed the readiness timeout checks it again."""
NOTICE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
Clock = Callable[[], float]


class SpotAgentError(SpotError):
    """The agent cannot do what it was asked (bad settings, a store it cannot reach)."""


# ---- state ----------------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SpotStateStore:
    """Node records in Redis: one hash per node."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_STATE_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_STATE_PREFIX) -> SpotStateStore:
        """A store on its own connection pool; `close()` it."""
        return cls(
            redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0), prefix
        )

    def key(self, node: str) -> str:
        """The node's Redis key."""
        return f"{self.prefix}:node:{node}"

    def get(self, node: str) -> NodeRecord:
        """The node's record (READY when it has none)."""
        raw = self.client.hgetall(self.key(node))
        if not raw:
            return NodeRecord(node)
        assert isinstance(raw, dict)
        decoded = {_text(k): _text(v) for k, v in raw.items()}
        return NodeRecord.from_fields(node, decoded)

    def put(self, record: NodeRecord) -> None:
        """Replace the node's record."""
        key = self.key(record.node)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=record.to_fields())  # type: ignore[arg-type]
        pipe.execute()

    def put_notice(self, notice: Notice) -> None:
        """Remember the node's latest interruption notice (the playbook drains from it)."""
        fields = {
            "provider": notice.provider,
            "kind": notice.kind,
            "action": notice.action,
            "noticed_at": repr(notice.noticed_at),
            "detected_at": repr(notice.detected_at),
            "detail": notice.detail,
        }
        if notice.terminate_at is not None:
            fields["terminate_at"] = repr(notice.terminate_at)
        key = f"{self.prefix}:notice:{notice.node}"
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
        pipe.execute()

    def get_notice(self, node: str) -> Notice | None:
        """The node's latest interruption notice, or None."""
        raw = self.client.hgetall(f"{self.prefix}:notice:{node}")
        if not raw:
            return None
        assert isinstance(raw, dict)
        data = {_text(k): _text(v) for k, v in raw.items()}
        try:
            kind = data["kind"]
            if kind not in ("interruption", "rebalance"):
                raise ValueError(f"kind {kind!r}")
            terminate = data.get("terminate_at")
            return Notice(
                node=node,
                provider=data["provider"],
                kind="interruption" if kind == "interruption" else "rebalance",
                action=data["action"],
                noticed_at=float(data["noticed_at"]),
                detected_at=float(data["detected_at"]),
                terminate_at=None if terminate is None else float(terminate),
                detail=data.get("detail", ""),
            )
        except (KeyError, ValueError) as exc:
            raise SpotError(f"node {node}: unreadable notice: {exc!r}") from None

    def notice_pending(self, node: str) -> Notice | None:
        """The node's latest interruption notice when no drain has handled it yet."""
        notice = self.get_notice(node)
        if notice is None or notice.kind != "interruption":
            return None
        record = self.get(node)
        handled = record.draining_at is not None and record.draining_at >= notice.detected_at
        return None if handled else notice

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()


# ---- the gateways ---------------------------------------------------------------------------


class GatewayAdmin:
    """The `/admin/spot` API of every gateway in front of the node."""

    def __init__(self, urls: Sequence[str], client: httpx.Client, token: str | None = None):
        self.urls = [u.rstrip("/") for u in urls]
        self.client = client
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post(url, json=body, headers=self.headers)
        if response.status_code != 200:
            raise SpotAgentError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
        data: dict[str, Any] = response.json()
        return data

    def drain(
        self,
        node: str,
        budget_seconds: float,
        continue_factor: float,
        close_seconds: float,
        reason: str,
    ) -> list[dict[str, Any]]:
        """Close the node's admission and triage its requests on every gateway; their reports."""
        body = {
            "node": node,
            "budget_seconds": budget_seconds,
            "continue_factor": continue_factor,
            "close_seconds": close_seconds,
            "reason": reason[:500],
        }
        return [self._post(f"{url}/admin/spot/drain", body) for url in self.urls]

    def inflight(self, node: str) -> int:
        """Requests still in flight on the node, over every gateway."""
        total = 0
        for url in self.urls:
            response = self.client.get(f"{url}/admin/spot/nodes/{node}", headers=self.headers)
            if response.status_code != 200:
                raise SpotAgentError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
            total += int(response.json()["inflight"])
        return total

    def release(self, node: str) -> None:
        """Admit requests to the node again on every gateway."""
        for url in self.urls:
            self._post(f"{url}/admin/spot/release", {"node": node})


# ---- readiness ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadinessCheck:
    """One pass of the readiness gate over a replacement."""

    healthy: bool
    model_loaded: bool
    inference_ok: bool
    instance: str | None
    detail: str

    @property
    def ready(self) -> bool:
        """All three checks passed."""
        return self.healthy and self.model_loaded and self.inference_ok

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "ready": self.ready,
            "healthy": self.healthy,
            "model_loaded": self.model_loaded,
            "inference_ok": self.inference_ok,
            "instance": self.instance,
            "detail": self.detail,
        }


class ReadinessGate:
    """Health, model loaded, dummy inference: the replacement serves only after all three."""

    def __init__(
        self, client: httpx.Client, model: str | None = None, prompt: str = "readiness check"
    ) -> None:
        self.client = client
        self.model = model
        self.prompt = prompt

    def instance(self, url: str) -> str | None:
        """The instance id the server at `url` names (None when it names none or is down)."""
        try:
            response = self.client.get(f"{url.rstrip('/')}/healthz")
        except httpx.HTTPError:
            return None
        instance = response.headers.get(INSTANCE_HEADER)
        return None if instance is None else str(instance)

    def check(self, url: str, not_instance: str | None = None) -> ReadinessCheck:
        """Run the three checks once; `not_instance` is the preempted node's instance id."""
        base = url.rstrip("/")
        try:
            health = self.client.get(f"{base}/healthz")
        except httpx.HTTPError as exc:
            return ReadinessCheck(False, False, False, None, f"health: {type(exc).__name__}")
        instance = health.headers.get(INSTANCE_HEADER)
        if health.status_code != 200:
            return ReadinessCheck(
                False, False, False, instance, f"health: HTTP {health.status_code}"
            )
        if not_instance is not None and instance == not_instance:
            return ReadinessCheck(
                False, False, False, instance, f"health: still the preempted instance {instance}"
            )
        try:
            listed = self.client.get(f"{base}/v1/models")
            ids = [m.get("id") for m in listed.json().get("data", [])] if listed.is_success else []
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            return ReadinessCheck(True, False, False, instance, f"models: {type(exc).__name__}")
        model = self.model or (ids[0] if ids else None)
        if model is None or model not in ids:
            wanted = self.model or "any model"
            return ReadinessCheck(True, False, False, instance, f"models: {wanted} not loaded")
        body = {
            "model": model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": 1,
        }
        try:
            answer = self.client.post(f"{base}/v1/chat/completions", json=body)
            content = (
                answer.json()["choices"][0]["message"]["content"] if answer.is_success else None
            )
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            return ReadinessCheck(True, True, False, instance, f"inference: {type(exc).__name__}")
        if not content:
            return ReadinessCheck(
                True, True, False, instance, f"inference: HTTP {answer.status_code}, no answer"
            )
        return ReadinessCheck(True, True, True, instance, f"ready: {model} answered")

    def wait(
        self,
        url: str,
        timeout: float,
        interval: float,
        not_instance: str | None = None,
        stop: threading.Event | None = None,
        observe: Callable[[ReadinessCheck], None] | None = None,
    ) -> ReadinessCheck:
        """Check until ready or `timeout`; the last check either way (each one to `observe`)."""
        deadline = time.monotonic() + timeout
        while True:
            check = self.check(url, not_instance)
            if observe is not None:
                observe(check)
            if check.ready or time.monotonic() >= deadline:
                return check
            if stop is not None and stop.wait(interval):
                return check
            if stop is None:
                time.sleep(interval)


# ---- metrics --------------------------------------------------------------------------------


class SpotAgentMetrics(Collector):
    """The agent's series; node state and replacement latency are read from the live record."""

    def __init__(
        self,
        registry: CollectorRegistry,
        record: Callable[[], NodeRecord],
        pending: Callable[[], Notice | None],
        clock: Clock,
    ) -> None:
        self.record = record
        self.pending = pending
        self.clock = clock
        self.notice_to_draining = Histogram(
            "llm_spot_notice_to_draining_seconds",
            "Seconds from a spot interruption notice to DRAINING (admission closed, triage done).",
            ("node", "provider"),
            buckets=NOTICE_BUCKETS,
            registry=registry,
        )
        self.notices = Counter(
            "llm_spot_notices",
            "Spot notices seen, by kind (interruption, rebalance).",
            ("node", "provider", "kind"),
            registry=registry,
        )
        self.errors = Counter(
            "llm_spot_agent_errors",
            "Failures of the agent's sources or flow steps.",
            ("node",),
            registry=registry,
        )
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """Node state, replacement latency and budget from the current record."""
        record = self.record()
        state = GaugeMetricFamily(
            "llm_node_state", "1 for the spot node's current state.", labels=("node", "state")
        )
        for value in NodeState:
            state.add_metric((record.node, value.value), 1.0 if record.state is value else 0.0)
        yield state
        latency = GaugeMetricFamily(
            "llm_spot_replacement_ready_latency_seconds",
            "Node gone (TERMINATING, or its termination time if later) -> RECOVERED of the last "
            "replacement; while it is not ready yet, the "
            "seconds waited so far.",
            labels=("node", "provider"),
        )
        waited = record.replacement_latency(self.clock())
        if waited is not None:
            latency.add_metric((record.node, record.provider or "unknown"), waited)
        yield latency
        budget = GaugeMetricFamily(
            "llm_spot_drain_budget_seconds",
            "Drain budget of the node's last preemption.",
            labels=("node",),
        )
        if record.budget_seconds is not None:
            budget.add_metric((record.node,), record.budget_seconds)
        yield budget
        pending = GaugeMetricFamily(
            "llm_spot_notice_pending",
            "1 while the node has an interruption notice that no drain has handled yet.",
            labels=("node", "provider"),
        )
        notice = self.pending()
        pending.add_metric(
            (record.node, notice.provider if notice else record.provider or "unknown"),
            1.0 if notice is not None else 0.0,
        )
        yield pending

    def describe(self) -> list[Metric]:
        """No fixed description: the families are built at collection."""
        return []


# ---- the flow -------------------------------------------------------------------------------


@dataclass
class SpotDrainFlow:
    """Notice -> DRAINING -> TERMINATING -> RECOVERED for one node, step by step."""

    node: str
    spot: Spot
    store: SpotStateStore
    routing: RoutingStore
    gateways: GatewayAdmin
    gate: ReadinessGate
    upstream_url: str | None
    clock: Clock = time.time
    poll_seconds: float = 0.1
    on_draining: Callable[[NodeRecord], None] | None = None
    tick: Callable[[], None] | None = None  # called on every poll (a playbook's lease check)
    last_reports: list[dict[str, Any]] = field(default_factory=list, init=False)
    last_check: ReadinessCheck | None = field(default=None, init=False)

    def record(self) -> NodeRecord:
        """The node's current record."""
        return self.store.get(self.node)

    def _observe(self, check: ReadinessCheck) -> None:
        self.last_check = check
        if self.tick is not None:
            self.tick()

    def drain(self, notice: Notice) -> NodeRecord:
        """Close admission, drain every gateway, DRAINING. Idempotent: a node already draining
        or terminating is left as it is."""
        record = self.record()
        if record.state in (NodeState.DRAINING, NodeState.TERMINATING):
            return record
        budget = build_drain_budget(self.spot, notice)
        self.last_check = None
        terminate = notice.terminate_at
        reason = f"spot {notice.provider} notice ({notice.action})" + (
            f", terminating at {terminate:.3f}" if terminate is not None else ""
        )
        close_for = max(budget.notice_seconds, 1.0) + self.spot.readiness_timeout_seconds
        # The gateways first: they stop admitting and triage at once; the routing store then
        # keeps admission closed for every other reader (and across restarts).
        failure: Exception | None = None
        try:
            self.last_reports = self.gateways.drain(
                self.node, budget.seconds, self.spot.continue_factor, close_for, reason
            )
        except (httpx.HTTPError, SpotAgentError) as exc:
            failure = exc
        try:
            self.routing.close_admission(self.node, reason)
        except RoutingError as exc:
            raise SpotAgentError(f"routing store: {exc}") from None
        if failure is not None:
            raise SpotAgentError(f"gateway drain: {failure}") from failure
        now = self.clock()
        record = build_transition(
            record,
            NodeState.DRAINING,
            now,
            provider=notice.provider,
            notice_at=notice.noticed_at,
            detected_at=notice.detected_at,
            terminate_at=terminate,
            budget_seconds=budget.seconds,
            detail=reason,
        )
        self.store.put(record)
        if self.on_draining is not None:
            self.on_draining(record)
        if self.upstream_url is not None:
            # Still the preempted instance while it drains: its replacement must differ.
            instance = self.gate.instance(self.upstream_url)
            if instance:
                record = replace(record, preempted_instance=instance)
                self.store.put(record)
        return record

    def wait_drained(self, stop: threading.Event | None = None) -> NodeRecord:
        """DRAINING -> TERMINATING once nothing is in flight on the node or its budget is spent."""
        record = self.record()
        if record.state is not NodeState.DRAINING:
            return record
        assert record.draining_at is not None
        deadline = record.draining_at + (record.budget_seconds or 0.0)
        while self.clock() < deadline:
            if self.tick is not None:
                self.tick()
            try:
                if self.gateways.inflight(self.node) == 0:
                    break
            except (httpx.HTTPError, SpotAgentError) as exc:
                log.warning("in-flight count of %s: %s", self.node, exc)
            if stop is not None and stop.wait(self.poll_seconds):
                break
            if stop is None:
                time.sleep(self.poll_seconds)
        record = build_transition(self.record(), NodeState.TERMINATING, self.clock())
        self.store.put(record)
        return record

    def recover(self, timeout: float, stop: threading.Event | None = None) -> NodeRecord:
        """TERMINATING -> RECOVERED when the replacement passes the readiness gate within
        `timeout`; admission opens again. Still TERMINATING (admission closed) otherwise."""
        record = self.record()
        if record.state is not NodeState.TERMINATING:
            return record
        if self.upstream_url is None:
            raise SpotAgentError(f"node {self.node}: no upstream URL to check a replacement at")
        check = self.gate.wait(
            self.upstream_url,
            timeout,
            max(self.poll_seconds, 0.05),
            record.preempted_instance or None,
            stop,
            self._observe,
        )
        if not check.ready:
            log.warning("replacement of %s not ready: %s", self.node, check.detail)
            return self.record()
        self.routing.open_admission(self.node)
        self.gateways.release(self.node)
        record = build_transition(
            self.record(), NodeState.RECOVERED, self.clock(), detail=check.detail
        )
        self.store.put(record)
        return record


# ---- the agent ------------------------------------------------------------------------------


class SpotAgentSettings(ServiceSettings):
    """Settings of `redline spot-agent run`."""

    node: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9-]*$",
        description="The node: the name of its upstream at the gateways (required).",
    )
    provider: Literal["aws", "gcp", "manual"] = Field(
        "aws", description="Notice source: AWS IMDSv2, GCP metadata, or manual triggers only."
    )
    metadata_url: str = Field(
        "http://169.254.169.254", description="Base URL of the instance metadata service."
    )
    upstream_url: str | None = Field(
        None, description="The node's serving URL, where the replacement's readiness is checked."
    )
    gateway_urls: list[str] = Field(
        default_factory=list, description="Gateways in front of the node (their /admin/spot)."
    )
    gateway_token_file: Path | None = Field(
        None, description="File with the gateways' admin bearer token."
    )
    model: str | None = Field(
        None, description="Model the readiness gate expects (None: the first one listed)."
    )
    routing_key_prefix: str = Field(ROUTING_PREFIX, description="Routing store key prefix.")
    state_key_prefix: str = Field(DEFAULT_STATE_PREFIX, description="Node state key prefix.")
    poll_interval_seconds: float = Field(
        2.0, gt=0, description="AWS metadata poll interval (keep it <= the detection delay)."
    )
    gcp_wait_seconds: float = Field(30.0, gt=0, description="Longest GCP long-poll.")
    drain_on_rebalance: bool = Field(
        False, description="Treat an AWS rebalance recommendation as a notice (drain early)."
    )
    act: bool = Field(
        True,
        description="Run the drain flow on a notice (false: only export it, for the spot_drain "
        "playbook to act through Alertmanager).",
    )
    time_scale: float = Field(
        1.0, gt=0, le=1, description="Scale of the spec's spot durations (drills compress them)."
    )
    flow_poll_seconds: float = Field(0.1, gt=0, description="Poll interval of the flow's waits.")

    @field_validator("gateway_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return value


class ManualNotice(BaseModel):
    """`POST /notice`: a manual (test) interruption notice."""

    model_config = ConfigDict(extra="forbid")
    in_seconds: float = Field(gt=0, le=86400, description="Seconds until the node goes away.")
    reason: str = Field("manual trigger", max_length=200, description="Why (recorded).")


class SpotAgent:
    """Watches the node's notice sources and runs the flow for every interruption."""

    def __init__(
        self,
        settings: SpotAgentSettings,
        flow: SpotDrainFlow,
        sources: Sequence[NoticeSource],
        manual: ManualSource,
        metrics: SpotAgentMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.flow = flow
        self.sources = list(sources)
        self.manual = manual
        self.metrics = metrics
        self.stop = threading.Event()
        self.notices: queue.Queue[Notice] = queue.Queue()
        self.last_error: str | None = None
        self.watchers = [
            NoticeWatcher(
                source,
                self.notices.put,
                settings.poll_interval_seconds if source.provider == "aws" else 0.0,
                self.stop,
                self._error,
            )
            for source in self.sources
        ]
        self.thread = threading.Thread(target=self._run, name="spot-agent", daemon=True)

    def _error(self, message: str) -> None:
        self.last_error = message
        if self.metrics is not None:
            self.metrics.errors.labels(self.flow.node).inc()

    def trigger(self, in_seconds: float, reason: str) -> Notice:
        """A manual notice: the node goes away in `in_seconds`."""
        now = self.flow.clock()
        notice = Notice(
            self.flow.node, "manual", "interruption", "terminate", now, now,
            now + in_seconds, reason,
        )  # fmt: skip
        self.notices.put(notice)
        return notice

    def start(self) -> None:
        """Start the watchers and the flow thread."""
        for watcher in self.watchers:
            watcher.start()
        self.thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching and wait (bounded) for the threads."""
        self.stop.set()
        self.thread.join(timeout)
        for watcher in self.watchers:
            watcher.join(0.5)

    def _run(self) -> None:
        # A replacement's agent (or a restarted one) finishes what the last one left undone.
        self._continue(self.flow.record())
        last_check = time.monotonic()
        while not self.stop.is_set():
            try:
                notice = self.notices.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() - last_check >= RECHECK_SECONDS:
                    # Past the readiness timeout the node stays closed; keep looking, slowly,
                    # so a replacement that comes up late is still admitted.
                    last_check = time.monotonic()
                    self._recheck()
                continue
            self.handle(notice)
            last_check = time.monotonic()

    def _recheck(self) -> None:
        try:
            record = self.flow.record()
            if record.state is NodeState.TERMINATING:
                self.flow.recover(0.0, self.stop)
        except (SpotAgentError, SpotStateError, httpx.HTTPError, redis.RedisError) as exc:
            self._error(f"recheck: {type(exc).__name__}: {exc}")

    def handle(self, notice: Notice) -> NodeRecord | None:
        """Run the flow for one notice (rebalance notices only drain when configured)."""
        if self.metrics is not None:
            self.metrics.notices.labels(notice.node, notice.provider, notice.kind).inc()
        log.warning("notice for %s: %s %s (%s)", notice.node, notice.kind, notice.action,
                    notice.detail)  # fmt: skip
        if notice.kind == "rebalance" and not self.settings.drain_on_rebalance:
            return None
        if notice.kind == "rebalance":
            notice = replace(notice, kind="interruption")
        try:
            self.flow.store.put_notice(notice)
        except redis.RedisError as exc:
            self._error(f"notice store: {type(exc).__name__}: {exc}")
        if not self.settings.act:
            return None
        try:
            record = self.flow.drain(notice)
        except (SpotAgentError, SpotStateError, httpx.HTTPError, redis.RedisError) as exc:
            self._error(f"drain: {type(exc).__name__}: {exc}")
            log.error("drain of %s failed: %s", notice.node, exc)
            return None
        return self._continue(record)

    def _continue(self, record: NodeRecord) -> NodeRecord:
        try:
            if record.state is NodeState.DRAINING:
                record = self.flow.wait_drained(self.stop)
            if record.state is NodeState.TERMINATING and not self.stop.is_set():
                record = self.flow.recover(self.flow.spot.readiness_timeout_seconds, self.stop)
        except (SpotAgentError, SpotStateError, httpx.HTTPError, redis.RedisError) as exc:
            self._error(f"flow: {type(exc).__name__}: {exc}")
            log.error("spot flow of %s failed: %s", record.node, exc)
        return record


def build_sources(
    settings: SpotAgentSettings, node: str, spot: Spot, client: httpx.Client
) -> tuple[list[NoticeSource], ManualSource]:
    """The node's cloud source (if any) and its manual source."""
    manual = ManualSource()
    sources: list[NoticeSource] = [manual]
    if settings.provider == "aws":
        sources.append(AwsImdsSource(node, settings.metadata_url, spot, client))
    elif settings.provider == "gcp":
        sources.append(
            GcpMetadataSource(node, settings.metadata_url, spot, client, settings.gcp_wait_seconds)
        )
    return sources, manual


def build_agent_app(
    settings: SpotAgentSettings, spot: Spot, registry: CollectorRegistry | None = None
) -> FastAPI:
    """The agent's ASGI app; the agent runs while the app is served."""
    if settings.node is None:
        raise SpotAgentError("node: required (--node NAME, the node's upstream name)")
    node = settings.node
    try:
        secret = read_secret(settings.gateway_token_file, None, "gateway admin token")
    except SettingsError as exc:
        raise SpotAgentError(str(exc)) from None
    token = None if secret is None else secret.get_secret_value()
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    client = httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False)
    store = SpotStateStore.from_url(settings.redis_url, settings.state_key_prefix)
    routing = RoutingStore.from_url(settings.redis_url, settings.routing_key_prefix)
    holder: dict[str, NodeRecord] = {"record": NodeRecord(node)}
    pending: dict[str, Notice | None] = {"notice": None}
    metrics = SpotAgentMetrics(
        registry, lambda: holder["record"], lambda: pending["notice"], time.time
    )

    def observed(record: NodeRecord) -> None:
        holder["record"] = record
        waited = record.notice_to_draining
        if waited is not None:
            metrics.notice_to_draining.labels(record.node, record.provider).observe(waited)

    flow = SpotDrainFlow(
        node,
        spot,
        store,
        routing,
        GatewayAdmin(settings.gateway_urls, client, token),
        ReadinessGate(client, settings.model),
        settings.upstream_url,
        poll_seconds=settings.flow_poll_seconds,
        on_draining=observed,
    )
    sources, manual = build_sources(settings, node, spot, client)
    agent = SpotAgent(settings, flow, sources, manual, metrics)

    def refresh() -> NodeRecord:
        try:
            holder["record"] = store.get(node)
            pending["notice"] = store.notice_pending(node)
        except (redis.RedisError, SpotError) as exc:
            log.warning("node state unreadable: %s", exc)
        return holder["record"]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        refresh()
        agent.start()
        try:
            yield
        finally:
            agent.close()
            client.close()
            store.close()
            routing.close()

    app = FastAPI(title=f"redline spot agent ({node})", docs_url=None, lifespan=lifespan)
    app.state.agent = agent

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        refresh()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/state")
    async def state() -> dict[str, Any]:
        record = refresh()
        notice = pending["notice"]
        return {
            "node": record.node,
            "state": record.state.value,
            "record": record.to_fields(),
            "notice_to_draining": record.notice_to_draining,
            "replacement_latency": record.replacement_latency(time.time()),
            "drain_reports": flow.last_reports,
            "readiness": None if flow.last_check is None else flow.last_check.as_dict(),
            "pending_notice": None if notice is None else vars(notice),
            "last_error": agent.last_error,
        }

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "node": node, "provider": settings.provider}

    @app.post("/notice")
    async def notice(request: Request) -> Response:
        if token is not None:
            presented = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(presented, f"Bearer {token}".encode()):
                return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401)
        try:
            body = ManualNotice.model_validate(await request.json())
        except ValueError as exc:
            return JSONResponse({"detail": f"invalid notice: {exc}"}, status_code=422)
        issued = agent.trigger(body.in_seconds, body.reason)
        return JSONResponse({"node": issued.node, "terminate_at": issued.terminate_at})

    return app


__all__ = [
    "DEFAULT_AGENT_PORT",
    "DEFAULT_STATE_PREFIX",
    "GatewayAdmin",
    "ManualNotice",
    "ReadinessCheck",
    "ReadinessGate",
    "SpotAgent",
    "SpotAgentError",
    "SpotAgentMetrics",
    "SpotAgentSettings",
    "SpotDrainFlow",
    "SpotStateStore",
    "build_agent_app",
    "build_sources",
]
