"""Spot GPU preemption, the pure part: node states, the drain budget, in-flight triage, the
request ledger's records and the streaming retry contract. No I/O here: the notice sources
(`spot_sources`), the Redis ledger (`spot_ledger`) and the agent (`spot_agent`) build on it.

The flow, for one node (a serving replica the gateway calls an upstream):

1. A notice arrives (AWS instance metadata, GCP metadata, or a manual trigger).
2. READY (or RECOVERED) -> DRAINING: admission to the node closes at once, the drain budget is

       budget = notice - detection delay - ingress removal - safety margin

   and every in-flight request is triaged: it continues when
   remaining tokens x time per output token <= continue_factor (0.85) x budget, and is aborted
   otherwise. An aborted stream ends with an SSE error event (`SPOT_PREEMPTION`, recoverable when
   the request is retry-safe) instead of a cut connection.
3. DRAINING -> TERMINATING once nothing is in flight on the node or its budget is spent.
4. TERMINATING -> RECOVERED when a replacement passes the readiness gate (health, model loaded,
   a dummy inference); admission opens again.

Retry contract: the error event names the request id and the header to resend it with
(`x-redline-resume: <id>`). The gateway's ledger remembers the served prefix; a retry-safe request
resumes after it on another replica when the model revision matches (vLLM's
`continue_final_message`), or regenerates from scratch when it does not. A request that is not
retry-safe is never run twice.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from redline.slo.spec import Spot

SPOT_ERROR_TYPE = "SPOT_PREEMPTION"
REQUEST_ID_HEADER = "x-request-id"
"""The request id (vLLM honours it too); the gateway makes one up when the client sends none."""
RESUME_HEADER = "x-redline-resume"
"""Resend an interrupted request with this header set to its request id to resume it."""
RETRY_SAFE_HEADER = "x-redline-retry-safe"
"""`false` marks a request that must never run twice (default: true unless it carries tools)."""
RESUMED_HEADER = "x-redline-resumed"
"""On a resumed request's answer: `true` when it continues after the served prefix, `false` when
it was regenerated from scratch (the client must then drop the prefix it holds)."""
ATTEMPT_HEADER = "x-redline-attempt"
PROVIDERS = ("aws", "gcp", "manual")
_SIDE_EFFECT_FIELDS = ("tools", "functions", "tool_choice", "function_call")
_NOT_FINGERPRINTED = frozenset({"stream", "stream_options", "user"})


class SpotError(Exception):
    """Bad spot input (unknown provider, unreadable record)."""


class SpotStateError(SpotError):
    """A node state transition that the state machine does not allow."""


class NodeState(StrEnum):
    """The states of a spot node; exported as `llm_node_state{node,state}` (lowercase)."""

    READY = "ready"
    DRAINING = "draining"
    TERMINATING = "terminating"
    RECOVERED = "recovered"


TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    NodeState.READY: frozenset({NodeState.DRAINING}),
    NodeState.RECOVERED: frozenset({NodeState.DRAINING}),
    NodeState.DRAINING: frozenset({NodeState.TERMINATING}),
    NodeState.TERMINATING: frozenset({NodeState.RECOVERED}),
}
"""Allowed transitions. A recovered node is a serving node again: the next notice drains it."""


@dataclass(frozen=True)
class Notice:
    """One interruption notice as a source saw it (unix times).

    `noticed_at` is when the cloud issued the notice as far as it can be told (AWS: termination
    time - the 120 s window; GCP long-poll and manual: when it answered); `detected_at` is when
    the agent saw it; `terminate_at` is when the node goes away.
    """

    node: str
    provider: str
    kind: Literal["interruption", "rebalance"]
    action: str
    noticed_at: float
    detected_at: float
    terminate_at: float | None
    detail: str = ""

    @property
    def detection_delay(self) -> float:
        """Seconds between the notice and the agent seeing it."""
        return max(0.0, self.detected_at - self.noticed_at)


@dataclass(frozen=True)
class NodeRecord:
    """A node's state and the times of its last preemption (unix seconds; None: not yet)."""

    node: str
    state: NodeState = NodeState.READY
    provider: str = ""
    changed_at: float = 0.0
    notice_at: float | None = None
    detected_at: float | None = None
    terminate_at: float | None = None
    draining_at: float | None = None
    terminating_at: float | None = None
    recovered_at: float | None = None
    budget_seconds: float | None = None
    preempted_instance: str = ""
    detail: str = ""

    @property
    def notice_to_draining(self) -> float | None:
        """Seconds from the notice to DRAINING."""
        if self.notice_at is None or self.draining_at is None:
            return None
        return max(0.0, self.draining_at - self.notice_at)

    @property
    def gone_at(self) -> float | None:
        """When the node was gone: TERMINATING, or its termination time if that came later (a
        drained node still runs until then, and its replacement cannot take its place before)."""
        if self.terminating_at is None:
            return None
        return max(self.terminating_at, self.terminate_at or self.terminating_at)

    def replacement_latency(self, now: float) -> float | None:
        """Seconds from the node being gone to RECOVERED, or waited so far while TERMINATING."""
        gone = self.gone_at
        if gone is None:
            return None
        if self.state is NodeState.RECOVERED and self.recovered_at is not None:
            return max(0.0, self.recovered_at - gone)
        if self.state is NodeState.TERMINATING:
            return max(0.0, now - gone)
        return None

    def to_fields(self) -> dict[str, str]:
        """A flat string mapping (a Redis hash); None fields are left out."""
        out: dict[str, str] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                out[item.name] = str(value.value if isinstance(value, NodeState) else value)
        return out

    @classmethod
    def from_fields(cls, node: str, raw: Mapping[str, str]) -> NodeRecord:
        """Decode `to_fields` output; SpotError naming the bad field."""
        values: dict[str, Any] = {"node": node}
        try:
            for item in fields(cls):
                if item.name == "node" or item.name not in raw:
                    continue
                text = raw[item.name]
                if item.name == "state":
                    values["state"] = NodeState(text)
                elif item.name in ("provider", "detail", "preempted_instance"):
                    values[item.name] = text
                else:
                    values[item.name] = float(text)
        except ValueError as exc:
            raise SpotError(f"node {node}: unreadable state record: {exc}") from None
        return cls(**values)


