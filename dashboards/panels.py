"""Shared parts of every dashboard: template variables, panel definitions, layout and links.

Dashboards are declared as sections of `PanelDef`s (plain data); `assemble` turns them into a
grafanalib `Dashboard` with stable panel ids and a `gridPos` layout that never overlaps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from grafanalib.core import (
    Annotations,
    Dashboard,
    GridPos,
    RowPanel,
    Stat,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from redline.rules.common import runbook
from redline.rules.records import window_requests_record
from redline.slo import catalog
from redline.slo.spec import Spec

DATASOURCE_VAR = "datasource"
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${" + DATASOURCE_VAR + "}"}
"""Every panel, target, variable and annotation reads the datasource chosen in `$datasource`."""

GRID_WIDTH = 24
SCHEMA_VERSION = 39
REMEDIATION_RUNBOOK = "remediation"
"""Runbook page of the remediation panels (no single alert owns them)."""

Kind = Literal["stat", "timeseries", "state"]


@dataclass(frozen=True)
class Query:
    """One PromQL target and its legend."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Step:
    """A threshold step: from `value` upwards the colour is `color` (None: the base colour)."""

    color: str
    value: float | None

    def to_json(self) -> dict[str, Any]:
        """The step as Grafana's `fieldConfig.defaults.thresholds.steps` expects it."""
        return {"color": self.color, "value": self.value}


def bad_above(limit: float) -> tuple[Step, ...]:
    """Green up to `limit`, red above it (a latency, an age, a staleness)."""
    return (Step("green", None), Step("red", limit))


def bad_below(limit: float) -> tuple[Step, ...]:
    """Red under `limit`, green from it on (a TTL, a remaining budget, a sample count)."""
    return (Step("red", None), Step("green", limit))


NO_THRESHOLD: tuple[Step, ...] = (Step("blue", None),)

ANY_EVENT = 1e-6
"""A step for an alert's `> 0` (steps are inclusive, and `increase` extrapolates fractions)."""


@dataclass(frozen=True)
class PanelDef:
    """What one panel shows, before layout: queries, unit, thresholds and its alert's runbook."""

    kind: Kind
    title: str
    queries: tuple[Query, ...]
    runbook: str
    unit: str = "none"
    steps: tuple[Step, ...] = NO_THRESHOLD
    width: int = 6
    height: int = 6
    description: str = ""
    mappings: tuple[dict[str, Any], ...] = ()
    stat_text: Literal["auto", "value", "name", "value_and_name"] = "auto"
    bars: bool = False


@dataclass(frozen=True)
class Section:
    """A titled row of panels."""

    title: str
    panels: tuple[PanelDef, ...]


@dataclass(frozen=True)
class AnnotationDef:
    """A Prometheus annotation query drawn on every time-series panel."""

    name: str
    expr: str
    title: str
    text: str
    tags: str
    color: str

    def to_json(self) -> dict[str, Any]:
        """The annotation as Grafana's `annotations.list` expects it."""
        return {
            "datasource": DATASOURCE,
            "enable": True,
            "expr": self.expr,
            "hide": False,
            "iconColor": self.color,
            "name": self.name,
            "step": "$__interval",
            "tagKeys": self.tags,
            "textFormat": self.text,
            "titleFormat": self.title,
            "useValueForTime": False,
        }


@dataclass(frozen=True)
class DashboardDef:
    """A whole dashboard before layout."""

    slug: str
    title: str
    description: str
    sections: tuple[Section, ...]
    annotations: tuple[AnnotationDef, ...] = ()
    variables: tuple[str, ...] = ("region", "model")
    group_variables: tuple[str, ...] = ()
    """SLO group labels, each a variable of its own read from the SLO recordings."""
    tags: tuple[str, ...] = field(default=("redline",))


def alert_runbook(spec: Spec, alert: str) -> str:
    """The runbook URL the rules give `alert` (one source for rules and dashboards)."""
    return runbook(spec, alert)


def dashboard_uid(spec: Spec, slug: str) -> str:
    """A stable uid (Grafana allows 40 characters): `<slug>-<service>` or a hashed service."""
    uid = f"{slug}-{spec.service}"
    if len(uid) <= 40:
        return uid
    return f"{slug[:31]}-{hashlib.sha256(spec.service.encode()).hexdigest()[:8]}"


