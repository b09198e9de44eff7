"""Spot preemption at the gateway: drains, triage, the request ledger and resumed requests.

`POST /admin/spot/drain {"node", "budget_seconds", "continue_factor"}` closes admission to a node
(an upstream) at once, in this process, and triages every request in flight on it
(`redline.platform.spot.build_triage`): a request continues when remaining tokens x TPOT <=
continue_factor x budget and is aborted otherwise; whatever still runs on the node when the
budget is spent is aborted then. An aborted stream ends with an SSE error event
(`SPOT_PREEMPTION`, `recoverable` when the request is retry-safe, the header to resend it with)
followed by `[DONE]`, never with a cut connection; so does a stream whose draining node dies
under it. Before the event goes out the request is written to the ledger (Redis: request id,
attempt, served prefix, model revision, prompt fingerprint, retry-safety, reason).

The client resends it with `x-redline-resume: <request id>`: the gateway claims the entry
atomically, routes to another replica and, when that replica serves the same model revision,
resumes after the served prefix (vLLM `continue_final_message`; the answer says
`x-redline-resumed: true` and carries only the rest), or regenerates from scratch
(`x-redline-resumed: false`). A request that is not retry-safe (header
`x-redline-retry-safe: false`, or tools offered) is never run twice: when it carries an
`x-request-id` that id is claimed in the ledger before it runs (a second copy gets 409).
Ordinary requests never touch Redis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from redline.gateway.metrics import GatewayMetrics
from redline.gateway.settings import GatewaySettings
from redline.gateway.sse import StreamTally
from redline.gateway.upstream import UpstreamResponse
from redline.platform.spot import (
    CLAIM_NOT_FOUND,
    CLAIM_NOT_INTERRUPTED,
    CLAIM_NOT_RETRY_SAFE,
    RESUME_HEADER,
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
    render_sse_error,
    requested_max_tokens,
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Inflight:
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
    tally: StreamTally | None = None
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
class Drain:
    """A node whose admission this gateway holds closed, and when that lapses."""

    node: str
    started: float
    budget_seconds: float
    until: float
    handle: asyncio.TimerHandle | None = None


@dataclass(frozen=True)
class Refusal:
    """A request the ledger refuses to run: the status, message and error type to answer."""

    status: int
    message: str
    kind: str


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


class SpotControl:
    """The requests in flight, the drains this gateway holds, and the request ledger."""

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.inflight: set[Inflight] = set()
        self.draining: dict[str, Drain] = {}
        self.revisions: dict[tuple[str, str], str] = {}  # (region, model) -> last version seen
        self.node_tpot: dict[str, float] = {}
        self.ledger: AsyncRequestLedger | None = None

    def open(self) -> None:
        """Create the ledger client (it connects on first use)."""
        s = self.settings
        self.ledger = AsyncRequestLedger.from_url(
            s.redis_url,
            s.ledger_key_prefix,
            s.ledger_ttl_seconds,
            max(0.5, s.redis_timeout_seconds),
        )

    def cancel_timers(self) -> None:
        """Cancel the pending budget timers of every drain."""
        for drain in self.draining.values():
            if drain.handle is not None:
                drain.handle.cancel()

    async def close(self) -> None:
        """Close the ledger client."""
        if self.ledger is not None:
            await self.ledger.aclose()
            self.ledger = None

    # ---- drains ------------------------------------------------------------------------------

    def drain(self, order: SpotDrainRequest) -> dict[str, Any]:
        """Close a node's admission here and now, triage its in-flight requests, abort the ones
        that cannot finish within the budget, and abort the rest when the budget is spent."""
        node = order.node
        now = time.monotonic()
        previous = self.draining.get(node)
        if previous is not None and previous.handle is not None:
            previous.handle.cancel()
        drain = Drain(node, now, order.budget_seconds, now + order.close_seconds)
        self.draining[node] = drain
        self.metrics.spot_draining.labels(node).set(1)
        running = [r for r in self.inflight if r.region == node and r.abort_reason is None]
        views = [self.view(r) for r in running]
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

    def view(self, request: Inflight) -> InflightView:
        """What triage knows of a request in flight: tokens generated, left, and its pace."""
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

    def _budget_spent(self, node: str, drain: Drain) -> None:
        if self.draining.get(node) is not drain:
            return
        for request in list(self.inflight):
            if request.region == node:
                request.abort("drain budget spent")

    def release(self, node: str) -> bool:
        """Admit requests to `node` again (its replacement is ready); True if it was drained."""
        drain = self.draining.pop(node, None)
        if drain is None:
            return False
        if drain.handle is not None:
            drain.handle.cancel()
        self.metrics.spot_draining.labels(node).set(0)
        return True

    def release_expired(self, now: float) -> None:
        """Release every drain whose `close_seconds` have passed."""
        for node, drain in list(self.draining.items()):
            if drain.until <= now:
                self.release(node)

    def is_draining(self, node: str) -> bool:
        """Whether this gateway holds `node`'s admission closed right now."""
        drain = self.draining.get(node)
        return drain is not None and drain.until > time.monotonic()

    def draining_nodes(self, now: float) -> frozenset[str]:
        """The nodes whose admission is closed at `now`."""
        return frozenset(n for n, d in self.draining.items() if d.until > now)

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

    def wasted(self, node: str, reason: str, tokens: int) -> None:
        """Count decoded tokens a preemption threw away."""
        if tokens > 0:
            self.metrics.spot_wasted_tokens.labels(node, reason).inc(tokens)

    def note_tpot(self, node: str, tpot: float) -> None:
        """Fold a finished stream's time per output token into the node's moving average."""
        old = self.node_tpot.get(node)
        self.node_tpot[node] = tpot if old is None else 0.8 * old + 0.2 * tpot

    # ---- the ledger --------------------------------------------------------------------------

    async def claim_resume(
        self, resume: str, payload: dict[str, Any] | None, inflight: Inflight
    ) -> LedgerEntry | Refusal:
        """The ledger entry a resumed request continues, claimed; or the refusal to answer."""
        if payload is None or self.ledger is None:
            return Refusal(400, f"{RESUME_HEADER} needs a JSON request", "BadRequestError")
        try:
            entry = await self.ledger.get(resume)
            if entry is None:
                return Refusal(
                    404, f"no interrupted request {resume!r} to resume", "SPOT_RESUME_UNKNOWN"
                )
            if entry.prompt_fingerprint != build_prompt_fingerprint(payload):
                return Refusal(
                    409,
                    f"request {resume!r} was a different request (its prompt "
                    "fingerprint does not match)",
                    "SPOT_RESUME_MISMATCH",
                )
            attempt = await self.ledger.claim_retry(resume, time.time())
        except LedgerError as exc:
            return Refusal(
                503, f"the request ledger is unavailable: {exc}", "SPOT_LEDGER_UNAVAILABLE"
            )
        if attempt == CLAIM_NOT_RETRY_SAFE:
            self.metrics.spot_retries.labels("refused").inc()
            return Refusal(
                409,
                f"request {resume!r} is not retry-safe: it ran once and will not run again",
                "SPOT_NOT_RETRY_SAFE",
            )
        if attempt in (CLAIM_NOT_INTERRUPTED, CLAIM_NOT_FOUND):
            self.metrics.spot_retries.labels("refused").inc()
            return Refusal(
                409,
                f"request {resume!r} is not interrupted (status "
                f"{entry.status}): it is being retried or is complete",
                "SPOT_RESUME_CONFLICT",
            )
        inflight.attempt = attempt
        inflight.ledgered = True
        inflight.retry_safe = entry.retry_safe
        if entry.max_tokens is not None:
            inflight.max_tokens = entry.max_tokens
        return entry

    async def claim_once(self, request_id: str, payload: dict[str, Any]) -> Refusal | None:
        """Claim a non-retry-safe request id in the ledger; the refusal when it was seen."""
        assert self.ledger is not None
        entry = LedgerEntry(
            request_id=request_id,
            attempt=1,
            served_prefix_tokens=0,
            model_revision="unknown",
            prompt_fingerprint=build_prompt_fingerprint(payload),
            retry_safe=False,
            interruption_reason="",
            status="running",
            max_tokens=requested_max_tokens(payload),
            updated_at=time.time(),
        )
        try:
            first = await self.ledger.claim_once(entry)
        except LedgerError as exc:
            return Refusal(
                503,
                "the request ledger is unavailable, so a request "
                f"that is not retry-safe cannot be run at most once: {exc}",
                "SPOT_LEDGER_UNAVAILABLE",
            )
        if not first:
            return Refusal(
                409,
                f"request {request_id!r} is not retry-safe and "
                "was already received: it is not run twice",
                "SPOT_NOT_RETRY_SAFE",
            )
        return None

    def note_revision(self, region: str, model: str, version: str) -> None:
        """Remember the model revision `region` last served `model` with."""
        self.revisions[(region, model)] = version

    def resume_body(
        self, payload: dict[str, Any], model: str, entry: LedgerEntry, region: str
    ) -> bytes | None:
        """The body that continues `entry`'s prefix on `region`, or None to regenerate."""
        if entry.served_prefix_tokens <= 0 or entry.model_revision == "unknown":
            return None
        known = self.revisions.get((region, model))
        if known is not None and known != entry.model_revision:
            return None
        resumed = build_resume_payload(payload, entry.served_prefix, entry.served_prefix_tokens)
        return None if resumed is None else json.dumps(resumed, separators=(",", ":")).encode()

    def count_retry(self, entry: LedgerEntry, resumed: bool, inflight: Inflight) -> None:
        """Count a retry that found a replica: resumed after the prefix, or regenerated."""
        if resumed:
            self.metrics.spot_retries.labels("resumed").inc()
            inflight.prefix_tokens = entry.served_prefix_tokens
            inflight.prefix_text = entry.served_prefix
        else:
            self.metrics.spot_retries.labels("regenerated").inc()
            # What the client was served before is discarded: those tokens were decoded twice.
            self.wasted(entry.node or "unknown", "regenerated", entry.served_prefix_tokens)

    async def set_status(self, request_id: str, status: str) -> None:
        """Record a ledgered request's new status; a ledger failure is only logged."""
        if self.ledger is None:
            return
        try:
            await self.ledger.set_status(request_id, status, time.time())
        except LedgerError as exc:
            log.warning("ledger: %s: %s", request_id, exc)

    async def interrupt(
        self,
        request_id: str,
        payload: dict[str, Any] | None,
        node: str,
        version: str,
        tally: StreamTally,
        inflight: Inflight,
    ) -> bytes:
        """Ledger the interrupted stream and build the error event that ends it."""
        reason = inflight.abort_reason or "the draining node went away"
        served = inflight.prefix_tokens + tally.content_chunks
        prefix = inflight.prefix_text + tally.served_text()
        resumable = False
        recoverable = inflight.retry_safe
        if payload is not None and self.ledger is not None:
            entry = LedgerEntry(
                request_id=request_id,
                attempt=inflight.attempt,
                served_prefix_tokens=served,
                model_revision=version,
                prompt_fingerprint=build_prompt_fingerprint(payload),
                retry_safe=inflight.retry_safe,
                interruption_reason=f"{SPOT_ERROR_TYPE}: {reason}",
                status="interrupted",
                node=node,
                served_prefix=prefix,
                max_tokens=inflight.max_tokens,
                updated_at=time.time(),
            )
            try:
                await self.ledger.put(entry)
            except LedgerError as exc:
                log.warning("ledger: %s: %s", request_id, exc)
                recoverable = False
            else:
                resumable = recoverable and served > 0 and version != "unknown"
        else:
            recoverable = False
        if not recoverable:
            self.wasted(node, "not_recoverable", served)
        self.metrics.spot_interrupted.labels(node, "true" if recoverable else "false").inc()
        error = build_spot_error(
            request_id,
            node,
            inflight.attempt,
            served,
            recoverable,
            resumable,
            self.settings.spot_retry_after_ms,
            reason,
        )
        return render_sse_error(error)