def build_transition(
    record: NodeRecord, state: NodeState, now: float, **changes: Any
) -> NodeRecord:
    """`record` moved to `state` at `now` (the state's timestamp set); SpotStateError if the
    state machine does not allow it."""
    if state not in TRANSITIONS[record.state]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[record.state]))
        raise SpotStateError(
            f"node {record.node}: {record.state.value} -> {state.value} is not allowed "
            f"(from {record.state.value}: {allowed})"
        )
    stamp = {
        NodeState.DRAINING: "draining_at",
        NodeState.TERMINATING: "terminating_at",
        NodeState.RECOVERED: "recovered_at",
    }[state]
    if state is NodeState.DRAINING:
        # A new preemption: the previous one's later timestamps no longer apply.
        changes = {"terminating_at": None, "recovered_at": None, **changes}
    return replace(record, state=state, changed_at=now, **{stamp: now, **changes})


@dataclass(frozen=True)
class DrainBudget:
    """The drain budget and its parts (seconds)."""

    notice_seconds: float
    detection_delay_seconds: float
    ingress_removal_seconds: float
    safety_margin_seconds: float

    @property
    def seconds(self) -> float:
        """notice - detection delay - ingress removal - safety margin (never below 0)."""
        return max(
            0.0,
            self.notice_seconds
            - self.detection_delay_seconds
            - self.ingress_removal_seconds
            - self.safety_margin_seconds,
        )

    def as_dict(self) -> dict[str, float]:
        """JSON form."""
        return {
            "notice_seconds": self.notice_seconds,
            "detection_delay_seconds": self.detection_delay_seconds,
            "ingress_removal_seconds": self.ingress_removal_seconds,
            "safety_margin_seconds": self.safety_margin_seconds,
            "budget_seconds": self.seconds,
        }


def build_drain_budget(spot: Spot, notice: Notice) -> DrainBudget:
    """The budget of `notice`: its own window when it names a termination time (AWS), the spec's
    window of its provider otherwise; the detection delay is the spec's or the measured one,
    whichever is larger."""
    if notice.terminate_at is not None:
        window = max(0.0, notice.terminate_at - notice.noticed_at)
    elif notice.provider in ("aws", "gcp"):
        window = spot.notice_for(notice.provider)
    else:
        raise SpotError(f"a {notice.provider} notice must name its termination time")
    return DrainBudget(
        notice_seconds=window,
        detection_delay_seconds=max(spot.detection_delay_seconds, notice.detection_delay),
        ingress_removal_seconds=spot.ingress_removal_seconds,
        safety_margin_seconds=spot.safety_margin_seconds,
    )


