"""How every human-readable format prints the report's numbers (one place, so they agree)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime

from redline.reporting.gamedays import GamedayBudgets
from redline.slo.report.model import Summary

NA = "n/a"


def pct(ratio: float | None, digits: int = 3) -> str:
    """A ratio as a percentage, e.g. `99.873 %`."""
    if ratio is None:
        return NA
    return f"{ratio * 100:.{digits}f} %"


def pp(change: float | None) -> str:
    """A change of a ratio in percentage points, signed."""
    if change is None:
        return NA
    return f"{change * 100:+.3f} pp"


def rate(value: float | None) -> str:
    """A burn rate, e.g. `14.40x`."""
    if value is None:
        return NA
    return f"{value:.2f}x"


def number(value: float | None) -> str:
    """A count: whole numbers with thousands separators, else 3 decimals."""
    if value is None:
        return NA
    if abs(value - round(value)) < 1e-6:
        return f"{round(value):,}"
    return f"{value:,.3f}"


def measure(value: float | None, unit: str) -> str:
    """A measured value with its unit (`0.812 s`, `0.0300`)."""
    if value is None:
        return NA
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:.4f}"


def duration(seconds: float | None) -> str:
    """A length of time, e.g. `1 h 05 m`, `25 m 00 s`, `0 s`."""
    if seconds is None:
        return NA
    total = int(round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours:02d} h {minutes:02d} m"
    if hours:
        return f"{hours} h {minutes:02d} m {secs:02d} s"
    if minutes:
        return f"{minutes} m {secs:02d} s"
    return f"{secs} s"


def seconds(value: float | None) -> str:
    """A game day's step time, to the tenth of a second (`95.0 s`), as `redline gameday` prints."""
    if value is None:
        return NA
    return f"{value:.1f} s"


def budgets(b: GamedayBudgets) -> str:
    """A game day's budgets: `detect 120 s, RTO 420 s, RPO 3 s` (those it had)."""
    parts = [("detect", b.detect_seconds), ("RTO", b.rto_seconds), ("RPO", b.rpo_seconds)]
    return ", ".join(f"{name} {value:g} s" for name, value in parts if value is not None) or NA


def when(moment: datetime | None) -> str:
    """A UTC timestamp to the minute."""
    if moment is None:
        return NA
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def day(moment: date) -> str:
    """A calendar day."""
    return moment.isoformat()


def group(labels: Mapping[str, str]) -> str:
    """A grouped SLO's group as printed: `model=a, region=eu`."""
    return ", ".join(f"{name}={value}" for name, value in labels.items())


def status(value: str) -> str:
    """A status word as printed."""
    return {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "no_data": "NO DATA"}.get(
        value, value.upper()
    )


def signed(value: float | None, unit: str) -> str:
    """A signed change of a value (`+300 s`, `-2`)."""
    if value is None:
        return NA
    if unit == "seconds":
        sign = "+" if value >= 0 else "-"
        return f"{sign}{duration(abs(value))}"
    if unit == "ratio":
        return pp(value)
    return f"{value:+g}"


def plain(value: float | None, unit: str) -> str:
    """A value of a delta row in its unit."""
    if value is None:
        return NA
    if unit == "ratio":
        return pct(value)
    if unit == "seconds":
        return duration(value)
    if unit == "count":
        return number(value)
    return f"{value:g}"


def runs_detail(summary: Summary) -> str:
    """` (1 shadow, 2 skipped)` after the run count, or nothing when there were none."""
    parts = []
    if summary.remediation_shadow_runs:
        parts.append(f"{number(summary.remediation_shadow_runs)} shadow")
    if summary.remediation_skipped_runs:
        parts.append(f"{number(summary.remediation_skipped_runs)} skipped")
    return f" ({', '.join(parts)})" if parts else ""
