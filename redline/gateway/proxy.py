"""The proxy: one request, tried region by region, streamed back and recorded.

Per request:

1. Order the regions (`redline.gateway.routing`): routing override first, then the configured
   order; closed, draining and unhealthy regions last, regions whose circuit breaker is open
   (`redline.gateway.breakers`) after them. An open region is skipped without an attempt
   unless it is the last one left (trying it is better than failing); every attempt's outcome
   (the reroute causes below are its failures) and latency feed its region's breaker.
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

Traces (`redline.gateway.tracing`, when on): a SERVER span per recorded request, started once the
request is accepted and ended where it is recorded (`_observe`, whose exemplar is its trace id),
and a CLIENT span per attempt (`_attempt_tracked`), whose `traceparent` goes upstream. Off, the
only cost is the `tracing.on` test per request and `req.trace is None` tests per attempt.

Token counts come from the upstream's `usage`. For a streamed request that did not ask for it the
gateway adds `stream_options.include_usage` upstream and drops the usage-only chunk before it
reaches the client (`inject_stream_usage`); when an upstream sends no usage, completion tokens are
the content chunks counted in the stream (one token each, as vLLM and OpenAI stream) and prompt
tokens are not counted.

Metric labels: `region` is the region the request was first routed to, `served_region` the one
that answered, `rerouted` whether more than one region was tried, `model` the requested model
(bounded: past `max_model_labels` distinct names it is "other"), `model_version` the requested
model's active version in the snapshot registry when `snapshots_root` is set (cached, see
`ActiveVersions`), else — or for a model the registry has no active snapshot of — the upstream's
`x-redline-model-version` header ("unknown" without one; with `snapshots_root` the client gets
the recorded version in that header), `status` the HTTP status sent to the
client — except that a stream the upstream cut is recorded as 502, one the client abandoned as
499 and one a spot drain ended as 503. Errors are statuses >= 500. Requests the gateway rejects
itself (malformed JSON, body too large, refused by the ledger) are recorded with `region` and
`served_region` "none".

Spot drains (`redline.gateway.spot`) abort attempts in flight: a non-streaming request aborted
this way is retried on the next replica at once, invisibly, when retry-safe. A request that is
not retry-safe is rerouted only when its replica could not be reached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from redline.core.failover import RETRY_AFTER
from redline.gateway.metrics import REROUTE_REASONS, GatewayMetrics
from redline.gateway.promptwriter import open_prompt_log_writer
from redline.gateway.quotas import Admission, QuotaGate, QuotaTicket, rewrite_model
from redline.gateway.routing import RegionRouter
from redline.gateway.settings import GatewaySettings
from redline.gateway.spot import Inflight, Refusal, SpotControl
from redline.gateway.sse import StreamTally, int_or_none
from redline.gateway.tracing import TRACE_HEADERS, GatewayTracing, RequestTrace
from redline.gateway.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
)
from redline.platform.golden import MODEL_VERSION_HEADER
from redline.platform.routing import REROUTED_HEADER, SERVED_REGION_HEADER
from redline.platform.snapshots import UNKNOWN_VERSION, ActiveVersions, SnapshotRegistry
from redline.platform.spot import (
    ATTEMPT_HEADER,
    REQUEST_ID_HEADER,
    RESUME_HEADER,
    RESUMED_HEADER,
    RETRY_SAFE_HEADER,
    LedgerEntry,
    build_spot_error,
    is_retry_safe,
    requested_max_tokens,
)
from redline.slo.spec import Breakers

log = logging.getLogger(__name__)

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


class StreamCutError(Exception):
    """An upstream stream broke after its first bytes were forwarded; the client's is aborted."""


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
    trace: RequestTrace | None = None
    quota: QuotaTicket | None = None