def scale_spot(spot: Spot, factor: float) -> Spot:
    """`spot` with every duration multiplied by `factor` (drills compress 120 s into seconds)."""
    if not 0 < factor <= 1:
        raise SpotError(f"time scale must be in (0, 1], got {factor!r}")
    windows = spot.notice_seconds.model_copy(
        update={
            "aws": spot.notice_seconds.aws * factor,
            "gcp": spot.notice_seconds.gcp * factor,
        }
    )
    return spot.model_copy(
        update={
            "notice_seconds": windows,
            "detection_delay_seconds": spot.detection_delay_seconds * factor,
            "ingress_removal_seconds": spot.ingress_removal_seconds * factor,
            "safety_margin_seconds": spot.safety_margin_seconds * factor,
            "notice_to_draining_p95_seconds": spot.notice_to_draining_p95_seconds * factor,
            "readiness_timeout_seconds": spot.readiness_timeout_seconds * factor,
        }
    )


# ---- triage ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class InflightView:
    """What triage knows of one in-flight request."""

    request_id: str
    generated_tokens: int
    max_tokens: int | None
    tpot_seconds: float | None
    streaming: bool = True
    retry_safe: bool = True


@dataclass(frozen=True)
class TriageDecision:
    """Continue or abort one request, with the numbers behind it."""

    request_id: str
    action: Literal["continue", "abort"]
    remaining_tokens: int
    tpot_seconds: float
    estimated_seconds: float
    limit_seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "request_id": self.request_id,
            "action": self.action,
            "remaining_tokens": self.remaining_tokens,
            "tpot_seconds": round(self.tpot_seconds, 6),
            "estimated_seconds": round(self.estimated_seconds, 6),
            "limit_seconds": round(self.limit_seconds, 6),
        }


def build_triage(
    requests: Sequence[InflightView],
    budget_seconds: float,
    continue_factor: float,
    default_tpot_seconds: float,
    unknown_remaining_tokens: int,
) -> list[TriageDecision]:
    """Continue a request when remaining tokens x TPOT <= continue_factor x budget, else abort.

    A request without `max_tokens` is assumed to have `unknown_remaining_tokens` left; one whose
    TPOT is not measured yet uses `default_tpot_seconds`."""
    limit = continue_factor * max(0.0, budget_seconds)
    out = []
    for request in requests:
        tpot = request.tpot_seconds if request.tpot_seconds else default_tpot_seconds
        if request.max_tokens is None:
            remaining = unknown_remaining_tokens
        else:
            remaining = max(0, request.max_tokens - request.generated_tokens)
        estimated = remaining * tpot
        action: Literal["continue", "abort"] = "continue" if estimated <= limit else "abort"
        out.append(TriageDecision(request.request_id, action, remaining, tpot, estimated, limit))
    return out


def aborted_ratio(decisions: Sequence[TriageDecision]) -> float:
    """Share of the triaged requests that were aborted (0 when nothing was in flight)."""
    if not decisions:
        return 0.0
    return sum(1 for d in decisions if d.action == "abort") / len(decisions)


# ---- the request ledger ---------------------------------------------------------------------

LedgerStatus = Literal["running", "interrupted", "retrying", "completed"]


