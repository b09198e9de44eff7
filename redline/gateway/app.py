"""The gateway: an OpenAI-compatible reverse proxy over regional upstreams, with reroute.

It is the only place where "P99 including reroute" can be measured honestly: the latency
histogram is observed from the moment a request arrives until its last byte is sent, across every
attempt, so a request that failed over from the primary carries the failed attempt's time too.

Routing, per request:

1. Order the regions: the routing override (Redis, `redline.platform.routing`) first, then the
   configured order; regions whose admission is closed, or that failed
   `unhealthy_after_failures` times in a row within `unhealthy_cooldown_seconds`, go last. The
   routing state is refreshed in the background every `routing_refresh_seconds` (<= 1 s), so Redis
   is never on a request's path; while Redis is unreachable the configured order applies.
2. Try each region in that order. Move on (a reroute, counted in `llm_reroutes_total`) on a
   connect error, a 5xx, a transport error or timeout, or when the response's first byte has not
   arrived within `first_byte_budget_seconds`. The budget is not applied to the last region: with
   nowhere left to go, waiting is better than failing. Once the first byte of a streamed (SSE)
   response is forwarded the request is committed to that region.
3. Stream SSE through as it arrives (never buffered); non-streaming bodies are read whole. A
   non-streaming response's first byte comes when its generation is done, so for those the
   budget bounds the whole generation; `first_byte_budget_streaming_only` exempts them.

Upstream calls go through `redline.gateway.upstream`, a lean asyncio HTTP/1.1 keep-alive
client (httpx cost about three times the CPU per proxied request; see bench/gateway_overhead.py).

Token counts come from the upstream's `usage`. For a streamed request that did not ask for it the
gateway adds `stream_options.include_usage` upstream and drops the usage-only chunk before it
reaches the client (`inject_stream_usage`); when an upstream sends no usage, completion tokens are
the content chunks counted in the stream (one token each, as vLLM and OpenAI stream) and prompt
tokens are not counted.

Metric labels: `region` is the region the request was first routed to, `served_region` the one
that answered, `rerouted` whether more than one region was tried, `model` the requested model
(bounded: past `max_model_labels` distinct names it is "other"), `model_version` the upstream's
`x-redline-model-version` header ("unknown" without one), `status` the HTTP status sent to the
client — except that a stream the upstream cut is recorded as 502 and one the client abandoned as
499. Errors are statuses >= 500. Requests the gateway rejects itself (malformed JSON, body too
large) are recorded with `region` and `served_region` "none". No `_created` series are exposed
(unless `created_series`).

Spot preemption (`redline.platform.spot`): `POST /admin/spot/drain {"node", "budget_seconds",
"continue_factor"}` closes admission to a node (an upstream) at once, in this process, and
triages every request in flight on it: a request continues when remaining tokens x TPOT <=
continue_factor x budget and is aborted otherwise; whatever still runs on the node when the budget
is spent is aborted then. An aborted stream ends with an SSE error event (`SPOT_PREEMPTION`,
`recoverable` when the request is retry-safe, the header to resend it with) followed by
`[DONE]`, never with a cut connection; so does a stream whose draining node dies under it. The
stream is recorded with status 503. Before the event goes out the request is written to the
ledger (Redis: request id, attempt, served prefix, model revision, prompt fingerprint,
retry-safety, reason). The client resends it with `x-redline-resume: <request id>`: the gateway
claims the entry atomically, routes to another replica and, when that replica serves the same
model revision, resumes after the served prefix (vLLM `continue_final_message`; the answer says
`x-redline-resumed: true` and carries only the rest), or regenerates from scratch
(`x-redline-resumed: false`). A non-streaming request aborted this way is retried on the next
replica at once, invisibly, when retry-safe. A request that is not retry-safe (header
`x-redline-retry-safe: false`, or tools offered) is never run twice: it is rerouted only when its
replica could not be reached, an aborted one gets `recoverable: false`, and when it carries an
`x-request-id` that id is claimed in the ledger before it runs (a second copy gets 409).
`/admin/spot/*` takes a bearer token when `admin_token_file` is set. Ordinary requests never
touch Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.metrics import Counter, Gauge, Histogram
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from redline.core.settings import ServiceSettings, SettingsError, read_secret
from redline.gateway.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
)
from redline.platform.golden import MODEL_VERSION_HEADER
from redline.platform.routing import (
    DEFAULT_PREFIX,
    REROUTED_HEADER,
    SERVED_REGION_HEADER,
    AsyncRoutingReader,
    RoutingError,
    RoutingState,
    build_region_order,
)
from redline.platform.spot import (
    ATTEMPT_HEADER,
    CLAIM_NOT_FOUND,
    CLAIM_NOT_INTERRUPTED,
    CLAIM_NOT_RETRY_SAFE,
    DEFAULT_LEDGER_PREFIX,
    REQUEST_ID_HEADER,
    RESUME_HEADER,
    RESUMED_HEADER,
    RETRY_SAFE_HEADER,
    SPOT_ERROR_TYPE,
    AsyncRequestLedger,
    InflightView,
    LedgerEntry,
    LedgerError,
    aborted_ratio,
    build_prompt_fingerprint,
    build_resume_payload,
    build_spot_error,
    build_triage,
    is_retry_safe,
    render_sse_error,
    requested_max_tokens,
)
from redline.slo.spec import Spec

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)

DEFAULT_GATEWAY_PORT = 8080
REQUEST_LABELS = ("region", "served_region", "rerouted", "model", "model_version", "status")
TOKEN_LABELS = ("served_region", "model", "model_version")
REROUTE_REASONS = (
    "connect_error",
    "server_error",
    "first_byte_budget",
    "timeout",
    "upstream_error",
)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.8, 1.0, 2.0, 5.0, 10.0)
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
    }
)
_NOT_FORWARDED_BACK = _HOP_BY_HOP | {"date", "server"}
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_CONTENT_MEMBER = re.compile(rb'"(?:content|text)"\s*:\s*"((?:[^"\\]|\\.)+)"')
_USAGE_MEMBER = re.compile(rb'"usage"\s*:\s*\{')
_REGION = re.compile(r"^[a-z][a-z0-9-]*$")


class StreamCutError(Exception):
    """An upstream stream broke after its first bytes were forwarded; the client's is aborted."""


class GatewayConfigError(Exception):
    """The gateway cannot start with these settings (e.g. no upstreams)."""


class _SpotAbortedError(Exception):
    """An attempt was aborted by a spot drain before it committed."""


