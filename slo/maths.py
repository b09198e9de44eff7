"""SLO arithmetic on plain numbers: attainment, error budgets, burn rates, statuses, runs.

Pure functions only (no I/O, no clock); the report builder feeds them series read elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Literal

Status = Literal["pass", "warn", "fail", "no_data"]

WARN_BUDGET_CONSUMED = 0.75
"""A period that used at least this share of its error budget is `warn` even if it held."""

HOUR = 3600


@dataclass(frozen=True)
class Budget:
    """An error budget over some number of events."""

    allowed_bad: float  # bad events the objective allows over these events
    bad: float  # bad events seen
    consumed: float  # bad / allowed_bad (1.0 = exactly exhausted; may exceed 1)

    @property
    def remaining(self) -> float:
        """Share of the budget left (negative once overspent)."""
        return 1.0 - self.consumed


def finite(value: float | None) -> float | None:
    """`value`, or None for None/NaN/inf (Prometheus answers NaN for 0/0)."""
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return value


def attainment(bad: float, total: float) -> float | None:
    """Share of good events; None when there were no events (never a fake 100 %)."""
    if total <= 0:
        return None
    return 1.0 - bad / total


def error_budget(objective: float, bad: float, total: float) -> Budget | None:
    """The budget `total` events leave under `objective`; None without events."""
    if total <= 0:
        return None
    allowed = (1.0 - objective) * total
    return Budget(allowed_bad=allowed, bad=bad, consumed=bad / allowed)


def burn_rate(error_ratio: float, objective: float) -> float:
    """How many times faster than sustainable a bad-event share spends the budget."""
    return error_ratio / (1.0 - objective)


def slo_status(attained: float | None, objective: float, consumed: float | None) -> Status:
    """fail below the objective; warn when most of the budget is gone; pass otherwise."""
    if attained is None or consumed is None:
        return "no_data"
    if attained < objective:
        return "fail"
    if consumed >= WARN_BUDGET_CONSUMED:
        return "warn"
    return "pass"


def red_line_status(measured_seconds: float, seconds_over: float, alert_fired: bool) -> Status:
    """fail when the red line paged; warn when crossed but never long enough to page."""
    if measured_seconds <= 0:
        return "no_data"
    if alert_fired:
        return "fail"
    if seconds_over > 0:
        return "warn"
    return "pass"


def limit_status(measured: bool, worst: float | None, limit: float, above_is_bad: bool) -> Status:
    """pass when the worst value stayed within `limit`, fail otherwise (RPOs, drift)."""
    if not measured or worst is None:
        return "no_data"
    breached = worst > limit if above_is_bad else worst < limit
    return "fail" if breached else "pass"


def day_of(ts: float) -> date:
    """The UTC calendar day an hour belongs to, given the hour's end timestamp."""
    return datetime.fromtimestamp(ts - 1, UTC).date()


def hour_starts(start: float, end: float) -> list[float]:
    """End timestamps of each whole hour in [start, end)."""
    return [start + HOUR * (i + 1) for i in range(int((end - start) // HOUR))]


def delta(current: float | None, previous: float | None) -> float | None:
    """current - previous, or None when either side is unknown."""
    if current is None or previous is None:
        return None
    return current - previous


@dataclass(frozen=True)
class Run:
    """A maximal run of samples no further apart than the gap."""

    first: float
    last: float
    samples: int


def runs(timestamps: Iterable[float], max_gap: float) -> list[Run]:
    """Group sorted, de-duplicated timestamps into runs split where the spacing exceeds max_gap."""
    ordered = sorted(set(timestamps))
    found: list[Run] = []
    if not ordered:
        return found
    first = last = ordered[0]
    count = 1
    for ts in ordered[1:]:
        if ts - last > max_gap:
            found.append(Run(first, last, count))
            first, count = ts, 0
        last = ts
        count += 1
    found.append(Run(first, last, count))
    return found


def typical_spacing(timestamps: Sequence[float], default: float) -> float:
    """Median spacing of sorted timestamps (their sampling interval); `default` for < 2."""
    ordered = sorted(set(timestamps))
    gaps = sorted(b - a for a, b in zip(ordered, ordered[1:], strict=False))
    if not gaps:
        return default
    return gaps[len(gaps) // 2]


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q` quantile of values; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]
