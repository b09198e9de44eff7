"""The *Red lines* dashboard: the three SLA red lines, each as a stat and its time series."""

from __future__ import annotations

from typing import Any

from grafanalib.core import Dashboard, Target, TimeSeries

from redline.dashboards.panels import (
    ANY_EVENT,
    DATASOURCE,
    NO_THRESHOLD,
    AnnotationDef,
    DashboardDef,
    PanelDef,
    Query,
    Section,
    Step,
    alert_and_remediation_annotations,
    alert_runbook,
    assemble,
    bad_above,
    bad_below,
    measures_reroute,
    region_matcher,
    source_description,
    two_state_mapping,
)
from redline.rules.families.saturation import saturation_records
from redline.rules.model import number
from redline.rules.records import p99_record
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

SLUG = "red-lines"
OK_FAILED = two_state_mapping(("failed", "red"), ("ok", "green"))


def red_line_annotations() -> tuple[AnnotationDef, ...]:
    """Critical alerts and remediation runs, drawn on every red-line graph."""
    return alert_and_remediation_annotations("Critical alerts", 'severity="critical"', "red")


REROUTE_SHARE = "Reroute share"


def reroute_left_out(spec: Spec) -> dict[str, str]:
    """The reroute panels this spec's source cannot fill (title -> why), empty with the gateway
    (only the gateway labels a request `rerouted`)."""
    profile = spec.sources.resolve().profile
    if profile.includes_reroute:
        return {}
    why = profile.missing.get("p99_including_reroute", "no gateway in the path reroutes requests")
    return {REROUTE_SHARE.lower(): why}


def _latency(spec: Spec) -> Section:
    red = spec.red_lines.latency_p99
    limit = red.threshold_seconds
    book = alert_runbook(spec, Alert.RED_LINE_LATENCY_P99)
    quantile = f"P{number(red.quantile * 100)}"
    reroute = " incl. reroute" if measures_reroute(spec) else ""
    p99 = Query(f"max by (region) ({p99_record(spec)}{{{region_matcher()}}})", "{{region}}")
    probes = Query(
        f"min by (region, probe) ({catalog.LLM_PROBE_SUCCESS}{{{region_matcher()}}})",
        "{{region}} {{probe}}",
    )
    title = f"{quantile}{reroute} (red line {number(limit)} s)"
    panels = [PanelDef("stat", title, (p99,), book, "s", bad_above(limit), width=6)]
    if reroute_left_out(spec):
        # No gateway in the path: every request is served where it arrived, so a reroute share
        # would be a flat 0 that reads as "healthy"; the panel is left out, its place given to
        # the P99 graph (the dashboard's description says why).
        panels += [
            PanelDef("timeseries", f"{title} by region", (p99,), book, "s", bad_above(limit), 12),
            PanelDef("state", "Endpoint probes", (probes,), book, mappings=OK_FAILED, width=6),
        ]
        return Section(f"Latency {quantile}{reroute}", tuple(panels))
    # Only the gateway reroutes (an engine profile returned above): its counter is read as is.
    requests = catalog.LLM_REQUESTS_TOTAL
    total = f"sum by (region) (rate({requests}{{{region_matcher()}}}[$__rate_interval]))"
    matcher = f'{region_matcher()},rerouted="true"'
    rerouted = f"sum by (region) (rate({requests}{{{matcher}}}[$__rate_interval]))"
    # Until a request of a region has been rerouted it has no rerouted series: show 0, not
    # "No data" (the `or` keeps the regions that have one).
    share = Query(f"(\n{rerouted}\nor\n{total} * 0\n)\n/\n{total}", "{{region}}")
    panels += [
        PanelDef("timeseries", f"{title} by region", (p99,), book, "s", bad_above(limit), 18),
        PanelDef("stat", REROUTE_SHARE, (share,), book, "percentunit", width=6),
        PanelDef(
            "timeseries",
            f"{REROUTE_SHARE} by origin region",
            (share,),
            book,
            "percentunit",
            width=12,
        ),  # fmt: skip
        PanelDef("state", "Endpoint probes", (probes,), book, mappings=OK_FAILED, width=6),
    ]
    return Section(f"Latency {quantile}{reroute}", tuple(panels))


BREAKER_STATES = (
    {
        "type": "value",
        "options": {
            "0": {"text": "closed", "color": "green", "index": 0},
            "1": {"text": "half-open", "color": "yellow", "index": 1},
            "2": {"text": "open", "color": "red", "index": 2},
        },
    },
)
"""The breaker panel's encoding: 0 closed, 1 half-open (probing), 2 open."""