class GatewaySettings(ServiceSettings):
    """Settings of `redline gateway`."""

    upstreams: dict[str, str] = Field(
        default_factory=dict,
        description="Regional upstreams in failover order: region -> base URL (first = primary).",
    )
    first_byte_budget_seconds: float | None = Field(
        1.0,
        gt=0,
        description="Reroute when the first response byte takes longer (None: never).",
    )
    connect_timeout_seconds: float = Field(0.5, gt=0, description="TCP connect timeout.")
    request_timeout_seconds: float = Field(
        60.0, gt=0, description="Longest wait for any read from an upstream."
    )
    routing_refresh_seconds: float = Field(
        0.5, gt=0, le=1, description="How often the routing state is read from Redis."
    )
    routing_key_prefix: str = Field(DEFAULT_PREFIX, description="Key prefix of the routing store.")
    redis_timeout_seconds: float = Field(0.25, gt=0, description="Redis socket timeouts.")
    unhealthy_after_failures: int = Field(
        3, ge=0, description="Consecutive failures that mark a region unhealthy (0: never)."
    )
    unhealthy_cooldown_seconds: float = Field(
        5.0, gt=0, description="How long an unhealthy region is tried last."
    )
    max_body_bytes: int = Field(8 << 20, ge=1024, description="Largest request body accepted.")
    max_model_labels: int = Field(32, ge=1, description="Distinct `model` label values kept.")
    inject_stream_usage: bool = Field(
        True, description="Ask upstreams for usage in streams, and strip it if not asked for."
    )
    max_connections: int = Field(
        512, ge=1, description="Idle keep-alive connections kept per upstream."
    )
    first_byte_budget_streaming_only: bool = Field(
        False, description="Apply the first-byte budget to streamed requests only."
    )
    created_series: bool = Field(False, description="Expose the `_created` series.")
    admin_token_file: Path | None = Field(
        None, description="File with the bearer token /admin/spot requires (unset: no token)."
    )
    ledger_key_prefix: str = Field(
        DEFAULT_LEDGER_PREFIX, min_length=1, description="Key prefix of the request ledger."
    )
    ledger_ttl_seconds: float = Field(
        3600.0, gt=0, description="How long an interrupted request can be resumed."
    )
    spot_default_tpot_seconds: float = Field(
        0.05, gt=0, description="Time per output token assumed until a node's is measured."
    )
    spot_unknown_remaining_tokens: int = Field(
        512, ge=1, description="Tokens assumed left for a request without max_tokens."
    )
    spot_retry_after_ms: int = Field(
        0, ge=0, description="Retry hint of the SPOT_PREEMPTION error event."
    )
    balance: Literal["failover", "round_robin"] = Field(
        "failover",
        description="failover: the configured order; round_robin: spread requests over the "
        "open upstreams (replicas of one pool), in turn.",
    )
    spill_regions: list[str] = Field(
        default_factory=list,
        description="Upstreams used only when every other one is closed, unhealthy or failed "
        "(an on-demand pool behind spot replicas).",
    )

    @field_validator("upstreams")
    @classmethod
    def _check_upstreams(cls, value: dict[str, str]) -> dict[str, str]:
        for region, url in value.items():
            if not _REGION.match(region):
                raise ValueError(f"region {region!r} must be lowercase letters, digits and '-'")
            try:
                parsed = urlsplit(url)
                valid = parsed.scheme in ("http", "https") and bool(parsed.hostname)
                valid = valid and (parsed.port or 1) > 0
            except ValueError:
                valid = False
            if not valid:
                raise ValueError(f"upstream {region}: {url!r} is not an http(s) URL")
        return value

    @model_validator(mode="after")
    def _check_spill(self) -> GatewaySettings:
        unknown = [r for r in self.spill_regions if r not in self.upstreams]
        if unknown:
            raise ValueError(f"spill_regions {unknown} are not among the upstreams")
        return self


class _WithoutCreated(Collector):
    """Yields the families of a private registry without their `_created` samples."""

    def __init__(self, inner: CollectorRegistry) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            created = family.name + "_created"
            if any(sample.name == created for sample in family.samples):
                clone = Metric(family.name, family.documentation, family.type, family.unit)
                clone.samples = [s for s in family.samples if s.name != created]
                yield clone
            else:
                yield family

    def describe(self) -> list[Metric]:
        return list(self.collect())


class GatewayMetrics:
    """The gateway's series (catalog names), registered on the registry passed in."""

    def __init__(
        self,
        registry: CollectorRegistry,
        buckets: Sequence[float],
        regions: Sequence[str],
        created_series: bool = False,
    ) -> None:
        target = registry if created_series else CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "llm_request_duration_seconds",
            "End-to-end latency at the gateway, reroutes included.",
            REQUEST_LABELS,
            buckets=tuple(buckets),
            registry=target,
        )
        self.requests = Counter(
            "llm_requests", "Requests answered by the gateway.", REQUEST_LABELS, registry=target
        )
        self.errors = Counter(
            "llm_request_errors",
            "Requests that ended in an error (status >= 500 or a cut stream).",
            REQUEST_LABELS,
            registry=target,
        )
        self.reroutes = Counter(
            "llm_reroutes",
            "Requests moved from one region to the next, by reason.",
            ("from_region", "to_region", "reason"),
            registry=target,
        )
        self.generated_tokens = Counter(
            "llm_generated_tokens",
            "Completion tokens served (from usage, or counted in the stream).",
            TOKEN_LABELS,
            registry=target,
        )
        self.prompt_tokens = Counter(
            "llm_prompt_tokens", "Prompt tokens served (from usage).", TOKEN_LABELS, registry=target
        )
        self.ttft = Histogram(
            "llm_time_to_first_token_seconds",
            "Time from a streamed request's arrival to its first content token.",
            TOKEN_LABELS,
            buckets=TTFT_BUCKETS,
            registry=target,
        )
        self.upstream_healthy = Gauge(
            "llm_gateway_upstream_healthy",
            "1 unless the region failed repeatedly and is being tried last.",
            ("region",),
            registry=target,
        )
        self.routing_store_up = Gauge(
            "llm_gateway_routing_store_up",
            "1 if the last read of the routing state from Redis succeeded.",
            registry=target,
        )
        self.spot_aborted_ratio = Gauge(
            "llm_spot_inflight_aborted_ratio",
            "Share of the requests in flight on a node that its last drain aborted.",
            ("node",),
            registry=target,
        )
        self.spot_wasted_tokens = Counter(
            "llm_spot_wasted_decode_tokens",
            "Decoded tokens thrown away by spot preemptions (never served, or served and then "
            "regenerated), by reason.",
            ("node", "reason"),
            registry=target,
        )
        self.spot_triaged = Counter(
            "llm_spot_triaged_requests",
            "In-flight requests triaged by a drain, by decision (continue, abort).",
            ("node", "decision"),
            registry=target,
        )
        self.spot_interrupted = Counter(
            "llm_spot_interrupted_requests",
            "Requests a preemption interrupted, by whether the client can recover them.",
            ("node", "recoverable"),
            registry=target,
        )
        self.spot_retries = Counter(
            "llm_spot_retries",
            "Retries of interrupted requests: resumed after the prefix, regenerated, refused.",
            ("outcome",),
            registry=target,
        )
        self.spot_draining = Gauge(
            "llm_gateway_node_draining",
            "1 while this gateway holds a node's admission closed for a spot drain.",
            ("node",),
            registry=target,
        )
        for source in regions:
            self.upstream_healthy.labels(source).set(1)
            self.spot_draining.labels(source).set(0)
            for recoverable in ("true", "false"):
                self.spot_interrupted.labels(source, recoverable)
            for destination in regions:
                if source != destination:
                    for reason in REROUTE_REASONS:
                        self.reroutes.labels(source, destination, reason)
        if not created_series:
            registry.register(_WithoutCreated(target))