def openai_error(status: int, message: str, kind: str) -> JSONResponse:
    """An error answer shaped like the OpenAI API's."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


class Gateway:
    """The proxy: region routing, spot control, the upstream pools and the metrics."""

    def __init__(
        self,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        breakers: Breakers | None = None,
        tracing: GatewayTracing | None = None,
        quotas: QuotaGate | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.tracing = tracing if tracing is not None else GatewayTracing()
        self.quotas = quotas  # token quotas by tenant x intent (redline.gateway.quotas)
        self.router = RegionRouter(settings, metrics, breakers)
        self.spot = SpotControl(settings, metrics)
        self.regions = self.router.regions
        self.versions: ActiveVersions | None = None
        if settings.snapshots_root is not None:
            self.versions = ActiveVersions(
                SnapshotRegistry(settings.snapshots_root), settings.version_ttl_seconds
            )
        self._pools: dict[str, UpstreamPool] = {}
        # None unless prompt_log.enabled: then the only per-request cost is a queue put.
        self.prompt_log = open_prompt_log_writer(settings.prompt_log, settings.redis_url)

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
        self.router.open()
        self.spot.open()
        if self.prompt_log is not None:
            self.prompt_log.start()
        await self.refresh_routing()

    async def stop(self) -> None:
        """Close the connection pool, the reader and the ledger."""
        self.spot.cancel_timers()
        for pool in self._pools.values():
            await pool.aclose()
        self._pools = {}
        await self.router.close()
        await self.spot.close()
        if self.prompt_log is not None:
            await asyncio.to_thread(self.prompt_log.stop)  # writes what is still queued

    async def refresh_routing(self) -> None:
        """Read the routing state (the configured order while Redis fails); end lapsed drains."""
        await self.router.refresh()
        self.spot.release_expired(time.monotonic())

    async def refresh_forever(self) -> None:
        """Refresh the routing state every `routing_refresh_seconds` until cancelled."""
        while True:
            await asyncio.sleep(self.settings.routing_refresh_seconds)
            await self.refresh_routing()

    def order(self) -> list[str]:
        """Regions in the order this request tries them."""
        now = time.monotonic()
        return self.router.order(now, self.spot.draining_nodes(now))

    def status(self) -> dict[str, Any]:
        """What `/healthz` shows: the order, the routing store, closed, unhealthy, draining."""
        routing = self.router.routing
        now = time.monotonic()
        return {
            "status": "ok",
            "order": self.order(),
            "routing_store_up": self.router.store_up,
            "override": None if routing.override is None else routing.override.target_region,
            "closed": sorted(routing.closed),
            "unhealthy": [r for r in self.regions if self.router.unhealthy(r, now)],
            "draining": sorted(n for n in self.spot.draining if self.spot.is_draining(n)),
            "breakers": None if self.router.breakers is None else self.router.breakers.states(),
        }

    def version(self, model: str, response: UpstreamResponse) -> str:
        """The registry's active version of `model`; else the upstream's header; else unknown."""
        if self.versions is not None:
            version = self.versions.version(model)
            if version != UNKNOWN_VERSION:
                return version
        return response.header(MODEL_VERSION_HEADER, UNKNOWN_VERSION)[:128]

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
        if self.quotas is not None and req.payload is not None:
            admission = await self.quotas.admit(req.payload, request.headers, req.model)
            if admission.refusal is not None:
                return self._quota_refusal(started, admission, record)
            if admission.model is not None:  # downgraded to the lighter model
                req.body, req.model = rewrite_model(req.body, admission.model), admission.model
            req.quota = admission.ticket
        resume = request.headers.get(RESUME_HEADER)
        client_id = request.headers.get(REQUEST_ID_HEADER)
        req.request_id = (resume or client_id or uuid.uuid4().hex)[:128]
        if client_id is None:
            req.headers.append((REQUEST_ID_HEADER, req.request_id))
        elif client_id != req.request_id:
            req.headers = [(k, v) for k, v in req.headers if k != REQUEST_ID_HEADER]
            req.headers.append((REQUEST_ID_HEADER, req.request_id))
        inflight = Inflight(req.request_id, req.stream, True, None)
        if req.payload is not None:
            req.retry_safe = is_retry_safe(req.payload, request.headers.get(RETRY_SAFE_HEADER))
            inflight.retry_safe = req.retry_safe
            inflight.max_tokens = requested_max_tokens(req.payload)
        entry: LedgerEntry | None = None
        if resume is not None:
            claimed = await self.spot.claim_resume(resume, req.payload, inflight)
            if isinstance(claimed, Refusal):
                return self._refuse(started, claimed, record)
            entry = claimed
        elif not req.retry_safe and client_id is not None and req.payload is not None:
            refused = await self.spot.claim_once(req.request_id, req.payload)
            if refused is not None:
                return self._refuse(started, refused, record)
        self.spot.inflight.add(inflight)
        token = None
        if self.tracing.on and record:
            token = self._trace(request, req, entry)
        try:
            return await self._route(req, inflight, entry, record)
        finally:
            if token is not None:
                req.trace.detach(token)  # type: ignore[union-attr]
            if not inflight.stream or inflight.response is None:
                self.spot.inflight.discard(inflight)

    def _trace(self, request: Request, req: _Request, entry: LedgerEntry | None) -> object:
        """Start the request's trace (the client's trace headers are replaced by each attempt's
        own) with its SERVER span current; the token that ends that."""
        req.headers = [(k, v) for k, v in req.headers if k not in TRACE_HEADERS]
        req.trace = self.tracing.start(
            request.headers,
            req.method,
            req.path,
            req.model,
            req.request_id,
            req.started,
            None if entry is None else entry.node,
            0 if entry is None else entry.served_prefix_tokens,
        )
        return req.trace.enter()

    def _observe(
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
        """Record a finished request; end its trace, whose id is the latency's exemplar."""
        if req.quota is not None and self.quotas is not None:
            self.quotas.settle(req.quota, status, prompt_tokens, completion_tokens)
        trace_id = None
        if req.trace is not None:
            trace_id = req.trace.finish(
                status, region, served, rerouted, version, prompt_tokens, completion_tokens
            )
        self.metrics.observe(
            req.started,
            req.model,
            region,
            served,
            rerouted,
            version,
            status,
            prompt_tokens,
            completion_tokens,
            first_token_at,
            trace_id,
        )

    def _refuse(self, started: float, refusal: Refusal, record: bool) -> Response:
        if record:
            self.metrics.observe(
                started, "unknown", "none", "none", False, "unknown", refusal.status
            )
        answer = openai_error(refusal.status, refusal.message, refusal.kind)
        if refusal.status == 503:
            # The ledger (Redis) unreachable or failing over: the client retries shortly.
            answer.headers.update(RETRY_AFTER)
        return answer

    def _quota_refusal(self, started: float, admission: Admission, record: bool) -> Response:
        refusal = admission.refusal
        assert refusal is not None
        kind = "RateLimitError" if refusal.status == 429 else "ServiceUnavailableError"
        answer = self._refuse(started, Refusal(refusal.status, refusal.message, kind), record)
        answer.headers.update(refusal.headers)
        return answer

    def _reject(self, started: float, status: int, message: str, record: bool) -> Response:
        return self._refuse(started, Refusal(status, message, "BadRequestError"), record)

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

    async def _route(
        self, req: _Request, inflight: Inflight, entry: LedgerEntry | None, record: bool
    ) -> Response:
        order = self.order()
        if entry is not None and entry.node in order:
            order.remove(entry.node)  # never back to the replica that was preempted
            order.append(entry.node)
        failures: list[str] = []
        last_failure: _Failure | None = None
        served = order[0]
        for index, region in enumerate(order):
            last = index == len(order) - 1
            if not last and not self.router.admit(region):
                continue  # its breaker is open: on to the next region at once, no waiting
            budget = None if last else self.settings.first_byte_budget_seconds
            if self.settings.first_byte_budget_streaming_only and not req.stream:
                budget = None
            resumed = False
            body = None
            if entry is not None:
                assert req.payload is not None
                body = self.spot.resume_body(req.payload, req.model, entry, region)
                resumed = body is not None
            outcome = await self._attempt_tracked(req, inflight, region, budget, body)
            if isinstance(outcome, _Committed) and resumed:
                version = self.version(req.model, outcome.response)
                if version != entry.model_revision:  # type: ignore[union-attr]
                    # Another revision cannot continue this prefix: regenerate instead.
                    await outcome.response.aclose()
                    resumed = False
                    outcome = await self._attempt_tracked(req, inflight, region, budget, None)
            if isinstance(outcome, _Committed):
                self.router.succeeded(region)
                version = self.version(req.model, outcome.response)
                self.spot.note_revision(region, req.model, version)
                if entry is not None:
                    # Nothing was served before: a fresh run is exactly the rest of it.
                    resumed = resumed or entry.served_prefix_tokens == 0
                    self.spot.count_retry(entry, resumed, inflight)
                return await self._respond(
                    req, order[0], region, index > 0, outcome, record, inflight, resumed
                )
            self.router.failed(region)
            served = region  # the last region tried (a breaker may have skipped some)
            failures.append(f"{region}: {outcome.detail}")
            last_failure = outcome
            spot = outcome.reason == "spot_preemption"
            if spot:
                # Whatever it decoded before the abort never reached the client.
                unserved = self.spot.view(inflight).generated_tokens
                self.spot.wasted(region, "aborted_unserved", unserved)
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
        return self._unanswered(req, order[0], served, failures, last_failure, record)

    def _unanswered(
        self,
        req: _Request,
        region: str,
        served: str,
        failures: list[str],
        last_failure: _Failure,
        record: bool,
    ) -> Response:
        """The answer when no region answered: the last region's 5xx as it was, else a 502 or
        504 naming every region's failure."""
        rerouted = len(failures) > 1
        if last_failure.status is not None:
            # The last region answered with a 5xx: the client gets that answer as it was.
            if record:
                self._observe(req, region, served, rerouted, "unknown", last_failure.status)
            headers = _back_headers(last_failure.headers, served, rerouted)
            return Response(last_failure.body, last_failure.status, headers=headers)
        status = 504 if last_failure.reason in ("timeout", "first_byte_budget") else 502
        if record:
            self._observe(req, region, served, rerouted, "unknown", status)
        return openai_error(
            status, "no upstream region answered: " + "; ".join(failures), "UpstreamError"
        )

    def _spot_refusal(
        self,
        req: _Request,
        region: str,
        served: str,
        rerouted: bool,
        inflight: Inflight,
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
            self._observe(req, region, served, rerouted, "unknown", 503)
        return JSONResponse(error, status_code=503, headers={REQUEST_ID_HEADER: req.request_id})

    async def _attempt_tracked(
        self,
        req: _Request,
        inflight: Inflight,
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
        trace = req.trace
        token = None if trace is None else trace.begin_attempt(region, body is not None)
        outcome: _Committed | _Failure | None = None
        try:
            outcome = await self._attempt(req, region, budget, body)
        except asyncio.CancelledError:
            if inflight.abort_reason is None or task is None or task.cancelling() != 1:
                raise
            task.uncancel()
            reason = f"aborted by a spot drain: {inflight.abort_reason}"
            outcome = _Failure("spot_preemption", reason)
            return outcome
        finally:
            inflight.task = None
            if trace is not None:
                trace.detach(token)
                if isinstance(outcome, _Committed):
                    trace.attempt_committed(outcome.response.status)
                elif outcome is None:
                    trace.attempt_failed("cancelled", "the request was cancelled", None)
                else:
                    trace.attempt_failed(outcome.reason, outcome.detail, outcome.status)
        # The breaker counts what the proxy reroutes on (a drain's abort above is not the
        # upstream's fault); latency is to the first byte, or the whole body when not streamed.
        elapsed = time.perf_counter() - inflight.attempt_started
        self.router.attempted(region, isinstance(outcome, _Committed), elapsed)
        if isinstance(outcome, _Committed) and outcome.body is None:
            inflight.response = outcome.response
            if inflight.abort_reason is not None:
                outcome.response.abort()  # aborted while committing: the relay ends it
        return outcome

    async def _attempt(
        self, req: _Request, region: str, budget: float | None, body: bytes | None = None
    ) -> _Committed | _Failure:
        target = req.path + ("?" + req.query if req.query else "")
        response: UpstreamResponse | None = None
        committed = False
        try:
            async with asyncio.timeout(budget):
                response = await self._pools[region].request(
                    req.method,
                    target,
                    req.headers,
                    req.body if body is None else body,
                    () if req.trace is None else req.trace.headers,
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
        inflight: Inflight,
        resumed: bool,
    ) -> Response:
        response = outcome.response
        version = self.version(req.model, response)
        headers = _back_headers(response.headers, served, rerouted)
        headers[REQUEST_ID_HEADER] = req.request_id
        if self.versions is not None and version != UNKNOWN_VERSION:
            # Clients (load generators, evaluators) see the version the metrics record.
            headers[MODEL_VERSION_HEADER] = version
        if inflight.attempt > 1:
            headers[ATTEMPT_HEADER] = str(inflight.attempt)
            headers[RESUMED_HEADER] = "true" if resumed else "false"
        if outcome.body is not None:
            if self.prompt_log is not None and record and response.status < 400:
                self.prompt_log.submit(req.request_id, req.headers, req.payload, outcome.body)
            if record:
                prompt, completion = _usage(outcome.body, response)
                self._observe(
                    req,
                    region,
                    served,
                    rerouted,
                    version,
                    response.status,
                    prompt,
                    completion,
                )
            if inflight.ledgered:
                await self.spot.set_status(req.request_id, "completed")
            return Response(outcome.body, response.status, headers=headers)
        return StreamingResponse(
            self._relay(req, region, served, rerouted, version, outcome, record, inflight),
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
        inflight: Inflight,
    ) -> AsyncIterator[bytes]:
        tally = StreamTally(req.strip_usage)
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
                await self.spot.set_status(req.request_id, "completed")
        except UpstreamError as exc:
            finished = True
            if inflight.abort_reason is None and not self.spot.is_draining(served):
                status = 502
                # Re-raised so the server drops the client connection without ending the chunked
                # body: the client must see a broken stream, not a clean end without [DONE].
                raise StreamCutError(f"stream from {served} cut: {exc}") from exc
            status = 503
            if req.trace is not None:
                req.trace.preempted(inflight.abort_reason or "preempted")
            yield await self.spot.interrupt(
                req.request_id, req.payload, served, version, tally, inflight
            )
        finally:
            self.spot.inflight.discard(inflight)
            if not finished:
                status = 499  # the client went away
            elif status == 200 and tally.content_chunks >= 2:
                tpot = tally.tpot()
                if tpot is not None:
                    self.spot.note_tpot(served, tpot)
            if self.prompt_log is not None and record and outcome.response.status < 400:
                # The deltas the client was sent, decoded on the writer's thread; a stream cut,
                # abandoned or drained is logged as far as it went, marked truncated.
                truncated = status != outcome.response.status
                self.prompt_log.submit(
                    req.request_id, req.headers, req.payload, None, tally.contents, truncated
                )
            if record:
                completion = tally.completion_tokens
                if completion is None and tally.content_chunks:
                    completion = tally.content_chunks
                self._observe(
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
    return int_or_none(usage.get("prompt_tokens")), int_or_none(usage.get("completion_tokens"))


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
