"""Timestamps as the stack's HTTP APIs write them."""

from __future__ import annotations

from datetime import datetime


def parse_time(text: str) -> float:
    """Unix seconds of an ISO-8601 timestamp (Prometheus, Alertmanager and the receiver)."""
    value = text.strip().replace("Z", "+00:00")
    head, dot, rest = value.partition(".")
    if dot:
        # Prometheus writes nanoseconds; Python parses at most microseconds.
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        value = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(value).timestamp()
