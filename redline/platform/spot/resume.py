"""The streaming retry contract: the request headers, what makes a request retry-safe and the
same request again (its prompt fingerprint), the request that resumes after a served prefix, and
the SSE error event that ends a stream aborted by a preemption.

The error event names the request id and the header to resend it with (`x-redline-resume: <id>`).
The gateway's ledger remembers the served prefix; a retry-safe request resumes after it on another
replica when the model revision matches (vLLM's `continue_final_message`), or regenerates from
scratch when it does not. A request that is not retry-safe is never run twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
_SIDE_EFFECT_FIELDS = ("tools", "functions", "tool_choice", "function_call")
_NOT_FINGERPRINTED = frozenset({"stream", "stream_options", "user"})


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


__all__ = [
    "ATTEMPT_HEADER",
    "REQUEST_ID_HEADER",
    "RESUMED_HEADER",
    "RESUME_HEADER",
    "RETRY_SAFE_HEADER",
    "SPOT_ERROR_TYPE",
    "SpotErrorInfo",
    "build_prompt_fingerprint",
    "build_resume_payload",
    "build_spot_error",
    "is_retry_safe",
    "parse_spot_error",
    "render_sse_error",
    "requested_max_tokens",
]