def _breakers(spec: Spec) -> Section:
    """Each region's circuit breaker in the gateway (closed, half-open, open) and its
    transitions: an open breaker is why a region gets no traffic without a routing override."""
    book = alert_runbook(spec, Alert.GATEWAY_BREAKER_OPEN)
    state = catalog.LLM_GATEWAY_BREAKER_STATE
    matcher = region_matcher()
    # max over the gateways: a region is shown open when any gateway skips it.
    encoded = (
        f'2 * max by (region) ({state}{{{matcher},state="open"}})\n'
        f'+ on (region) max by (region) ({state}{{{matcher},state="half_open"}})'
    )
    opened = (
        f"sum by (region) (increase({catalog.LLM_GATEWAY_BREAKER_TRANSITIONS_TOTAL}"
        f'{{{matcher},to="open"}}[$__range]))'
    )
    breakers = spec.breakers
    description = (
        f"Open above {breakers.error_rate:.0%} failed attempts or a P99 over "
        f"{number(breakers.p99_seconds)} s in {breakers.window} (at least "
        f"{breakers.min_requests} attempts); half-open after {breakers.open_for}."
    )
    return Section(
        "Circuit breakers",
        (
            PanelDef(
                "state",
                "Breaker state by region",
                (Query(encoded, "{{region}}"),),
                book,
                steps=(Step("green", None), Step("yellow", 1), Step("red", 2)),
                width=18,
                description=description,
                mappings=BREAKER_STATES,
            ),
            PanelDef(
                "stat",
                "Breaker openings (range)",
                (Query(opened, "{{region}}"),),
                book,
                "short",
                bad_above(ANY_EVENT),
                width=6,
            ),
        ),
    )


def _saturation(spec: Spec) -> Section | None:
    """The engines' saturation by region, the leading indicators of the latency red line:
    requests waiting and running, the P99 wait, the fullest KV cache, preemptions. None for a
    source without them (redline's gateway)."""
    records = saturation_records(spec)
    if not records:
        return None
    red = spec.red_lines.latency_p99
    warn = red.saturation
    book = alert_runbook(spec, Alert.ENGINE_SATURATION_RISING)
    matcher = f"{{{region_matcher()}}}"

    def by_region(record: str) -> Query:
        return Query(f"max by (region) ({record}{matcher})", "{{region}}")

    wait_limit = warn.queue_time_share * red.threshold_seconds
    candidates = (
        (catalog.ENGINE_QUEUE_RECORD, "Requests waiting in the engines", "short", NO_THRESHOLD),
        (catalog.ENGINE_RUNNING_RECORD, "Requests running (batch)", "short", NO_THRESHOLD),
        (
            catalog.engine_queue_time_record(red.window),
            f"P99 wait in the queue (warns over {number(wait_limit)} s)",
            "s",
            bad_above(wait_limit),
        ),
        (
            catalog.ENGINE_KV_CACHE_RECORD,
            f"Fullest KV cache (warns at {warn.kv_cache_usage:.0%} while preempting)",
            "percentunit",
            bad_above(warn.kv_cache_usage),
        ),
        (
            catalog.engine_preemptions_record(red.window),
            "Preemptions per second",
            "short",
            bad_above(ANY_EVENT),
        ),
    )
    panels = tuple(
        PanelDef("timeseries", title, (by_region(record),), book, unit, steps, width=8)
        for record, title, unit, steps in candidates
        if record in records
    )
    return Section("Engine saturation (leading indicators)", panels)


def _keepalive(spec: Spec) -> Section:
    keep = spec.red_lines.context_keepalive
    book = alert_runbook(spec, Alert.RED_LINE_CONTEXT_KEEPALIVE)
    ttl = Query(f"min({catalog.SESSION_CONTEXT_TTL_SECONDS})", "effective TTL")
    canary = Query(f"min({catalog.SESSION_KEEPALIVE_PROBE_SUCCESS})", "canary sessions")
    evicted = Query(
        f"sum(increase({catalog.SESSION_CONTEXT_EVICTED_TOTAL}[$__range]))", "evicted early"
    )
    title = f"Context keep-alive (min {number(keep.min_seconds)} s)"
    return Section(
        "Context keep-alive",
        (
            PanelDef("stat", title, (ttl,), book, "s", bad_below(keep.min_seconds)),
            PanelDef(
                "timeseries",
                f"{title}: effective TTL",
                (ttl,),
                book,
                "s",
                bad_below(keep.min_seconds),
                width=10,
            ),  # fmt: skip
            PanelDef("stat", "Keep-alive canary", (canary,), book, mappings=OK_FAILED, width=4),
            PanelDef(
                "stat",
                "Sessions evicted before the minimum (range)",
                (evicted,),
                book,
                "short",
                bad_above(ANY_EVENT),
                width=4,
            ),  # fmt: skip
        ),
    )


