"""What the prompt log keeps of an OpenAI request and its response: the prompt (`role: content`
per message, or `prompt`), the answer of a JSON response or of a stream's content deltas, and
the session the request belongs to."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SESSION_HEADER = "x-redline-session-id"


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def prompt_text(payload: Mapping[str, Any] | None) -> str | None:
    """The prompt of an OpenAI chat or completions request (`role: content` per message)."""
    if not payload:
        return None
    messages = payload.get("messages")
    if isinstance(messages, list):
        return "\n".join(
            f"{m.get('role', '')}: {_message_text(m.get('content'))}"
            for m in messages
            if isinstance(m, dict)
        )
    prompt = payload.get("prompt")
    if isinstance(prompt, list):
        return "\n".join(str(p) for p in prompt)
    return None if prompt is None else str(prompt)


def answer_text(body: bytes | None) -> str | None:
    """The answer of a non-streamed OpenAI response (None for a stream or no JSON)."""
    if not body:
        return None
    try:
        choices = json.loads(body).get("choices")
    except (ValueError, AttributeError):
        return None
    if not isinstance(choices, list):
        return None
    parts = []
    for choice in choices:
        if isinstance(choice, dict):
            message = choice.get("message")
            text = (
                _message_text(message.get("content"))
                if isinstance(message, dict)
                else choice.get("text")
            )
            parts.append("" if text is None else str(text))
    return "\n".join(parts)


def streamed_text(parts: Sequence[bytes]) -> str:
    """The answer of a streamed response from the raw JSON string bodies of its content deltas,
    as the gateway's stream tally keeps them (n > 1 choices come interleaved)."""
    try:
        # Whole escapes only ever sit inside one part, so the parts join into one JSON string.
        return str(json.loads(b'"' + b"".join(parts) + b'"'))
    except ValueError:
        out = []
        for raw in parts:
            with contextlib.suppress(ValueError):
                out.append(str(json.loads(b'"' + raw + b'"')))
        return "".join(out)


def session_of(
    headers: Iterable[tuple[str, str]], payload: Mapping[str, Any] | None, request_id: str
) -> str:
    """The session a request belongs to: the session header, else the payload's `user`, else
    the request itself."""
    for name, value in headers:
        if name.lower() == SESSION_HEADER and value:
            return value[:256]
    user = payload.get("user") if payload else None
    return str(user)[:256] if user else request_id