@dataclass
class _Health:
    consecutive_failures: int = 0
    unhealthy_until: float = 0.0


@dataclass
class _Failure:
    reason: str
    detail: str
    status: int | None = None
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class _Committed:
    response: UpstreamResponse
    chunks: AsyncIterator[bytes]
    first: bytes
    body: bytes | None  # the whole body when not streamed


@dataclass
class _Request:
    started: float
    method: str
    path: str
    query: str
    body: bytes
    headers: list[tuple[str, str]]
    model: str
    stream: bool
    strip_usage: bool
    payload: dict[str, Any] | None = None
    request_id: str = ""
    retry_safe: bool = True


@dataclass(eq=False)
class _Inflight:
    """One request in flight, as a drain sees it and aborts it."""

    request_id: str
    stream: bool
    retry_safe: bool
    max_tokens: int | None
    region: str = ""
    attempt: int = 1
    attempt_started: float = 0.0
    task: asyncio.Task[Any] | None = None  # the request's task while an attempt is pending
    response: UpstreamResponse | None = None
    tally: _StreamTally | None = None
    prefix_tokens: int = 0  # served to the client by earlier attempts (a resumed request)
    prefix_text: str = ""
    abort_reason: str | None = None
    ledgered: bool = False  # a ledger entry tracks this request

    def abort(self, reason: str) -> None:
        """Stop the attempt: cancel it before it commits, close its upstream stream after."""
        if self.abort_reason is not None:
            return
        self.abort_reason = reason
        if self.response is not None:
            self.response.abort()
        elif self.task is not None and not self.task.done():
            self.task.cancel()


@dataclass
class _Drain:
    """A node whose admission this gateway holds closed, and when that lapses."""

    node: str
    started: float
    budget_seconds: float
    until: float
    handle: asyncio.TimerHandle | None = None


class SpotDrainRequest(BaseModel):
    """`POST /admin/spot/drain`: close a node's admission and triage what runs on it."""

    model_config = ConfigDict(extra="forbid")
    node: str = Field(min_length=1, description="The upstream (node) to drain.")
    budget_seconds: float = Field(ge=0, le=86400, description="The drain budget.")
    continue_factor: float = Field(0.85, gt=0, le=1, description="Share of the budget usable.")
    close_seconds: float = Field(
        3600.0, gt=0, le=86400, description="Hold admission closed this long unless released."
    )
    reason: str = Field("spot preemption", max_length=500, description="Why (logged).")


class SpotReleaseRequest(BaseModel):
    """`POST /admin/spot/release`: admit requests to a node again."""

    model_config = ConfigDict(extra="forbid")
    node: str = Field(min_length=1, description="The upstream (node) to release.")