def _index(spec: Spec) -> Section:
    idx = spec.red_lines.index_consistency
    limit = idx.max_staleness_seconds
    book = alert_runbook(spec, Alert.RED_LINE_INDEX_STALENESS)
    staleness = catalog.VECTORDB_INDEX_STALENESS_SECONDS
    worst = Query(f"max({staleness})", "worst replica")
    by_replica = Query(
        f"max by (collection, replica) ({staleness})",
        "{{collection}} on {{replica}}",
    )
    title = f"Index staleness (window {number(limit)} s)"
    return Section(
        "Vector index consistency",
        (
            PanelDef("stat", title, (worst,), book, "s", bad_above(limit)),
            PanelDef(
                "timeseries",
                f"{title} by replica",
                (by_replica,),
                book,
                "s",
                bad_above(limit),
                width=18,
            ),  # fmt: skip
        ),
    )


def build_red_lines_definition(spec: Spec) -> DashboardDef:
    """The red-lines dashboard as data."""
    quantile = f"P{number(spec.red_lines.latency_p99.quantile * 100)}"
    latency = (
        f"end-to-end {quantile} including reroutes"
        if measures_reroute(spec)
        else f"{quantile} latency as the serving engine measures it"
    )
    return DashboardDef(
        slug=SLUG,
        title="Red lines",
        description=(
            f"The SLA red lines of the spec: {latency}, context keep-alive and vector-index "
            "staleness. Red marks are critical alerts, purple marks playbook runs."
            + source_description(spec, reroute_left_out(spec))
        ),
        sections=(
            _latency(spec),
            # Breakers live in redline's gateway: without it in the path there are none.
            *((_breakers(spec),) if spec.breakers.enabled and not reroute_left_out(spec) else ()),
            *(section for section in (_saturation(spec),) if section is not None),
            _keepalive(spec),
            _index(spec),
        ),
        annotations=red_line_annotations(),
        variables=("region",),
    )


class ExemplarTarget(Target):  # type: ignore[misc]
    """A Prometheus target whose exemplars Grafana draws (grafanalib has no such field)."""

    def to_json_data(self) -> dict[str, Any]:
        """The target's JSON with `exemplar: true`."""
        data: dict[str, Any] = super().to_json_data()
        data["exemplar"] = True
        return data


def exemplar_query(spec: Spec) -> str:
    """The latency quantile over the gateway's raw histogram buckets: exemplars (trace ids) live
    on raw series, never on recorded ones."""
    quantile = number(spec.red_lines.latency_p99.quantile)
    buckets = catalog.LLM_REQUEST_DURATION_SECONDS.bucket
    return (
        f"histogram_quantile({quantile}, sum by (le, region) "
        f"(rate({buckets}{{{region_matcher()}}}[$__rate_interval])))"
    )


def _add_exemplars(spec: Spec, dashboard: Dashboard) -> None:
    """Give the P99-by-region graph a target with exemplars, each a link to its trace (the
    data source's exemplarTraceIdDestinations: the spec's tracing.trace_url_template)."""
    quantile = f"P{number(spec.red_lines.latency_p99.quantile * 100)}"
    for panel in dashboard.panels:
        if isinstance(panel, TimeSeries) and panel.title.startswith(quantile):
            refid = chr(ord("A") + len(panel.targets))
            legend = "{{region}} raw buckets (exemplars: traces)"
            panel.targets.append(
                ExemplarTarget(
                    expr=exemplar_query(spec),
                    legendFormat=legend,
                    refId=refid,
                    datasource=DATASOURCE,
                )
            )
            return


def build_red_lines_dashboard(spec: Spec) -> Dashboard:
    """The red-lines dashboard; with redline's gateway as the source, its P99 graph shows the
    requests' trace ids as exemplars."""
    dashboard = assemble(spec, build_red_lines_definition(spec))
    if measures_reroute(spec):
        _add_exemplars(spec, dashboard)
    return dashboard
