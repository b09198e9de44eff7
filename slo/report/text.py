"""How the report writes numbers and times into its titles and messages."""

from __future__ import annotations

from datetime import UTC, datetime


def num(value: float) -> str:
    """A number as short as it reads (`%g`): 0.8, 300, 1e+06."""
    return f"{value:g}"


def utc(ts: float) -> str:
    """An epoch time as `2025-03-01 06:00 UTC`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