class _StreamTally:
    """Watches SSE events going by: usage, content chunks, first-token time."""

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.buffer = b""
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.content_chunks = 0
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.contents: list[bytes] = []  # raw JSON string bodies of the content served

    def feed(self, chunk: bytes) -> bytes:
        """Account for `chunk`; return the bytes to forward now (whole events only, so a stream
        can always be ended with an event of the gateway's own)."""
        self.buffer += chunk
        return self._consume()

    def served_text(self) -> str:
        """The content of every event forwarded so far."""
        parts = []
        for raw in self.contents:
            try:
                parts.append(json.loads(b'"' + raw + b'"'))
            except ValueError:
                continue
        return "".join(parts)

    def tpot(self) -> float | None:
        """Measured seconds per output token (None before two tokens)."""
        if self.content_chunks < 2 or self.first_token_at is None or self.last_token_at is None:
            return None
        return max(0.0, self.last_token_at - self.first_token_at) / (self.content_chunks - 1)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream."""
        rest, self.buffer = self.buffer, b""
        if rest.strip():
            self._inspect(rest)
        return rest

    def _consume(self) -> bytes:
        out = []
        position = 0
        for match in _EVENT_END.finditer(self.buffer):
            event = self.buffer[position : match.end()]
            position = match.end()
            if self._inspect(event):
                out.append(event)
        self.buffer = self.buffer[position:]
        return b"".join(out)

    def _inspect(self, event: bytes) -> bool:
        """Account for one event; False when it is the usage chunk to strip.

        Only events that carry a usage object are JSON-decoded; content chunks are recognised
        by their `"content":"<non-empty>` (or `"text":`) member, which cannot occur unescaped
        inside a JSON string, so streaming costs no JSON decoding per token."""
        keep = True
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data or data == b"[DONE]":
                continue
            contents = _CONTENT_MEMBER.findall(data)
            if contents:
                self.content_chunks += len(contents)
                self.contents.extend(contents)
                self.last_token_at = time.perf_counter()
                if self.first_token_at is None:
                    self.first_token_at = self.last_token_at
            if _USAGE_MEMBER.search(data) is None:
                continue
            try:
                payload = json.loads(data)
            except ValueError:
                continue
            usage = payload.get("usage") if isinstance(payload, dict) else None
            if not isinstance(usage, dict):
                continue
            self.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            self.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            if self.strip_usage and payload.get("choices") == []:
                keep = False
        return keep


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _openai_error(status: int, message: str, kind: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


class Gateway:
    """The proxy: routing state, region health, the upstream client and the metrics."""

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.regions = list(settings.upstreams)
        self.routing = RoutingState()
        self.routing_store_up = False
        self.health = {region: _Health() for region in self.regions}
        self.models_seen: set[str] = set()
        self.inflight: set[_Inflight] = set()
        self.draining: dict[str, _Drain] = {}
        self.revisions: dict[tuple[str, str], str] = {}  # (region, model) -> last version seen
        self.node_tpot: dict[str, float] = {}
        self._turn = 0
        self._pools: dict[str, UpstreamPool] = {}
        self._reader: AsyncRoutingReader | None = None
        self._ledger: AsyncRequestLedger | None = None

    async def start(self) -> None:
        """Open the upstream pools, the routing reader and the ledger; read the routing once."""
        s = self.settings
        self._pools = {
            region: UpstreamPool(
                url,
                connect_timeout=s.connect_timeout_seconds,
                read_timeout=s.request_timeout_seconds,
                max_idle=s.max_connections,
            )
            for region, url in s.upstreams.items()
        }
        self._reader = AsyncRoutingReader.from_url(
            s.redis_url, s.routing_key_prefix, s.redis_timeout_seconds
        )
        self._ledger = AsyncRequestLedger.from_url(
            s.redis_url,
            s.ledger_key_prefix,
            s.ledger_ttl_seconds,
            max(0.5, s.redis_timeout_seconds),
        )
        await self.refresh_routing()

    async def stop(self) -> None:
        """Close the connection pool, the reader and the ledger."""
        for drain in self.draining.values():
            if drain.handle is not None:
                drain.handle.cancel()
        for pool in self._pools.values():
            await pool.aclose()
        self._pools = {}
        if self._reader is not None:
            await self._reader.aclose()
            self._reader = None
        if self._ledger is not None:
            await self._ledger.aclose()
            self._ledger = None

    async def refresh_routing(self) -> None:
        """Read the routing state; on any Redis failure use the configured order."""
        if self._reader is None:
            return
        try:
            state = await self._reader.fetch_state(self.regions)
        except (redis.exceptions.RedisError, OSError, RoutingError) as exc:
            if self.routing_store_up:
                log.warning("routing store unreachable, using the configured order: %s", exc)
            self.routing = RoutingState()
            self.routing_store_up = False
        else:
            if not self.routing_store_up:
                log.info("routing store reachable")
            self.routing = state
            self.routing_store_up = True
        self.metrics.routing_store_up.set(1 if self.routing_store_up else 0)
        now = time.monotonic()
        for region in self.regions:
            self.metrics.upstream_healthy.labels(region).set(
                0 if self._unhealthy(region, now) else 1
            )
        for node, drain in list(self.draining.items()):
            if drain.until <= now:
                self._release(node)

    async def refresh_forever(self) -> None:
        """Refresh the routing state every `routing_refresh_seconds` until cancelled."""
        while True:
            await asyncio.sleep(self.settings.routing_refresh_seconds)
            await self.refresh_routing()

    def _unhealthy(self, region: str, now: float) -> bool:
        return now < self.health[region].unhealthy_until

    def order(self) -> list[str]:
        """Regions in the order this request tries them."""
        now = time.monotonic()
        unhealthy = frozenset(r for r in self.regions if self._unhealthy(r, now))
        routing = self.routing
        if self.draining:
            draining = frozenset(n for n, d in self.draining.items() if d.until > now)
            routing = RoutingState(routing.override, routing.closed | draining)
        order = build_region_order(self.regions, routing, unhealthy)
        if self.settings.balance == "failover" and not self.settings.spill_regions:
            return order
        return self._balance(order, routing, routing.closed | unhealthy)

    def _balance(
        self, order: list[str], routing: RoutingState, blocked: frozenset[str]
    ) -> list[str]:
        """Round robin over the open non-spill upstreams, then open spill ones, then the rest."""
        target = routing.override.target_region if routing.override else None
        head = [target] if target in order and target not in blocked else []
        rest = [r for r in order if r not in head]
        spill = self.settings.spill_regions
        primary = [r for r in rest if r not in blocked and r not in spill]
        if self.settings.balance == "round_robin" and len(primary) > 1:
            self._turn += 1
            turn = self._turn % len(primary)
            primary = primary[turn:] + primary[:turn]
        spare = [r for r in rest if r not in blocked and r in spill]
        return head + primary + spare + [r for r in rest if r in blocked]

    def _failed(self, region: str) -> None:
        health = self.health[region]
        health.consecutive_failures += 1
        threshold = self.settings.unhealthy_after_failures
        if threshold and health.consecutive_failures >= threshold:
            health.unhealthy_until = time.monotonic() + self.settings.unhealthy_cooldown_seconds

    def _succeeded(self, region: str) -> None:
        health = self.health[region]
        health.consecutive_failures = 0
        health.unhealthy_until = 0.0

    def model_label(self, model: str) -> str:
        """`model` as a label value, bounded so clients cannot explode the series count."""
        if model in self.models_seen:
            return model
        if len(self.models_seen) < self.settings.max_model_labels:
            self.models_seen.add(model)
            return model
        return "other"

    def record(
        self,
        req: _Request,
        region: str,
        served: str,
        rerouted: bool,
        version: str,
        status: int,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        first_token_at: float | None = None,
    ) -> None:
        """Observe one finished request in every series."""
        m = self.metrics
        model = self.model_label(req.model)
        labels = (region, served, "true" if rerouted else "false", model, version, str(status))
        m.duration.labels(*labels).observe(time.perf_counter() - req.started)
        m.requests.labels(*labels).inc()
        errors = m.errors.labels(*labels)  # created at 0 so error ratios are never absent
        if status >= 500:
            errors.inc()
        if prompt_tokens is not None or completion_tokens is not None:
            tokens = (served, model, version)
            m.prompt_tokens.labels(*tokens).inc(prompt_tokens or 0)
            m.generated_tokens.labels(*tokens).inc(completion_tokens or 0)
        if first_token_at is not None:
            m.ttft.labels(served, model, version).observe(first_token_at - req.started)

    # ---- spot drains -------------------------------------------------------------------------

    def drain(self, order: SpotDrainRequest) -> dict[str, Any]:
        """Close a node's admission here and now, triage its in-flight requests, abort the ones
        that cannot finish within the budget, and abort the rest when the budget is spent."""
        node = order.node
        now = time.monotonic()
        previous = self.draining.get(node)
        if previous is not None and previous.handle is not None:
            previous.handle.cancel()
        drain = _Drain(node, now, order.budget_seconds, now + order.close_seconds)
        self.draining[node] = drain
        self.metrics.spot_draining.labels(node).set(1)
        running = [r for r in self.inflight if r.region == node and r.abort_reason is None]
        views = [self._view(r) for r in running]
        decisions = build_triage(
            views,
            order.budget_seconds,
            order.continue_factor,
            self.node_tpot.get(node, self.settings.spot_default_tpot_seconds),
            self.settings.spot_unknown_remaining_tokens,
        )
        for decision, request in zip(decisions, running, strict=True):
            self.metrics.spot_triaged.labels(node, decision.action).inc()
            if decision.action == "abort":
                request.abort(
                    f"triage: {decision.estimated_seconds:.3g} s left > "
                    f"{decision.limit_seconds:.3g} s usable"
                )
        ratio = aborted_ratio(decisions)
        self.metrics.spot_aborted_ratio.labels(node).set(ratio)
        loop = asyncio.get_running_loop()
        drain.handle = loop.call_later(order.budget_seconds, self._budget_spent, node, drain)
        log.warning(
            "spot drain of %s (%s): budget %.3g s, %d in flight, %d aborted",
            node,
            order.reason,
            order.budget_seconds,
            len(decisions),
            sum(1 for d in decisions if d.action == "abort"),
        )
        return {
            "node": node,
            "budget_seconds": order.budget_seconds,
            "continue_factor": order.continue_factor,
            "inflight": len(decisions),
            "continued": sum(1 for d in decisions if d.action == "continue"),
            "aborted": sum(1 for d in decisions if d.action == "abort"),
            "aborted_ratio": ratio,
            "decisions": [d.as_dict() for d in decisions],
        }

    def _view(self, request: _Inflight) -> InflightView:
        tpot = self.node_tpot.get(request.region, self.settings.spot_default_tpot_seconds)
        if request.stream and request.tally is not None:
            generated = request.tally.content_chunks
            tpot = request.tally.tpot() or tpot
        else:
            # A non-streamed answer is invisible until done: estimate from the time it ran.
            generated = int(max(0.0, time.perf_counter() - request.attempt_started) / tpot)
        max_tokens = request.max_tokens
        if max_tokens is not None:
            max_tokens = max(0, max_tokens - request.prefix_tokens)
            generated = min(generated, max_tokens)
        return InflightView(
            request.request_id, generated, max_tokens, tpot, request.stream, request.retry_safe
        )

    def _budget_spent(self, node: str, drain: _Drain) -> None:
        if self.draining.get(node) is not drain:
            return
        for request in list(self.inflight):
            if request.region == node:
                request.abort("drain budget spent")

    def _release(self, node: str) -> bool:
        drain = self.draining.pop(node, None)
        if drain is None:
            return False
        if drain.handle is not None:
            drain.handle.cancel()
        self.metrics.spot_draining.labels(node).set(0)
        return True

    def release(self, node: str) -> bool:
        """Admit requests to `node` again (its replacement is ready); True if it was drained."""
        return self._release(node)

    def node_status(self, node: str) -> dict[str, Any]:
        """A node's drain state and what is still in flight on it."""
        drain = self.draining.get(node)
        now = time.monotonic()
        return {
            "node": node,
            "draining": drain is not None and drain.until > now,
            "inflight": sum(1 for r in self.inflight if r.region == node),
            "closed_for_seconds": None if drain is None else round(max(0.0, drain.until - now), 3),
        }

    def _is_draining(self, node: str) -> bool:
        drain = self.draining.get(node)
        return drain is not None and drain.until > time.monotonic()

    def _wasted(self, node: str, reason: str, tokens: int) -> None:
        if tokens > 0:
            self.metrics.spot_wasted_tokens.labels(node, reason).inc(tokens)

    # ---- requests ----------------------------------------------------------------------------

    async def handle(self, request: Request, record: bool = True) -> Response:
        """Proxy one request with reroute; record it when `record`."""
        started = time.perf_counter()
        body = await _read_body(request, self.settings.max_body_bytes)
        if body is None:
            return self._reject(
                started, 413, f"request body exceeds {self.settings.max_body_bytes} bytes", record
            )
        req = _Request(
            started=started,
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            body=body,
            headers=[(k, v) for k, v in request.headers.items() if k not in _HOP_BY_HOP],
            model="unknown",
            stream=False,
            strip_usage=False,
        )
        if request.method == "POST":
            problem = self._inspect_body(req)
            if problem is not None:
                return self._reject(started, 400, problem, record)
        resume = request.headers.get(RESUME_HEADER)
        client_id = request.headers.get(REQUEST_ID_HEADER)
        req.request_id = (resume or client_id or uuid.uuid4().hex)[:128]
        if client_id is None:
            req.headers.append((REQUEST_ID_HEADER, req.request_id))
        elif client_id != req.request_id:
            req.headers = [(k, v) for k, v in req.headers if k != REQUEST_ID_HEADER]
            req.headers.append((REQUEST_ID_HEADER, req.request_id))
        inflight = _Inflight(req.request_id, req.stream, True, None)
        if req.payload is not None:
            req.retry_safe = is_retry_safe(req.payload, request.headers.get(RETRY_SAFE_HEADER))
            inflight.retry_safe = req.retry_safe
            inflight.max_tokens = requested_max_tokens(req.payload)
        entry: LedgerEntry | None = None
        if resume is not None:
            claimed = await self._claim_resume(req, resume, inflight, started, record)
            if isinstance(claimed, Response):
                return claimed
            entry = claimed
        elif not req.retry_safe and client_id is not None and req.payload is not None:
            refused = await self._claim_once(req, started, record)
            if refused is not None:
                return refused
        self.inflight.add(inflight)
        try:
            return await self._route(req, inflight, entry, record)
        finally:
            if not inflight.stream or inflight.response is None:
                self.inflight.discard(inflight)

    async def _claim_resume(
        self, req: _Request, resume: str, inflight: _Inflight, started: float, record: bool
    ) -> LedgerEntry | Response:
        """The ledger entry a resumed request continues, claimed; or the refusal to answer."""
        if req.payload is None or self._ledger is None:
            return self._reject(started, 400, f"{RESUME_HEADER} needs a JSON request", record)
        try:
            entry = await self._ledger.get(resume)
            if entry is None:
                return self._refuse(
                    started,
                    404,
                    f"no interrupted request {resume!r} to resume",
                    "SPOT_RESUME_UNKNOWN",
                    record,
                )
            if entry.prompt_fingerprint != build_prompt_fingerprint(req.payload):
                return self._refuse(
                    started,
                    409,
                    f"request {resume!r} was a different request (its prompt "
                    "fingerprint does not match)",
                    "SPOT_RESUME_MISMATCH",
                    record,
                )
            attempt = await self._ledger.claim_retry(resume, time.time())
        except LedgerError as exc:
            return self._refuse(
                started,
                503,
                f"the request ledger is unavailable: {exc}",
                "SPOT_LEDGER_UNAVAILABLE",
                record,
            )
        if attempt == CLAIM_NOT_RETRY_SAFE:
            self.metrics.spot_retries.labels("refused").inc()
            return self._refuse(
                started,
                409,
                f"request {resume!r} is not retry-safe: it ran once and will not run again",
                "SPOT_NOT_RETRY_SAFE",
                record,
            )
        if attempt in (CLAIM_NOT_INTERRUPTED, CLAIM_NOT_FOUND):
            self.metrics.spot_retries.labels("refused").inc()
            return self._refuse(
                started,
                409,
                f"request {resume!r} is not interrupted (status "
                f"{entry.status}): it is being retried or is complete",
                "SPOT_RESUME_CONFLICT",
                record,
            )
        inflight.attempt = attempt
        inflight.ledgered = True
        inflight.retry_safe = entry.retry_safe
        if entry.max_tokens is not None:
            inflight.max_tokens = entry.max_tokens
        return entry

    async def _claim_once(self, req: _Request, started: float, record: bool) -> Response | None:
        """Claim a non-retry-safe request id in the ledger; the refusal when it was seen."""
        assert req.payload is not None and self._ledger is not None
        entry = LedgerEntry(
            request_id=req.request_id,
            attempt=1,
            served_prefix_tokens=0,
            model_revision="unknown",
            prompt_fingerprint=build_prompt_fingerprint(req.payload),
            retry_safe=False,
            interruption_reason="",
            status="running",
            max_tokens=requested_max_tokens(req.payload),
            updated_at=time.time(),
        )
        try:
            first = await self._ledger.claim_once(entry)
        except LedgerError as exc:
            return self._refuse(
                started,
                503,
                "the request ledger is unavailable, so a request "
                f"that is not retry-safe cannot be run at most once: {exc}",
                "SPOT_LEDGER_UNAVAILABLE",
                record,
            )
        if not first:
            return self._refuse(
                started,
                409,
                f"request {req.request_id!r} is not retry-safe and "
                "was already received: it is not run twice",
                "SPOT_NOT_RETRY_SAFE",
                record,
            )
        return None

    def _refuse(
        self, started: float, status: int, message: str, kind: str, record: bool
    ) -> Response:
        if record:
            req = _Request(started, "", "", "", b"", [], "unknown", False, False)
            self.record(req, "none", "none", False, "unknown", status)
        return _openai_error(status, message, kind)

    async def _route(
        self, req: _Request, inflight: _Inflight, entry: LedgerEntry | None, record: bool
    ) -> Response:
        order = self.order()
        if entry is not None and entry.node in order:
            order.remove(entry.node)  # never back to the replica that was preempted
            order.append(entry.node)
        failures: list[str] = []
        last_failure: _Failure | None = None
        for index, region in enumerate(order):
            last = index == len(order) - 1
            budget = None if last else self.settings.first_byte_budget_seconds
            if self.settings.first_byte_budget_streaming_only and not req.stream:
                budget = None
            resumed = False
            body = None
            if entry is not None:
                body = self._resume_body(req, entry, region)
                resumed = body is not None
            outcome = await self._attempt_tracked(req, inflight, region, budget, body)
            if isinstance(outcome, _Committed) and resumed:
                version = outcome.response.header(MODEL_VERSION_HEADER, "unknown")
                if version != entry.model_revision:  # type: ignore[union-attr]
                    # Another revision cannot continue this prefix: regenerate instead.
                    await outcome.response.aclose()
                    resumed = False
                    outcome = await self._attempt_tracked(req, inflight, region, budget, None)
            if isinstance(outcome, _Committed):
                self._succeeded(region)
                version = outcome.response.header(MODEL_VERSION_HEADER, "unknown")[:128]
                self.revisions[(region, req.model)] = version
                if entry is not None:
                    # Nothing was served before: a fresh run is exactly the rest of it.
                    resumed = resumed or entry.served_prefix_tokens == 0
                    self._count_retry(entry, resumed, inflight)
                return await self._respond(
                    req, order[0], region, index > 0, outcome, record, inflight, resumed
                )
            self._failed(region)
            failures.append(f"{region}: {outcome.detail}")
            last_failure = outcome
            spot = outcome.reason == "spot_preemption"
            if spot:
                # Whatever it decoded before the abort never reached the client.
                self._wasted(region, "aborted_unserved", self._view(inflight).generated_tokens)
            if not req.retry_safe and outcome.reason != "connect_error":
                # It may have run: a request that is not retry-safe never runs twice.
                if spot:
                    self.metrics.spot_interrupted.labels(region, "false").inc()
                    return self._spot_refusal(req, order[0], region, index > 0, inflight, record)
                break
            if spot:
                self.metrics.spot_interrupted.labels(region, "true").inc()
                self.metrics.spot_retries.labels("regenerated").inc()
                inflight.attempt += 1
            if not last:
                reason = outcome.reason if outcome.reason in REROUTE_REASONS else "upstream_error"
                self.metrics.reroutes.labels(region, order[index + 1], reason).inc()
                log.info("reroute %s -> %s: %s", region, order[index + 1], outcome.detail)
        assert last_failure is not None
        served = order[len(failures) - 1]
        rerouted = len(failures) > 1
        if last_failure.status is not None:
            # The last region answered with a 5xx: the client gets that answer as it was.
            if record:
                self.record(req, order[0], served, rerouted, "unknown", last_failure.status)
            headers = _back_headers(last_failure.headers, served, rerouted)
            return Response(last_failure.body, last_failure.status, headers=headers)
        status = 504 if last_failure.reason in ("timeout", "first_byte_budget") else 502
        if record:
            self.record(req, order[0], served, rerouted, "unknown", status)
        return _openai_error(
            status, "no upstream region answered: " + "; ".join(failures), "UpstreamError"
        )

    def _resume_body(self, req: _Request, entry: LedgerEntry, region: str) -> bytes | None:
        """The body that continues `entry`'s prefix on `region`, or None to regenerate."""
        if entry.served_prefix_tokens <= 0 or entry.model_revision == "unknown":
            return None
        known = self.revisions.get((region, req.model))
        if known is not None and known != entry.model_revision:
            return None
        assert req.payload is not None
        payload = build_resume_payload(req.payload, entry.served_prefix, entry.served_prefix_tokens)
        return None if payload is None else json.dumps(payload, separators=(",", ":")).encode()

    def _count_retry(self, entry: LedgerEntry, resumed: bool, inflight: _Inflight) -> None:
        if resumed:
            self.metrics.spot_retries.labels("resumed").inc()
            inflight.prefix_tokens = entry.served_prefix_tokens
            inflight.prefix_text = entry.served_prefix
        else:
            self.metrics.spot_retries.labels("regenerated").inc()
            # What the client was served before is discarded: those tokens were decoded twice.
            self._wasted(entry.node or "unknown", "regenerated", entry.served_prefix_tokens)

    def _spot_refusal(
        self,
        req: _Request,
        region: str,
        served: str,
        rerouted: bool,
        inflight: _Inflight,
        record: bool,
    ) -> Response:
        error = build_spot_error(
            req.request_id,
            served,
            inflight.attempt,
            0,
            False,
            False,
            self.settings.spot_retry_after_ms,
            inflight.abort_reason or "preempted",
        )
        if record:
            self.record(req, region, served, rerouted, "unknown", 503)
        return JSONResponse(error, status_code=503, headers={REQUEST_ID_HEADER: req.request_id})

    async def _attempt_tracked(
        self,
        req: _Request,
        inflight: _Inflight,
        region: str,
        budget: float | None,
        body: bytes | None,
    ) -> _Committed | _Failure:
        """One attempt that a drain of `region` can abort."""
        inflight.region = region
        inflight.attempt_started = time.perf_counter()
        inflight.abort_reason = None
        # A drain cancels this very task while it waits for the attempt (no task of its own per
        # attempt: that would cost every request), and the cancellation is taken back here.
        task = asyncio.current_task()
        inflight.task = task
        try:
            outcome = await self._attempt(req, region, budget, body)
        except asyncio.CancelledError:
            if inflight.abort_reason is None or task is None or task.cancelling() != 1:
                raise
            task.uncancel()
            return _Failure("spot_preemption", f"aborted by a spot drain: {inflight.abort_reason}")
        finally:
            inflight.task = None
        if isinstance(outcome, _Committed) and outcome.body is None:
            inflight.response = outcome.response
            if inflight.abort_reason is not None:
                outcome.response.abort()  # aborted while committing: the relay ends it
        return outcome

    def _reject(self, started: float, status: int, message: str, record: bool) -> Response:
        if record:
            req = _Request(started, "", "", "", b"", [], "unknown", False, False)
            self.record(req, "none", "none", False, "unknown", status)
        return _openai_error(status, message, "BadRequestError")

    def _inspect_body(self, req: _Request) -> str | None:
        """Read model and stream flags; maybe ask for usage. A problem message, or None."""
        try:
            payload = json.loads(req.body)
        except ValueError as exc:
            return f"request body is not valid JSON: {exc}"
        if not isinstance(payload, dict):
            return "request body must be a JSON object"
        req.payload = payload
        model = payload.get("model")
        if isinstance(model, str) and model:
            req.model = model[:200]
        req.stream = payload.get("stream") is True
        if req.stream and self.settings.inject_stream_usage:
            options = payload.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if options.get("include_usage") is not True:
                upstream = {**payload, "stream_options": {**options, "include_usage": True}}
                req.body = json.dumps(upstream, separators=(",", ":")).encode()
                req.strip_usage = True
        return None

    async def _attempt(
        self, req: _Request, region: str, budget: float | None, body: bytes | None = None
    ) -> _Committed | _Failure:
        target = req.path + ("?" + req.query if req.query else "")
        response: UpstreamResponse | None = None
        committed = False
        try:
            async with asyncio.timeout(budget):
                response = await self._pools[region].request(
                    req.method, target, req.headers, req.body if body is None else body
                )
                if response.status >= 500:
                    error_body = await response.read()
                    return _Failure(
                        "server_error",
                        f"HTTP {response.status}",
                        response.status,
                        error_body,
                        response.headers,
                    )
                chunks = response.chunks()
                first = await anext(chunks, b"")
            if _is_event_stream(response):
                committed = True
                return _Committed(response, chunks, first, None)
            parts = [first]
            async for chunk in chunks:
                parts.append(chunk)
            return _Committed(response, chunks, first, b"".join(parts))
        except TimeoutError:
            return _Failure("first_byte_budget", f"no first byte within {budget:g} s")
        except UpstreamConnectError as exc:
            return _Failure("connect_error", f"connect error: {exc}")
        except UpstreamTimeoutError as exc:
            return _Failure("timeout", str(exc))
        except UpstreamError as exc:
            return _Failure("upstream_error", f"{type(exc).__name__}: {exc}")
        finally:
            # Everything but a committed stream is finished with its connection here.
            if response is not None and not committed:
                await response.aclose()

    async def _respond(
        self,
        req: _Request,
        region: str,
        served: str,
        rerouted: bool,
        outcome: _Committed,
        record: bool,
        inflight: _Inflight,
        resumed: bool,
    ) -> Response:
        response = outcome.response
        version = response.header(MODEL_VERSION_HEADER, "unknown")[:128]
        headers = _back_headers(response.headers, served, rerouted)
        headers[REQUEST_ID_HEADER] = req.request_id
        if inflight.attempt > 1:
            headers[ATTEMPT_HEADER] = str(inflight.attempt)
            headers[RESUMED_HEADER] = "true" if resumed else "false"
        if outcome.body is not None:
            if record:
                prompt, completion = _usage(outcome.body, response)
                self.record(
                    req, region, served, rerouted, version, response.status, prompt, completion
                )
            if inflight.ledgered:
                await self._ledger_status(req.request_id, "completed")
            return Response(outcome.body, response.status, headers=headers)
        return StreamingResponse(
            self._relay(req, region, served, rerouted, version, outcome, record, inflight),
            status_code=response.status,
            headers=headers,
        )

    async def _ledger_status(self, request_id: str, status: str) -> None:
        if self._ledger is None:
            return
        try:
            await self._ledger.set_status(request_id, status, time.time())
        except LedgerError as exc:
            log.warning("ledger: %s: %s", request_id, exc)

    async def _relay(
        self,
        req: _Request,
        region: str,
        served: str,
        rerouted: bool,
        version: str,
        outcome: _Committed,
        record: bool,
        inflight: _Inflight,
    ) -> AsyncIterator[bytes]:
        tally = _StreamTally(req.strip_usage)
        inflight.tally = tally
        status = outcome.response.status
        finished = False
        try:
            out = tally.feed(outcome.first)
            if out:
                yield out
            async for chunk in outcome.chunks:
                out = tally.feed(chunk)
                if out:
                    yield out
            rest = tally.flush()
            if rest:
                yield rest
            finished = True
            if inflight.ledgered:
                await self._ledger_status(req.request_id, "completed")
        except UpstreamError as exc:
            finished = True
            if inflight.abort_reason is None and not self._is_draining(served):
                status = 502
                # Re-raised so the server drops the client connection without ending the chunked
                # body: the client must see a broken stream, not a clean end without [DONE].
                raise StreamCutError(f"stream from {served} cut: {exc}") from exc
            status = 503
            yield await self._interrupt(req, served, version, tally, inflight)
        finally:
            self.inflight.discard(inflight)
            if not finished:
                status = 499  # the client went away
            elif status == 200 and tally.content_chunks >= 2:
                tpot = tally.tpot()
                if tpot is not None:
                    old = self.node_tpot.get(served)
                    self.node_tpot[served] = tpot if old is None else 0.8 * old + 0.2 * tpot
            if record:
                completion = tally.completion_tokens
                if completion is None and tally.content_chunks:
                    completion = tally.content_chunks
                self.record(
                    req,
                    region,
                    served,
                    rerouted,
                    version,
                    status,
                    tally.prompt_tokens,
                    completion,
                    tally.first_token_at,
                )
            await outcome.response.aclose()

    async def _interrupt(
        self,
        req: _Request,
        node: str,
        version: str,
        tally: _StreamTally,
        inflight: _Inflight,
    ) -> bytes:
        """Ledger the interrupted stream and build the error event that ends it."""
        reason = inflight.abort_reason or "the draining node went away"
        served = inflight.prefix_tokens + tally.content_chunks
        prefix = inflight.prefix_text + tally.served_text()
        resumable = False
        recoverable = inflight.retry_safe
        if req.payload is not None and self._ledger is not None:
            entry = LedgerEntry(
                request_id=req.request_id,
                attempt=inflight.attempt,
                served_prefix_tokens=served,
                model_revision=version,
                prompt_fingerprint=build_prompt_fingerprint(req.payload),
                retry_safe=inflight.retry_safe,
                interruption_reason=f"{SPOT_ERROR_TYPE}: {reason}",
                status="interrupted",
                node=node,
                served_prefix=prefix,
                max_tokens=inflight.max_tokens,
                updated_at=time.time(),
            )
            try:
                await self._ledger.put(entry)
            except LedgerError as exc:
                log.warning("ledger: %s: %s", req.request_id, exc)
                recoverable = False
            else:
                resumable = recoverable and served > 0 and version != "unknown"
        else:
            recoverable = False
        if not recoverable:
            self._wasted(node, "not_recoverable", served)
        self.metrics.spot_interrupted.labels(node, "true" if recoverable else "false").inc()
        error = build_spot_error(
            req.request_id,
            node,
            inflight.attempt,
            served,
            recoverable,
            resumable,
            self.settings.spot_retry_after_ms,
            reason,
        )
        return render_sse_error(error)


