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

Upstream calls go through `redline.exporters.upstream`, a lean asyncio HTTP/1.1 keep-alive
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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.metrics import Counter, Gauge, Histogram
from prometheus_client.registry import Collector
from pydantic import Field, field_validator

from redline.exporters.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
)
from redline.platform.golden import MODEL_VERSION_HEADER
from redline.platform.routing import (
    DEFAULT_PREFIX,
    AsyncRoutingReader,
    RoutingError,
    RoutingState,
    build_region_order,
)
from redline.settings import ServiceSettings
from redline.slo.spec import Spec

log = logging.getLogger(__name__)

DEFAULT_GATEWAY_PORT = 8080
SERVED_REGION_HEADER = "x-redline-served-region"
REROUTED_HEADER = "x-redline-rerouted"
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
_CONTENT_MEMBER = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')
_USAGE_MEMBER = re.compile(rb'"usage"\s*:\s*\{')
_REGION = re.compile(r"^[a-z][a-z0-9-]*$")


class StreamCutError(Exception):
    """An upstream stream broke after its first bytes were forwarded; the client's is aborted."""


class GatewayConfigError(Exception):
    """The gateway cannot start with these settings (e.g. no upstreams)."""


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
        for source in regions:
            self.upstream_healthy.labels(source).set(1)
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


class _StreamTally:
    """Watches SSE events going by: usage, content chunks, first-token time."""

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.buffer = b""
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.content_chunks = 0
        self.first_token_at: float | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Account for `chunk`; return the bytes to forward now."""
        self.buffer += chunk
        if not self.strip_usage:
            self._consume(forward=False)
            return chunk
        return self._consume(forward=True)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream."""
        rest, self.buffer = self.buffer, b""
        if rest.strip():
            self._inspect(rest)
        return rest

    def _consume(self, forward: bool) -> bytes:
        out = []
        position = 0
        for match in _EVENT_END.finditer(self.buffer):
            event = self.buffer[position : match.end()]
            position = match.end()
            keep = self._inspect(event)
            if forward and keep:
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
            contents = len(_CONTENT_MEMBER.findall(data))
            if contents:
                self.content_chunks += contents
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
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
        self._pools: dict[str, UpstreamPool] = {}
        self._reader: AsyncRoutingReader | None = None

    async def start(self) -> None:
        """Open the upstream pools and the routing reader; read the routing state once."""
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
        await self.refresh_routing()

    async def stop(self) -> None:
        """Close the connection pool and the reader."""
        for pool in self._pools.values():
            await pool.aclose()
        self._pools = {}
        if self._reader is not None:
            await self._reader.aclose()
            self._reader = None

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
        return build_region_order(self.regions, self.routing, unhealthy)

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
        order = self.order()
        failures: list[str] = []
        last_failure: _Failure | None = None
        for index, region in enumerate(order):
            last = index == len(order) - 1
            budget = None if last else self.settings.first_byte_budget_seconds
            if self.settings.first_byte_budget_streaming_only and not req.stream:
                budget = None
            outcome = await self._attempt(req, region, budget)
            if isinstance(outcome, _Committed):
                self._succeeded(region)
                return await self._respond(req, order[0], region, index > 0, outcome, record)
            self._failed(region)
            failures.append(f"{region}: {outcome.detail}")
            last_failure = outcome
            if not last:
                self.metrics.reroutes.labels(region, order[index + 1], outcome.reason).inc()
                log.info("reroute %s -> %s: %s", region, order[index + 1], outcome.detail)
        assert last_failure is not None
        served = order[-1]
        if last_failure.status is not None:
            # The last region answered with a 5xx: the client gets that answer as it was.
            if record:
                self.record(req, order[0], served, len(order) > 1, "unknown", last_failure.status)
            headers = _back_headers(last_failure.headers, served, len(order) > 1)
            return Response(last_failure.body, last_failure.status, headers=headers)
        status = 504 if last_failure.reason in ("timeout", "first_byte_budget") else 502
        if record:
            self.record(req, order[0], served, len(order) > 1, "unknown", status)
        return _openai_error(
            status, "no upstream region answered: " + "; ".join(failures), "UpstreamError"
        )

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
        model = payload.get("model")
        if isinstance(model, str) and model:
            req.model = model[:200]
        req.stream = payload.get("stream") is True
        if req.stream and self.settings.inject_stream_usage:
            options = payload.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if options.get("include_usage") is not True:
                payload["stream_options"] = {**options, "include_usage": True}
                req.body = json.dumps(payload, separators=(",", ":")).encode()
                req.strip_usage = True
        return None

    async def _attempt(
        self, req: _Request, region: str, budget: float | None
    ) -> _Committed | _Failure:
        target = req.path + ("?" + req.query if req.query else "")
        response: UpstreamResponse | None = None
        committed = False
        try:
            async with asyncio.timeout(budget):
                response = await self._pools[region].request(
                    req.method, target, req.headers, req.body
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
    ) -> Response:
        response = outcome.response
        version = response.header(MODEL_VERSION_HEADER, "unknown")[:128]
        headers = _back_headers(response.headers, served, rerouted)
        if outcome.body is not None:
            if record:
                prompt, completion = _usage(outcome.body, response)
                self.record(
                    req, region, served, rerouted, version, response.status, prompt, completion
                )
            return Response(outcome.body, response.status, headers=headers)
        return StreamingResponse(
            self._relay(req, region, served, rerouted, version, outcome, record),
            status_code=response.status,
            headers=headers,
        )

    async def _relay(
        self,
        req: _Request,
        region: str,
        served: str,
        rerouted: bool,
        version: str,
        outcome: _Committed,
        record: bool,
    ) -> AsyncIterator[bytes]:
        tally = _StreamTally(req.strip_usage)
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
        except UpstreamError as exc:
            status = 502
            finished = True
            # Re-raised so the server drops the client connection without ending the chunked
            # body: the client must see a broken stream, not a clean end without [DONE].
            raise StreamCutError(f"stream from {served} cut: {exc}") from exc
        finally:
            if not finished:
                status = 499  # the client went away
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
        }

    return app