def region_matcher(label: str = "region") -> str:
    """The label matcher Grafana fills from the multi-valued `$region` variable."""
    return f'{label}=~"$region"'


def model_matcher() -> str:
    """The label matcher Grafana fills from the multi-valued `$model` variable."""
    return 'model=~"$model"'


def variable_matcher(label: str) -> str:
    """The matcher of `label` Grafana fills from the multi-valued variable of the same name."""
    return f'{label}=~"${label}"'


def measures_reroute(spec: Spec) -> bool:
    """True when the latency is measured end to end around cross-region reroutes: the spec says
    so and its source can (only redline's gateway sees a request leave for another region)."""
    profile = spec.sources.resolve().profile
    return spec.red_lines.latency_p99.includes_reroute and profile.includes_reroute


def has_signal(spec: Spec, signal: str) -> bool:
    """True when the spec's source profile publishes `signal` (`redline.slo.sources`)."""
    return spec.sources.resolve().series(signal) is not None


def source_description(spec: Spec, left_out: dict[str, str]) -> str:
    """A dashboard description's last sentences: the source profile, and each panel left out
    because that source cannot fill it (panel title -> why)."""
    profile = spec.sources.resolve().profile
    text = f" Source: {profile.title}, sources.profile {profile.name}."
    for title, why in left_out.items():
        text += f" Not shown: {title}, because {why}."
    return text


def group_variable_query(label: str) -> str:
    """The values of an SLO group label, read where only grouped SLOs carry it: the budget left,
    recorded for every group with events in its period (not just the last hour's)."""
    return f"label_values({catalog.SLO_ERROR_BUDGET_REMAINING_RECORD}, {label})"


def build_variables(
    spec: Spec, names: Sequence[str], group_labels: Sequence[str] = ()
) -> list[Template]:
    """`$datasource` first, then the label variables the dashboard filters on, then one per
    SLO group label."""
    queries = {
        # A recording every source writes with the catalog's `region` (an engine's own series
        # may name it otherwise).
        "region": ("Region", f"label_values({window_requests_record(spec)}, region)"),
        "model": ("Model", f"label_values({catalog.MODEL_ACTIVE_INFO}, model)"),
    }
    clash = sorted(set(names) & set(group_labels))
    if clash:
        raise ValueError(f"variables {', '.join(clash)} are both label and group variables")
    for label in group_labels:
        queries[label] = (label.replace("_", " ").capitalize(), group_variable_query(label))
    variables = [
        Template(
            name=DATASOURCE_VAR,
            label="Data source",
            query="prometheus",
            type="datasource",
            default="Prometheus",
        )
    ]
    for name in [*names, *group_labels]:
        label, query = queries[name]
        variables.append(
            Template(
                name=name,
                label=label,
                query=query,
                dataSource=DATASOURCE,
                multi=True,
                includeAll=True,
                default="$__all",
                refresh=2,  # on time-range change: a region that appears shows up
            )
        )
    return variables


def builtin_annotation() -> dict[str, Any]:
    """Grafana's own annotations and alerts, kept so the dashboard behaves like a stock one."""
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def _targets(panel: PanelDef) -> list[Target]:
    return [
        Target(
            expr=query.expr,
            legendFormat=query.legend,
            refId=chr(ord("A") + index),
            datasource=DATASOURCE,
            instant=query.instant,
        )
        for index, query in enumerate(panel.queries)
    ]


def _links(panel: PanelDef) -> list[dict[str, Any]]:
    name = panel.runbook.rsplit("/", 1)[-1]
    return [{"title": f"Runbook: {name}", "url": panel.runbook, "targetBlank": True}]


def build_panel(panel: PanelDef, panel_id: int, pos: GridPos) -> Stat | TimeSeries:
    """The grafanalib panel of a `PanelDef` at `pos`."""
    common: dict[str, Any] = {
        "title": panel.title,
        "dataSource": DATASOURCE,
        "targets": _targets(panel),
        "id": panel_id,
        "gridPos": pos,
        "links": _links(panel),
        "description": panel.description or None,
        "thresholds": [step.to_json() for step in panel.steps],
    }
    if panel.kind == "stat":
        return Stat(
            format=panel.unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            colorMode="value",
            textMode=panel.stat_text,
            mappings=list(panel.mappings),
            noValue="no data",
            **common,
        )
    threshold_line = "off" if panel.steps == NO_THRESHOLD else "line"
    series = TimeSeries(
        unit=panel.unit,
        thresholdsStyleMode=threshold_line,
        legendDisplayMode="list",
        tooltipMode="multi",
        mappings=list(panel.mappings),
        drawStyle="bars" if panel.bars else "line",
        lineInterpolation="stepAfter" if panel.kind == "state" else "linear",
        fillOpacity=60 if panel.bars else 10,
        **common,
    )
    return series


