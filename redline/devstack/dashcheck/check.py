"""Run every query of generated dashboards against a live Prometheus, as Grafana would send it.

Grafana is not needed: the template variables are filled from `label_values` over the time
range (all values selected, as the dashboards default to *All*), `$__interval`,
`$__rate_interval` and `$__range` from the range and the scrape interval, and each panel target
and annotation runs as a range query. A query passes when Prometheus accepts it and it returns at
least one finite point; an annotation query (alerts firing, playbook runs) passes when
Prometheus accepts it, since a range without events is an answer. `redline dashboards check`
and the tests use this.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.dashboards.queries import (
    GrafanaContext,
    VariableError,
    panel_queries,
    substitute,
    variable_queries,
)
from redline.platform.prometheus import (
    PrometheusClient,
    PrometheusError,
    PrometheusUnavailableError,
)


class DashboardCheckError(Exception):
    """A dashboard file cannot be read or is not a dashboard."""


@dataclass(frozen=True)
class QueryOutcome:
    """What one dashboard query returned."""

    dashboard: str
    where: str
    expr: str
    series: int = 0
    points: int = 0
    error: str | None = None
    annotation: bool = False

    @property
    def has_data(self) -> bool:
        """Accepted by Prometheus and at least one finite point."""
        return self.error is None and self.points > 0

    @property
    def ok(self) -> bool:
        """Panel queries need data; an annotation query only needs to be accepted (no events
        in the range is an answer)."""
        return self.has_data or (self.annotation and self.error is None)

    @property
    def status(self) -> str:
        """ok, none (an annotation without events), EMPTY or ERROR."""
        if self.error is not None:
            return "ERROR"
        if self.points:
            return "ok"
        return "none" if self.annotation else "EMPTY"


def load_dashboards(directory: Path) -> dict[str, dict[str, Any]]:
    """Every `*.json` dashboard of a directory by file name; DashboardCheckError when bad."""
    if not directory.is_dir():
        raise DashboardCheckError(f"{directory}: not a directory of dashboard JSON files")
    dashboards: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DashboardCheckError(f"{path}: not readable JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("panels"), list):
            raise DashboardCheckError(f"{path}: panels: a Grafana dashboard needs a panel list")
        dashboards[path.name] = data
    if not dashboards:
        raise DashboardCheckError(f"{directory}: no *.json dashboards in it")
    return dashboards


def fetch_query_range(
    client: PrometheusClient, expr: str, context: GrafanaContext
) -> list[dict[str, Any]]:
    """A range query over the context's range at `$__interval`; PrometheusError when rejected."""
    return client.range_raw(expr, context.start, context.end, context.interval_seconds)


def fetch_context(
    client: PrometheusClient,
    dashboard: Mapping[str, Any],
    start: float,
    end: float,
    scrape_interval: float,
) -> GrafanaContext:
    """The context Grafana would query with: every variable with all its values selected."""
    values = {
        v.name: client.label_values(v.label, v.match, start, end)
        for v in variable_queries(dashboard)
    }
    return GrafanaContext(start, end, scrape_interval, values)


def finite_points(result: Sequence[Mapping[str, Any]]) -> int:
    """How many finite values a range query's series hold."""
    return sum(
        1 for series in result for _, value in series["values"] if math.isfinite(float(value))
    )


def check_dashboard(
    client: PrometheusClient, name: str, dashboard: Mapping[str, Any], context: GrafanaContext
) -> list[QueryOutcome]:
    """Run every panel target and annotation query of a dashboard (a rejected query is an
    outcome; PrometheusUnavailableError when Prometheus cannot be reached)."""
    outcomes = []
    for query in panel_queries(dashboard):
        where, kind = query.where, query.annotation
        try:
            expr = substitute(query.expr, context)
            result = fetch_query_range(client, expr, context)
        except VariableError as exc:
            outcomes.append(QueryOutcome(name, where, query.expr, error=str(exc), annotation=kind))
            continue
        except PrometheusUnavailableError:
            raise
        except PrometheusError as exc:
            outcomes.append(QueryOutcome(name, where, expr, error=exc.detail, annotation=kind))
            continue
        points = finite_points(result)
        outcomes.append(QueryOutcome(name, where, expr, len(result), points, annotation=kind))
    return outcomes


def check_dashboards(
    client: PrometheusClient,
    dashboards: Mapping[str, Mapping[str, Any]],
    start: float,
    end: float,
    scrape_interval: float,
) -> list[QueryOutcome]:
    """Every query of every dashboard over one time range."""
    outcomes: list[QueryOutcome] = []
    for name, dashboard in dashboards.items():
        context = fetch_context(client, dashboard, start, end, scrape_interval)
        outcomes += check_dashboard(client, name, dashboard, context)
    return outcomes


def render_outcomes(outcomes: Sequence[QueryOutcome]) -> str:
    """One line per query (status, series, points, where) and a summary line."""
    lines = []
    for o in outcomes:
        detail = f": {o.error}" if o.error else ""
        lines.append(f"{o.status:5} {o.series:4} series {o.points:6} points  {o.dashboard} "
                     f"{o.where}{detail}")  # fmt: skip
    data = sum(1 for o in outcomes if o.has_data)
    quiet = sum(1 for o in outcomes if o.ok and not o.has_data)
    bad = len(outcomes) - data - quiet
    summary = (
        f"{data} of {len(outcomes)} queries returned data, "
        f"{quiet} annotation(s) found no events, {bad} failed"
    )
    return "\n".join([*lines, summary])
