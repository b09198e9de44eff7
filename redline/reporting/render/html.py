"""The report as one self-contained HTML page: inline SVG charts, print CSS, no external assets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from redline.reporting.gamedays import GamedayRun
from redline.reporting.render import format as f
from redline.reporting.render.charts import Chart, build_charts, signal_chart_id
from redline.slo.report import Report

TEMPLATE = "report.html.j2"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("redline.reporting", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=False,
        keep_trailing_newline=True,
    )
    env.filters.update(
        pct=f.pct,
        rate=f.rate,
        number=f.number,
        measure=f.measure,
        duration=f.duration,
        when=f.when,
        status=f.status,
        group=f.group,
        signed=f.signed,
        plain=f.plain,
        runs_detail=f.runs_detail,
        seconds=f.seconds,
        budgets=f.budgets,
    )
    return env


def render_html(
    report: Report,
    charts: Mapping[str, Chart] | None = None,
    gamedays: Sequence[GamedayRun] | None = None,
) -> str:
    """The whole report as HTML (charts built from the report unless given; a Game days
    section when game days were given)."""
    if charts is None:
        charts = build_charts(report)
    template = _environment().get_template(TEMPLATE)
    return template.render(
        r=report,
        charts=dict(charts),
        chart_id=signal_chart_id,
        gamedays=None if gamedays is None else list(gamedays),
    )
