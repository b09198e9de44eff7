"""Every PromQL query a generated dashboard sends, and Grafana's template-variable substitution,
so the checks and the README's picture run exactly what Grafana would."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)$")
_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


class VariableError(Exception):
    """A query names a template variable the context does not define."""


@dataclass(frozen=True)
class PanelQuery:
    """One query of a dashboard: where it comes from and its raw expression."""

    where: str  # e.g. "panel 3 'Reroute share' target A" or "annotation 'Remediation runs'"
    expr: str
    instant: bool = False
    annotation: bool = False
    """An annotation query returns events (alerts firing, runs): none in a range is normal."""


@dataclass(frozen=True)
class VariableQuery:
    """A `label_values(metric, label)` template variable."""

    name: str
    label: str
    match: str | None
    multi: bool


@dataclass(frozen=True)
class GrafanaContext:
    """What Grafana knows when it sends a query: the time range, the panel width in points,
    the datasource's scrape interval and the variables' selected values."""

    start: float
    end: float
    scrape_interval: float
    values: Mapping[str, Sequence[str]]
    max_data_points: int = 100

    @property
    def interval_seconds(self) -> int:
        """`$__interval`: the range over the panel's points, never under the scrape interval."""
        raw = (self.end - self.start) / self.max_data_points
        return max(math.ceil(self.scrape_interval), math.ceil(raw))

    @property
    def rate_interval_seconds(self) -> int:
        """`$__rate_interval`: max(`$__interval` + scrape interval, 4 x scrape interval)."""
        scrape = math.ceil(self.scrape_interval)
        return max(self.interval_seconds + scrape, 4 * scrape)

    @property
    def range_seconds(self) -> int:
        """`$__range` in whole seconds."""
        return max(1, round(self.end - self.start))


def panel_queries(dashboard: Mapping[str, Any]) -> Iterator[PanelQuery]:
    """Every target of every panel (rows included) and every Prometheus annotation."""
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield PanelQuery(
                f"panel {panel['id']} {panel['title']!r} target {target['refId']}",
                target["expr"],
                bool(target.get("instant")),
            )
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            yield PanelQuery(
                f"annotation {annotation['name']!r}", annotation["expr"], annotation=True
            )


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def all_panels(dashboard: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every panel of a dashboard, the panels of collapsed rows included."""
    return list(_panels(dashboard.get("panels", [])))


def variable_queries(dashboard: Mapping[str, Any]) -> list[VariableQuery]:
    """The `label_values` template variables of a dashboard."""
    found = []
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        match = _LABEL_VALUES.match(str(variable["query"]).strip())
        if match is None:
            raise VariableError(
                f"variable {variable['name']}: unsupported query {variable['query']}"
            )
        multi = bool(variable.get("multi") or variable.get("includeAll"))
        found.append(VariableQuery(variable["name"], match.group(2), match.group(1), multi))
    return found


def regex_escape(value: str) -> str:
    """Escape a value as Grafana's Prometheus datasource does inside a regex matcher."""
    return _REGEX_SPECIAL.sub(r"\\\\\1", value)


def format_values(values: Sequence[str], multi: bool) -> str:
    """A variable's selection as Grafana writes it: one raw value, or `(a|b)` escaped."""
    if not multi:
        return values[0] if values else ""
    escaped = [regex_escape(value) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, context: GrafanaContext, multi: Mapping[str, bool] | None = None) -> str:
    """`expr` with `$__interval`, `$__rate_interval`, `$__range` and the variables filled in."""
    builtins = {
        "__interval": f"{context.interval_seconds}s",
        "__rate_interval": f"{context.rate_interval_seconds}s",
        "__range": f"{context.range_seconds}s",
        "__range_s": str(context.range_seconds),
        "__interval_ms": str(context.interval_seconds * 1000),
    }
    multi = multi or {}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in builtins:
            return builtins[name]
        if name not in context.values:
            raise VariableError(f"no value for ${name} in {expr!r}")
        return format_values(context.values[name], multi.get(name, True))

    return _VARIABLE.sub(replace, expr)