@dataclass(frozen=True)
class LedgerEntry:
    """One request in the gateway's ledger (a Redis hash per request id)."""

    request_id: str
    attempt: int
    served_prefix_tokens: int
    model_revision: str
    prompt_fingerprint: str
    retry_safe: bool
    interruption_reason: str
    status: LedgerStatus
    node: str = ""
    served_prefix: str = ""
    max_tokens: int | None = None
    updated_at: float = 0.0

    def to_fields(self) -> dict[str, str]:
        """A flat string mapping (a Redis hash)."""
        out = {
            "request_id": self.request_id,
            "attempt": str(self.attempt),
            "served_prefix_tokens": str(self.served_prefix_tokens),
            "model_revision": self.model_revision,
            "prompt_fingerprint": self.prompt_fingerprint,
            "retry_safe": "1" if self.retry_safe else "0",
            "interruption_reason": self.interruption_reason,
            "status": self.status,
            "node": self.node,
            "served_prefix": self.served_prefix,
            "updated_at": repr(self.updated_at),
        }
        if self.max_tokens is not None:
            out["max_tokens"] = str(self.max_tokens)
        return out

    @classmethod
    def from_fields(cls, raw: Mapping[str, str]) -> LedgerEntry:
        """Decode `to_fields` output; SpotError when a field is missing or malformed."""
        try:
            status = raw["status"]
            if status not in ("running", "interrupted", "retrying", "completed"):
                raise ValueError(f"status {status!r}")
            max_tokens = raw.get("max_tokens")
            return cls(
                request_id=raw["request_id"],
                attempt=int(raw["attempt"]),
                served_prefix_tokens=int(raw.get("served_prefix_tokens", "0")),
                model_revision=raw.get("model_revision", "unknown"),
                prompt_fingerprint=raw["prompt_fingerprint"],
                retry_safe=raw.get("retry_safe") == "1",
                interruption_reason=raw.get("interruption_reason", ""),
                status=status,  # type: ignore[arg-type]
                node=raw.get("node", ""),
                served_prefix=raw.get("served_prefix", ""),
                max_tokens=None if max_tokens in (None, "") else int(max_tokens),
                updated_at=float(raw.get("updated_at", "0")),
            )
        except (KeyError, ValueError) as exc:
            raise SpotError(f"unreadable ledger entry: {exc!r}") from None


