"""Plain data types for Prometheus rule groups, and helpers to write PromQL from the spec."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RecordingRule:
    """`record: expr` with optional static labels."""

    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The rule as Prometheus' rule-file YAML expects it."""
        out: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclass(frozen=True)
class AlertRule:
    """An alerting rule; `for_seconds` 0 fires on the first evaluation that holds."""

    alert: str
    expr: str
    for_seconds: float
    labels: dict[str, str]
    annotations: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """The rule as Prometheus' rule-file YAML expects it."""
        out: dict[str, Any] = {"alert": self.alert, "expr": self.expr}
        if self.for_seconds:
            out["for"] = format_duration(self.for_seconds)
        out["labels"] = dict(self.labels)
        out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class RuleGroup:
    """A named group of rules evaluated together at `interval_seconds`."""

    name: str
    interval_seconds: float
    rules: tuple[RecordingRule | AlertRule, ...]

    def to_dict(self) -> dict[str, Any]:
        """The group as Prometheus' rule-file YAML expects it."""
        return {
            "name": self.name,
            "interval": format_duration(self.interval_seconds),
            "rules": [rule.to_dict() for rule in self.rules],
        }

    @property
    def alerts(self) -> tuple[AlertRule, ...]:
        """Only the alerting rules of the group."""
        return tuple(rule for rule in self.rules if isinstance(rule, AlertRule))

    @property
    def recordings(self) -> tuple[RecordingRule, ...]:
        """Only the recording rules of the group."""
        return tuple(rule for rule in self.rules if isinstance(rule, RecordingRule))


_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_duration(seconds: float) -> str:
    """The shortest exact Prometheus duration for `seconds` (e.g. 300 -> 5m, 90 -> 90s)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1 or seconds != int(seconds):
        return f"{round(seconds * 1000)}ms"
    whole = int(seconds)
    for unit, size in _UNITS:
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"  # pragma: no cover - every integer is a multiple of 1 s


def number(value: float) -> str:
    """A float literal for PromQL without binary noise (0.144, not 0.14400000000000002)."""
    return repr(round(value, 12)).removesuffix(".0")


_EXACT_DIGITS = 6
"""A bound with at most this many significant digits is matched exactly (0.8, 0.064)."""
_PREFIX_DIGITS = 8
"""A longer one by its first eight: TGI's 0.0001 x 1.5^i bounds are printed in full by the
engine (0.7481827642679213), to other trailing digits than the spec's or the profile's."""


def le_matcher(threshold: float) -> str:
    """Match a histogram bucket's `le` however the client library formatted it (1 or 1.0; a
    computed bound by its leading significant digits)."""
    text = number(threshold)
    if "e" in text:
        return f'le="{text}"'
    if "." not in text:
        return f'le=~"{text}(\\\\.0)?"'
    if len(text.replace(".", "").lstrip("0")) <= _EXACT_DIGITS:
        return f'le="{text}"'
    seen, end = 0, len(text)
    for index, char in enumerate(text):
        if char.isdigit() and (seen or char != "0"):
            seen += 1
            if seen == _PREFIX_DIGITS:
                end = index + 1
                break
    prefix = text[:end].replace(".", "\\\\.")  # `\\.` in the PromQL string: a literal dot
    return f'le=~"{prefix}[0-9]*"'


def selector(labels: dict[str, str], *extra: str) -> str:
    """A `{a="b",...}` label selector (empty string when there is nothing to match)."""
    parts = [f'{name}="{value}"' for name, value in sorted(labels.items())]
    parts.extend(extra)
    return "{" + ",".join(parts) + "}" if parts else ""
