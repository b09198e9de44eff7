"""The tally of a streamed (SSE) answer as it passes through: usage, content chunks, timing.

Events are forwarded whole, so the gateway can always end a stream with an event of its own.
Only events that carry a usage object are JSON-decoded; content chunks are recognised by their
`"content":"<non-empty>"` (or `"text":`) member, so streaming costs no JSON decoding per token.
"""

from __future__ import annotations

import json
import re
import time

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_CONTENT_MEMBER = re.compile(rb'"(?:content|text)"\s*:\s*"((?:[^"\\]|\\.)+)"')
_USAGE_MEMBER = re.compile(rb'"usage"\s*:\s*\{')


def int_or_none(value: object) -> int | None:
    """`value` when it is a non-negative int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class StreamTally:
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

        A `"content":"..."` member cannot occur unescaped inside a JSON string, so matching it
        on the raw bytes is exact."""
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
            self.prompt_tokens = int_or_none(usage.get("prompt_tokens"))
            self.completion_tokens = int_or_none(usage.get("completion_tokens"))
            if self.strip_usage and payload.get("choices") == []:
                keep = False
        return keep