def _is_event_stream(response: UpstreamResponse) -> bool:
    return response.header("content-type").startswith("text/event-stream")


def _usage(body: bytes, response: UpstreamResponse) -> tuple[int | None, int | None]:
    if response.status >= 300 or "json" not in response.header("content-type"):
        return None, None
    try:
        usage = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        return None, None
    if not isinstance(usage, dict):
        return None, None
    return _int_or_none(usage.get("prompt_tokens")), _int_or_none(usage.get("completion_tokens"))


def _back_headers(upstream: list[tuple[str, str]], served: str, rerouted: bool) -> dict[str, str]:
    headers = {k: v for k, v in upstream if k.lower() not in _NOT_FORWARDED_BACK}
    headers[SERVED_REGION_HEADER] = served
    headers[REROUTED_HEADER] = "true" if rerouted else "false"
    return headers


async def _parse_admin(request: Request, model: type[_M]) -> _M | Response:
    """An admin request body validated by `model`, or a 400/422 naming the problem."""
    try:
        data = json.loads(await request.body())
    except ValueError as exc:
        return _openai_error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(data, dict):
        return _openai_error(400, "request body must be a JSON object", "BadRequestError")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return _openai_error(422, problems, "BadRequestError")


async def _read_body(request: Request, limit: int) -> bytes | None:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    parts = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)


