"""A picture of a generated dashboard without Grafana: each panel's queries run against a real
Prometheus (with the variables substituted as Grafana would) and drawn with matplotlib on the
dashboard's own grid. The README shows one; matplotlib is only needed here (`.[dev]`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redline.dashboards.queries import GrafanaContext, all_panels, substitute
from redline.devstack.dashcheck.check import fetch_query_range
from redline.platform.prometheus import PrometheusClient, PrometheusError

GRID_COLUMNS = 24
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class PreviewError(Exception):
    """A query failed while drawing the preview."""


@dataclass(frozen=True)
class Series:
    """One line of a panel: its legend and its (time, value) points."""

    legend: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class PanelData:
    """A panel of the dashboard JSON and what its queries returned."""

    panel: Mapping[str, Any]
    series: tuple[Series, ...]


def format_legend(template: str, labels: Mapping[str, str]) -> str:
    """A Grafana legend (`{{region}} p99`) filled from a series' labels."""
    if not template:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), template)


def fetch_range(
    client: PrometheusClient, expr: str, context: GrafanaContext
) -> list[dict[str, Any]]:
    """A range query over the context's time range at `$__interval` resolution."""
    try:
        return fetch_query_range(client, expr, context)
    except PrometheusError as exc:
        raise PreviewError(f"{expr}: {exc.detail}") from None


def fetch_panels(
    client: PrometheusClient, dashboard: Mapping[str, Any], context: GrafanaContext
) -> list[PanelData]:
    """Every panel (rows included, without series) with the series its targets return."""
    found = []
    for panel in all_panels(dashboard):
        series: list[Series] = []
        for target in panel.get("targets", []):
            for item in fetch_range(client, substitute(target["expr"], context), context):
                points = tuple((float(t), float(v)) for t, v in item["values"])
                series.append(Series(format_legend(target["legendFormat"], item["metric"]), points))
        found.append(PanelData(panel, tuple(series)))
    return found


def fetch_annotation_spans(
    client: PrometheusClient, expr: str, context: GrafanaContext
) -> list[tuple[float, float]]:
    """Time spans where an annotation query returns a value (e.g. an alert firing)."""
    step = context.interval_seconds
    times = sorted(
        {
            float(t)
            for item in fetch_range(client, substitute(expr, context), context)
            for t, _ in item["values"]
        }  # fmt: skip
    )
    spans: list[tuple[float, float]] = []
    for when in times:
        if spans and when - spans[-1][1] <= step:
            spans[-1] = (spans[-1][0], when)
        else:
            spans.append((when, when))
    return [(start, end + step) for start, end in spans]


def _steps(panel: Mapping[str, Any]) -> list[tuple[str, float | None]]:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    return [(str(s["color"]), s["value"]) for s in steps]


def _color(panel: Mapping[str, Any], value: float) -> str:
    color = "tab:blue"
    for name, bound in _steps(panel):
        if bound is None or value >= bound:
            color = {"green": "tab:green", "red": "tab:red", "orange": "tab:orange"}.get(
                name, color
            )
    return color


def _format(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "∞" if value > 0 else "–"
    if unit == "percentunit":
        return f"{value * 100:.1f} %"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.1f} s"
    if unit.startswith("suffix:"):
        return f"{value:.2f}{unit.removeprefix('suffix:')}"
    return f"{value:.3g}"


def _date(timestamp: float) -> float:
    """Matplotlib's date number of a Unix time (UTC)."""
    import matplotlib.dates as mdates

    return float(mdates.date2num(datetime.fromtimestamp(timestamp, UTC)))  # type: ignore[no-untyped-call]


def _mapped(panel: Mapping[str, Any], value: float) -> str | None:
    """The text of a value mapping (`0` -> "failed"), as Grafana shows it."""
    for mapping in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        option = mapping.get("options", {}).get(f"{value:g}")
        if mapping.get("type") == "value" and option:
            return str(option["text"])
    return None


def _last(series: Series) -> float | None:
    finite = [v for _, v in series.points if math.isfinite(v)]
    return finite[-1] if finite else None


def render_png(
    title: str,
    panels: Sequence[PanelData],
    spans: Sequence[tuple[float, float]],
    path: Path,
    dpi: int = 72,
) -> None:
    """Draw the panels on the dashboard's grid (stats as numbers, series as lines with their
    thresholds, `spans` shaded red) and write a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    rows = max(p.panel["gridPos"]["y"] + p.panel["gridPos"]["h"] for p in panels)
    figure = plt.figure(figsize=(18, rows * 0.42), dpi=dpi)
    grid = figure.add_gridspec(
        rows, GRID_COLUMNS, hspace=2.2, wspace=1.5, left=0.03, right=0.99, top=0.95, bottom=0.03
    )
    figure.suptitle(title, fontsize=15, fontweight="bold", x=0.01, ha="left")
    for data in panels:
        panel, pos = data.panel, data.panel["gridPos"]
        axes = figure.add_subplot(
            grid[pos["y"] : pos["y"] + pos["h"], pos["x"] : pos["x"] + pos["w"]]
        )
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if panel["type"] == "row":
            axes.axis("off")
            axes.text(0, 0.5, panel["title"], fontsize=12, fontweight="bold", va="center")
            continue
        axes.set_title(panel["title"], fontsize=9, loc="left")
        if panel["type"] == "stat":
            axes.axis("off")
            values = [(s.legend, _last(s)) for s in data.series]
            shown = [(legend, v) for legend, v in values if v is not None][:4]
            for index, (legend, value) in enumerate(shown):
                y = 0.5 if len(shown) == 1 else 0.85 - index * 0.6 / max(1, len(shown) - 1)
                text = _mapped(panel, value) or _format(value, unit)
                if panel.get("options", {}).get("textMode") == "name":
                    text = legend
                elif len(shown) > 1:
                    text = f"{legend}: {text}"
                axes.text(0.5, y, text, ha="center", va="center",
                          fontsize=20 if len(shown) == 1 else 11,
                          color=_color(panel, value), fontweight="bold")  # fmt: skip
            continue
        for series in data.series[:8]:
            times = [_date(t) for t, _ in series.points]
            axes.plot(times, [v for _, v in series.points], linewidth=1.2, label=series.legend)
        for start, end in spans:
            axes.axvspan(_date(start), _date(end), color="tab:red", alpha=0.08)
        for _name, bound in _steps(panel):
            if bound is not None and len(_steps(panel)) > 1:
                axes.axhline(bound, color=_color(panel, bound), linestyle="--", linewidth=1)
        axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
        axes.tick_params(labelsize=7)
        if data.series:
            axes.legend(fontsize=6, loc="upper left", ncol=2, frameon=False)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
