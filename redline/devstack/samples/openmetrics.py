"""OpenMetrics text of sample series, for `promtool tsdb create-blocks-from openmetrics`.

Both samples (the report's month, the dashboards' hours) are written by `render_openmetrics`:
per family its `# TYPE` line (none for an untyped family), then every series' samples in time
order, then `# EOF`. Numbers are written exactly: integral values without a fraction, others in
Python's shortest round-trip form, infinities and NaN as OpenMetrics spells them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Series:
    """One series: its sample name (`x`, `x_total`, `x_bucket`...), labels and (time, value)s."""

    name: str
    labels: Iterable[tuple[str, str]]
    points: Iterable[tuple[float, float]]


@dataclass(frozen=True)
class Family:
    """A metric family: its name, type (None: untyped, no `# TYPE` line) and series."""

    name: str
    kind: str | None
    series: Iterable[Series]


def render_number(value: float) -> str:
    """A value or timestamp as OpenMetrics text, exactly."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer():
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_series_name(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """`name{label="value",...}` (just `name` without labels)."""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
    return f"{name}{{{inner}}}" if inner else name


def render_openmetrics(families: Iterable[Family]) -> Iterator[str]:
    """The families as OpenMetrics text, one chunk per series (a month need not fit in one
    string), `# EOF` last."""
    for family in families:
        if family.kind is not None:
            yield f"# TYPE {family.name} {family.kind}\n"
        for series in family.series:
            prefix = render_series_name(series.name, series.labels) + " "
            yield "".join(
                f"{prefix}{render_number(value)} {render_number(when)}\n"
                for when, value in series.points
            )
    yield "# EOF\n"