def build_gateway_app(
    settings: GatewaySettings, spec: Spec, registry: CollectorRegistry | None = None
) -> FastAPI:
    """The gateway's ASGI app; its metrics go to `registry` (a new one when None)."""
    if not settings.upstreams:
        raise GatewayConfigError(
            "upstreams: no upstream configured; give at least one region -> base URL "
            "(e.g. --upstream primary=http://127.0.0.1:8000)"
        )
    unknown = [r for r in settings.upstreams if r not in spec.regions]
    if unknown:
        log.warning(
            "upstream regions %s are not in the spec's regions (%s)",
            ", ".join(unknown),
            ", ".join(spec.regions),
        )
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    metrics = GatewayMetrics(
        registry, spec.sources.histogram_buckets, list(settings.upstreams), settings.created_series
    )
    gateway = Gateway(settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        refresher = asyncio.create_task(gateway.refresh_forever(), name="routing-refresh")
        try:
            yield
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            await gateway.stop()

    app = FastAPI(title="redline gateway", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.gateway = gateway
    app.state.registry = registry
    try:
        secret = read_secret(settings.admin_token_file, None, "gateway admin token")
    except SettingsError as exc:
        raise GatewayConfigError(str(exc)) from None
    admin_token = None if secret is None else secret.get_secret_value()

    def admin_refusal(request: Request, node: str | None) -> Response | None:
        if admin_token is not None:
            presented = request.headers.get("authorization", "")
            expected = f"Bearer {admin_token}"
            if not hmac.compare_digest(presented.encode(), expected.encode()):
                return _openai_error(401, "missing or wrong bearer token", "AuthenticationError")
        if node is not None and node not in gateway.regions:
            return _openai_error(
                404,
                f"unknown node {node!r}; upstreams: {', '.join(gateway.regions)}",
                "NotFoundError",
            )
        return None

    @app.post("/admin/spot/drain")
    async def spot_drain(request: Request) -> Response:
        parsed = await _parse_admin(request, SpotDrainRequest)
        if isinstance(parsed, Response):
            return admin_refusal(request, None) or parsed
        refused = admin_refusal(request, parsed.node)
        if refused is not None:
            return refused
        return JSONResponse(gateway.drain(parsed))

    @app.post("/admin/spot/release")
    async def spot_release(request: Request) -> Response:
        parsed = await _parse_admin(request, SpotReleaseRequest)
        if isinstance(parsed, Response):
            return admin_refusal(request, None) or parsed
        refused = admin_refusal(request, parsed.node)
        if refused is not None:
            return refused
        return JSONResponse({"node": parsed.node, "released": gateway.release(parsed.node)})

    @app.get("/admin/spot/nodes/{node}")
    async def spot_node(node: str, request: Request) -> Response:
        refused = admin_refusal(request, node)
        if refused is not None:
            return refused
        return JSONResponse(gateway.node_status(node))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await gateway.handle(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await gateway.handle(request)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await gateway.handle(request, record=False)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        override = gateway.routing.override
        return {
            "status": "ok",
            "order": gateway.order(),
            "routing_store_up": gateway.routing_store_up,
            "override": None if override is None else override.target_region,
            "closed": sorted(gateway.routing.closed),
            "unhealthy": [r for r in gateway.regions if gateway._unhealthy(r, time.monotonic())],
            "draining": sorted(n for n in gateway.draining if gateway._is_draining(n)),
        }

    return app