def layout(sections: Sequence[Section]) -> list[tuple[Section | PanelDef, GridPos]]:
    """Rows and panels placed left to right, wrapping at 24 columns; nothing overlaps."""
    placed: list[tuple[Section | PanelDef, GridPos]] = []
    y = 0
    for section in sections:
        placed.append((section, GridPos(h=1, w=GRID_WIDTH, x=0, y=y)))
        y += 1
        x, row_height = 0, 0
        for panel in section.panels:
            if panel.width > GRID_WIDTH:
                raise ValueError(f"panel {panel.title!r} is wider than {GRID_WIDTH} columns")
            if x + panel.width > GRID_WIDTH:
                y, x, row_height = y + row_height, 0, 0
            placed.append((panel, GridPos(h=panel.height, w=panel.width, x=x, y=y)))
            x += panel.width
            row_height = max(row_height, panel.height)
        y += row_height
    return placed


def assemble(spec: Spec, definition: DashboardDef) -> Dashboard:
    """The grafanalib `Dashboard` of a definition: ids in order, layout, variables, links."""
    panels: list[Any] = []
    for panel_id, (item, pos) in enumerate(layout(definition.sections), start=1):
        if isinstance(item, Section):
            panels.append(RowPanel(title=item.title, id=panel_id, gridPos=pos))
        else:
            panels.append(build_panel(item, panel_id, pos))
    annotations = [builtin_annotation(), *(a.to_json() for a in definition.annotations)]
    return Dashboard(
        title=f"{definition.title} · {spec.service}",
        description=definition.description,
        uid=dashboard_uid(spec, definition.slug),
        tags=[*definition.tags, spec.service],
        panels=panels,
        templating=Templating(
            list=build_variables(spec, definition.variables, definition.group_variables)
        ),
        annotations=Annotations(list=annotations),
        time=Time("now-6h", "now"),
        refresh="30s",
        schemaVersion=SCHEMA_VERSION,
        timezone="utc",
        graphTooltip=1,
        editable=False,
        links=[
            {
                "title": "redline dashboards",
                "type": "dashboards",
                "tags": ["redline", spec.service],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
    )


def alerts_annotation(name: str, matchers: str, color: str) -> AnnotationDef:
    """Firing alerts (the `ALERTS` series Prometheus writes) matching `matchers`: any firing
    within each step, so an alert shorter than the step still marks the graph (a plain selector
    reads one instant per step, and the resolved alert's staleness marker hides the rest)."""
    return AnnotationDef(
        name=name,
        expr=f'max_over_time(ALERTS{{alertstate="firing",{matchers}}}[$__interval])',
        title="{{alertname}}",
        text="{{alertname}} firing ({{severity}})",
        tags="alertname,severity,playbook",
        color=color,
    )


def two_state_mapping(zero: tuple[str, str], one: tuple[str, str]) -> tuple[dict[str, Any], ...]:
    """Value mappings of a 0/1 series: (text, color) shown for 0 and for 1."""
    return (
        {
            "type": "value",
            "options": {
                "0": {"text": zero[0], "color": zero[1], "index": 0},
                "1": {"text": one[0], "color": one[1], "index": 1},
            },
        },
    )


def alert_and_remediation_annotations(
    name: str, matchers: str, color: str
) -> tuple[AnnotationDef, AnnotationDef]:
    """Firing alerts matching `matchers`, then the remediation runs: a dashboard's usual marks."""
    return (alerts_annotation(name, matchers, color), remediation_annotation())


def remediation_annotation() -> AnnotationDef:
    """A mark wherever a playbook run finished, with its outcome."""
    return AnnotationDef(
        name="Remediation runs",
        expr=(
            "max by (playbook, outcome) "
            f"(increase({catalog.REDLINE_REMEDIATION_RUNS_TOTAL}[$__rate_interval])) > 0"
        ),
        title="{{playbook}}: {{outcome}}",
        text="playbook {{playbook}} finished: {{outcome}}",
        tags="playbook,outcome",
        color="purple",
    )