def build_prompt_fingerprint(payload: Mapping[str, Any]) -> str:
    """SHA-256 of the request as the model sees it (stream flags and `user` left out), so a
    retry can prove it is the same request."""
    relevant = {k: v for k, v in payload.items() if k not in _NOT_FINGERPRINTED}
    text = json.dumps(relevant, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def is_retry_safe(payload: Mapping[str, Any], header: str | None) -> bool:
    """A request may run twice unless the client says `false`, or it offers tools (a tool call
    may have side effects) and the client did not say `true`."""
    if header is not None:
        value = header.strip().lower()
        if value in ("false", "0", "no"):
            return False
        if value in ("true", "1", "yes"):
            return True
    return not any(payload.get(name) for name in _SIDE_EFFECT_FIELDS)


def requested_max_tokens(payload: Mapping[str, Any]) -> int | None:
    """`max_completion_tokens` or `max_tokens` of a request, when it is a positive integer."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def build_resume_payload(
    payload: Mapping[str, Any], prefix: str, served_tokens: int
) -> dict[str, Any] | None:
    """The request that continues after `prefix` (vLLM: the prefix as an open assistant message,
    `continue_final_message`), with max_tokens lowered by what was served; None when the request
    is not a chat completion or nothing is left to generate."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not prefix:
        return None
    out = dict(payload)
    out["messages"] = [*messages, {"role": "assistant", "content": prefix}]
    out["continue_final_message"] = True
    out["add_generation_prompt"] = False
    for name in ("max_completion_tokens", "max_tokens"):
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            left = value - served_tokens
            if left <= 0:
                return None
            out[name] = left
    return out


# ---- the streaming retry contract -----------------------------------------------------------


@dataclass(frozen=True)
class SpotErrorInfo:
    """The SSE error event that ends a stream aborted by a preemption, as a client reads it."""

    message: str
    recoverable: bool
    retry_safe: bool
    request_id: str
    attempt: int
    node: str
    served_prefix_tokens: int
    resume_header: str | None
    retry_after_ms: int
    extra: Mapping[str, Any] = field(default_factory=dict)


def build_spot_error(
    request_id: str,
    node: str,
    attempt: int,
    served_prefix_tokens: int,
    retry_safe: bool,
    resumable: bool,
    retry_after_ms: int,
    reason: str,
) -> dict[str, Any]:
    """The error object (OpenAI's `{"error": {...}}` shape, with the retry contract's fields)."""
    recoverable = retry_safe
    if not retry_safe:
        hint = "the request is not retry-safe: the gateway will not run it again"
    elif resumable:
        hint = f"resend the same request with {RESUME_HEADER}: {request_id} to resume it"
    else:
        hint = f"resend the same request with {RESUME_HEADER}: {request_id}; it is regenerated"
    return {
        "error": {
            "message": f"replica {node} is being preempted ({reason}); {hint}",
            "type": SPOT_ERROR_TYPE,
            "code": 503,
            "param": None,
            "recoverable": recoverable,
            "retry_safe": retry_safe,
            "request_id": request_id,
            "attempt": attempt,
            "node": node,
            "served_prefix_tokens": served_prefix_tokens,
            "retry": {
                "after_ms": retry_after_ms,
                "header": RESUME_HEADER if recoverable else None,
                "value": request_id if recoverable else None,
                "resumes_after_prefix": bool(recoverable and resumable),
            },
        }
    }


def render_sse_error(error: Mapping[str, Any]) -> bytes:
    """The error event followed by `[DONE]`: the stream ends cleanly, not by a cut connection."""
    body = json.dumps(error, separators=(",", ":")).encode()
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"


def parse_spot_error(data: Any) -> SpotErrorInfo | None:
    """The spot error in a decoded SSE `data` object, or None when it is not one."""
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if not isinstance(error, dict) or error.get("type") != SPOT_ERROR_TYPE:
        return None
    retry = error.get("retry") if isinstance(error.get("retry"), dict) else {}
    assert isinstance(retry, dict)
    try:
        return SpotErrorInfo(
            message=str(error.get("message", "")),
            recoverable=error.get("recoverable") is True,
            retry_safe=error.get("retry_safe") is True,
            request_id=str(error["request_id"]),
            attempt=int(error.get("attempt", 1)),
            node=str(error.get("node", "")),
            served_prefix_tokens=int(error.get("served_prefix_tokens", 0)),
            resume_header=retry.get("header") if isinstance(retry.get("header"), str) else None,
            retry_after_ms=int(retry.get("after_ms", 0)),
            extra=dict(error),
        )
    except (KeyError, TypeError, ValueError):
        return None


# ---- cloud metadata formats -----------------------------------------------------------------


def format_metadata_time(unix: float) -> str:
    """AWS metadata's time format: `2017-09-18T08:22:00Z` (UTC, whole seconds)."""
    return datetime.fromtimestamp(math.floor(unix), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_metadata_time(text: str) -> float:
    """Unix seconds of an AWS metadata time; SpotError when it is not one."""
    try:
        value = datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise SpotError(f"not a metadata time (YYYY-MM-DDThh:mm:ssZ): {text[:60]!r}") from None
    return value.replace(tzinfo=UTC).timestamp()


def parse_instance_action(text: str) -> tuple[str, float]:
    """`spot/instance-action`'s `{"action", "time"}` as (action, unix time); SpotError otherwise."""
    try:
        data = json.loads(text)
        action, when = data["action"], data["time"]
    except (ValueError, KeyError, TypeError):
        raise SpotError(f"not an instance-action document: {text[:120]!r}") from None
    if action not in ("terminate", "stop", "hibernate") or not isinstance(when, str):
        raise SpotError(f"instance-action has an unknown action or time: {text[:120]!r}")
    return action, parse_metadata_time(when)


def parse_rebalance(text: str) -> float:
    """`events/recommendations/rebalance`'s `{"noticeTime"}` as unix time; SpotError otherwise."""
    try:
        when = json.loads(text)["noticeTime"]
    except (ValueError, KeyError, TypeError):
        raise SpotError(f"not a rebalance recommendation: {text[:120]!r}") from None
    if not isinstance(when, str):
        raise SpotError(f"rebalance noticeTime is not a time: {text[:120]!r}")
    return parse_metadata_time(when)


def parse_preempted(text: str) -> bool:
    """GCP `instance/preempted`: TRUE or FALSE; SpotError otherwise."""
    value = text.strip().upper()
    if value not in ("TRUE", "FALSE"):
        raise SpotError(f"instance/preempted is neither TRUE nor FALSE: {text[:60]!r}")
    return value == "TRUE"


__all__ = [
    "ATTEMPT_HEADER",
    "PROVIDERS",
    "REQUEST_ID_HEADER",
    "RESUMED_HEADER",
    "RESUME_HEADER",
    "RETRY_SAFE_HEADER",
    "SPOT_ERROR_TYPE",
    "TRANSITIONS",
    "DrainBudget",
    "InflightView",
    "LedgerEntry",
    "NodeRecord",
    "NodeState",
    "Notice",
    "SpotError",
    "SpotErrorInfo",
    "SpotStateError",
    "TriageDecision",
    "aborted_ratio",
    "build_drain_budget",
    "build_prompt_fingerprint",
    "build_resume_payload",
    "build_spot_error",
    "build_transition",
    "build_triage",
    "format_metadata_time",
    "is_retry_safe",
    "parse_instance_action",
    "parse_metadata_time",
    "parse_preempted",
    "parse_rebalance",
    "parse_spot_error",
    "render_sse_error",
    "requested_max_tokens",
    "scale_spot",
]
