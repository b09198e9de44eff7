"""What a benchmark reports: its figures, each a row of `make bench`'s summary table.

A benchmark module exposes `run(argv) -> list[Figure]`: it prints its own side-by-side table as
before and returns the figures that matter, each with its target and whether it was met (None
for a figure shown for information). A benchmark that cannot run here because an optional
package is missing raises `MissingDependencyError` (see `require`): the runner lists it as
skipped, not failed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

CHECK_UNIT = "check"
"""The unit of a yes/no figure (`check`): value 1 when it holds, shown as yes or no."""


class BenchmarkError(Exception):
    """A benchmark could not measure what it compares: its set-up or one of its checks failed."""


class MissingDependencyError(Exception):
    """An optional package the benchmark needs is not installed: skipped, not failed."""


@dataclass(frozen=True)
class Figure:
    """One measured figure of one benchmark, with its target and whether it was met."""

    benchmark: str
    label: str
    value: float
    unit: str
    target: str = ""
    """The target as text ("<= 2 ms"); empty for a figure shown for information."""
    met: bool | None = None
    """None: no target."""

    def shown(self) -> str:
        """The label and value as the summary table prints them."""
        if self.unit == CHECK_UNIT:
            return f"{self.label}: {'yes' if self.value else 'no'}"
        return f"{self.label}: {_number(self.value)}{' ' + self.unit if self.unit else ''}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what a benchmark's process hands the runner)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figure:
        """The figure `to_json` wrote."""
        met = data.get("met")
        return cls(
            benchmark=str(data["benchmark"]),
            label=str(data["label"]),
            value=float(data["value"]),
            unit=str(data.get("unit", "")),
            target=str(data.get("target", "")),
            met=None if met is None else bool(met),
        )


def _number(value: float) -> str:
    if value != value:  # NaN: nothing was measured
        return "n/a"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01:
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def at_most(benchmark: str, label: str, value: float, unit: str, limit: float) -> Figure:
    """A figure whose target is `value <= limit`."""
    target = f"<= {_number(limit)}{' ' + unit if unit else ''}"
    return Figure(benchmark, label, value, unit, target, value <= limit)


def below(benchmark: str, label: str, value: float, unit: str, limit: float) -> Figure:
    """A figure whose target is `value < limit`."""
    target = f"< {_number(limit)}{' ' + unit if unit else ''}"
    return Figure(benchmark, label, value, unit, target, value < limit)


def at_least(benchmark: str, label: str, value: float, unit: str, floor: float) -> Figure:
    """A figure whose target is `value >= floor`."""
    target = f">= {_number(floor)}{' ' + unit if unit else ''}"
    return Figure(benchmark, label, value, unit, target, value >= floor)


def info(benchmark: str, label: str, value: float, unit: str = "") -> Figure:
    """A figure shown for information (no target)."""
    return Figure(benchmark, label, value, unit)


def check(benchmark: str, label: str, ok: bool, target: str) -> Figure:
    """A yes/no figure (a correctness check the benchmark makes): value 1 when it holds."""
    return Figure(benchmark, label, 1.0 if ok else 0.0, CHECK_UNIT, target, ok)


def require(*modules: str, hint: str) -> None:
    """MissingDependencyError unless every top-level module in `modules` can be imported."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(f"{', '.join(missing)} not installed ({hint})")


def exit_code(figures: Sequence[Figure]) -> int:
    """1 when a figure missed its target, else 0 (a benchmark run on its own exits so)."""
    return 1 if any(figure.met is False for figure in figures) else 0
