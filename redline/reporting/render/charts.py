"""Inline SVG charts of the report (matplotlib, no pyplot state, deterministic output)."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import matplotlib
from matplotlib import dates as mdates
from matplotlib.figure import Figure

from redline.slo.report import Report, SignalReport, SloReport

_RC: Any = {
    "svg.hashsalt": "redline",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_INK = "#1f2937"
_LINE = "#2563eb"
_BAD = "#dc2626"
_WARN = "#d97706"
_HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Chart:
    """One chart: an id (for anchors), a caption and its SVG markup."""

    id: str
    title: str
    svg: str


def _svg(fig: Figure, chart_id: str) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    # Several charts share one page: keep their clip-path and glyph ids apart.
    text = re.sub(r'id="([^"]+)"', rf'id="{chart_id}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{chart_id}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{chart_id}-\1"', text)
    return text.replace("<svg ", f'<svg role="img" aria-label="{chart_id}" ', 1)


def _x(moments: list[datetime]) -> list[float]:
    return [float(v) for v in mdates.date2num(moments)]  # type: ignore[no-untyped-call]


def _x1(moment: datetime) -> float:
    return float(mdates.date2num(moment))  # type: ignore[no-untyped-call]


def _figure() -> Figure:
    fig = Figure(figsize=(7.2, 2.4), dpi=96)
    return fig


def _time_axis(ax: matplotlib.axes.Axes) -> None:
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    ax.grid(True, axis="y", color="#e5e7eb", linewidth=0.6)
    ax.tick_params(colors=_INK)


def budget_chart(report: Report) -> Chart | None:
    """Error budget remaining over the period, one line per SLO."""
    slos = [s for s in report.slos if s.budget_allowed_bad]
    if not slos:
        return None
    with matplotlib.rc_context(_RC):
        fig = _figure()
        ax = fig.subplots()
        for slo in slos:
            allowed = slo.budget_allowed_bad or 1.0
            spent = 0.0
            xs, ys = [report.period.start], [100.0]
            for hour in slo.hourly:
                spent += hour.bad or 0.0
                xs.append(hour.start + _HOUR)
                ys.append(100.0 * (1 - spent / allowed))
            ax.plot(_x(xs), ys, linewidth=1.4, label=slo.name)
        ax.axhline(0, color=_BAD, linewidth=0.8, linestyle="--")
        ax.set_ylabel("budget left (%)")
        ax.legend(loc="lower left", frameon=False)
        _time_axis(ax)
        return Chart("chart-budget", "Error budget remaining", _svg(fig, "chart-budget"))


def burn_chart(slo: SloReport) -> Chart | None:
    """Hourly burn rate of one SLO, with the 1x and 14.4x lines."""
    points = [
        (h.start, (h.bad or 0.0) / h.events / (1 - slo.objective)) for h in slo.hourly if h.events
    ]
    if not points:
        return None
    chart_id = f"chart-burn-{slo.name}"
    with matplotlib.rc_context(_RC):
        fig = _figure()
        ax = fig.subplots()
        ax.step(
            _x([p[0] for p in points]),
            [p[1] for p in points],
            where="post",
            color=_LINE,
            linewidth=1.0,
        )
        ax.axhline(
            1.0, color=_WARN, linewidth=0.8, linestyle="--", label="1x (budget lasts the period)"
        )
        ax.axhline(14.4, color=_BAD, linewidth=0.8, linestyle="--", label="14.4x (page)")
        ax.set_ylabel("burn rate (1 h)")
        ax.legend(loc="upper right", frameon=False)
        _time_axis(ax)
        return Chart(chart_id, f"SLO {slo.name}: hourly burn rate", _svg(fig, chart_id))


def signal_chart_id(sig: SignalReport) -> str:
    """The id of a signal's chart."""
    suffix = f"-{re.sub(r'[^a-z0-9]+', '-', sig.instance.lower())}" if sig.instance else ""
    return f"chart-{sig.key.replace('_', '-')}{suffix}"


def signal_chart(sig: SignalReport) -> Chart | None:
    """Worst value of each hour against the line; hours past it shaded."""
    points = [(h.start, h.peak) for h in sig.hourly if h.peak is not None]
    if not points:
        return None
    chart_id = signal_chart_id(sig)
    with matplotlib.rc_context(_RC):
        fig = _figure()
        ax = fig.subplots()
        ax.plot(_x([p[0] for p in points]), [p[1] for p in points], color=_LINE, linewidth=1.0)
        ax.axhline(sig.threshold, color=_BAD, linewidth=0.8, linestyle="--", label=sig.objective)
        for hour in sig.hourly:
            if hour.seconds_over > 0:
                ax.axvspan(
                    _x1(hour.start), _x1(hour.start + _HOUR), color=_BAD, alpha=0.25, linewidth=0
                )
        ax.set_ylabel(
            ("worst " if sig.above_is_bad else "lowest ")
            + (f"({sig.unit})" if sig.unit else "value")
        )
        ax.legend(loc="upper right", frameon=False)
        _time_axis(ax)
        label = sig.title + (f" ({sig.instance})" if sig.instance else "")
        return Chart(chart_id, f"{label}: hourly worst value", _svg(fig, chart_id))


def build_charts(report: Report) -> dict[str, Chart]:
    """Every chart of the report by id (sections look theirs up)."""
    charts: list[Chart | None] = [budget_chart(report)]
    charts += [burn_chart(slo) for slo in report.slos]
    charts += [
        signal_chart(sig)
        for sig in [*report.red_lines, *report.rpos, *report.drift, *report.saturation]
    ]
    return {c.id: c for c in charts if c is not None}
