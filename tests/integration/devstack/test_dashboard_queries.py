"""Every query of every dashboard runs against a real Prometheus holding hours of backfilled
sample series and recording rules: no query errors, each returns data, and the template
variables filter as Grafana would fill them.

Run per source profile: the committed dashboards over redline's gateway series, and the vLLM
profile's dashboards over vLLM's own series (no gateway), which reach the panels only through
the rules' `redline:source:` mirror and the recordings over it; and once more over the gateway
with the SLOs grouped, whose error-budget panels filter on a variable per group label."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redline.dashboards.queries import GrafanaContext, panel_queries, substitute
from redline.dashboards.render import BUILDERS, DASHBOARDS_DIR, build_dashboards, dashboard_json
from redline.devstack.dashcheck.check import (
    check_dashboard,
    fetch_context,
    fetch_query_range,
    render_outcomes,
)
from redline.devstack.samples.dashboards import RETENTION_SECONDS, WRITES_PER_SECOND, profile_spec
from redline.devstack.samples.prometheus import SamplePrometheus, start_sample_prometheus
from redline.platform.prometheus import PrometheusClient
from redline.rules.build import p99_record
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.sources import PROFILES
from redline.slo.spec import PLAYBOOK_NAMES, Spec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
HOURS = 3.0


GATEWAY = "redline-gateway"
GROUPED = "grouped-slos"
BUDGETS = "error-budgets.json"


def grouped_spec(spec: Spec) -> Spec:
    """`spec` with its first SLO grouped by model and the others by model and region."""
    slos = tuple(
        slo.model_copy(update={"group_by": ("model",) if index == 0 else ("model", "region")})
        for index, slo in enumerate(spec.slos)
    )
    return spec.model_copy(update={"slos": slos})


@pytest.fixture(scope="module", params=[GATEWAY, "vllm", GROUPED])
def spec(request: pytest.FixtureRequest) -> Spec:
    """The spec the committed dashboards are generated from, the same spec over vLLM, or with
    its SLOs grouped."""
    default = load_spec().spec
    if request.param == GATEWAY:
        return default
    if request.param == GROUPED:
        return grouped_spec(default)
    return profile_spec(default, request.param)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, spec: Spec) -> Iterator[SamplePrometheus]:
    """A real Prometheus on three hours of sample series with the rules backfilled."""
    sample = start_sample_prometheus(tmp_path_factory.mktemp("dashboards"), spec, hours=HOURS)
    yield sample
    sample.stop()


@pytest.fixture(scope="module")
def client(prometheus: SamplePrometheus) -> Iterator[PrometheusClient]:
    """A client of the Prometheus API."""
    with PrometheusClient(prometheus.service.url, timeout=30) as prom:
        yield prom


def _load(name: str, spec: Spec) -> dict[str, Any]:
    """The committed dashboard for the default spec, the built one for another spec."""
    if spec == load_spec().spec:
        data: dict[str, Any] = json.loads((ROOT / DASHBOARDS_DIR / name).read_text("utf-8"))
        return data
    return dashboard_json(build_dashboards(spec)[name], spec.sources.profile)


def _context(
    client: PrometheusClient, dashboard: dict[str, Any], prometheus: SamplePrometheus, spec: Spec
) -> GrafanaContext:
    hours = float(dashboard["time"]["from"].removeprefix("now-").removesuffix("h"))
    start, end = prometheus.end - hours * 3600, prometheus.end
    return fetch_context(client, dashboard, start, end, spec.timing.scrape_interval_seconds)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_panel_query_returns_data(
    name: str, client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    dashboard = _load(name, spec)
    context = _context(client, dashboard, prometheus, spec)
    for variable, selected in context.values.items():
        assert selected, f"{name}: variable ${variable} has no values"
    outcomes = check_dashboard(client, name, dashboard, context)
    assert len(outcomes) >= 5
    for outcome in outcomes:
        assert "$" not in outcome.expr, f"{name}: {outcome.where}: unsubstituted {outcome.expr}"
    bad = [outcome for outcome in outcomes if not outcome.has_data]
    assert not bad, f"{name}: queries without data:\n" + render_outcomes(bad)


@pytest.mark.parametrize("spec", [GROUPED], indirect=True)
def test_group_variables_filter_the_grouped_slo_panels(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    """Each group label's variable lists the groups the SLO recordings hold; every panel query
    of a grouped SLO draws one series per group, and one value selected keeps that group only."""
    grouped = [slo for slo in spec.slos if slo.group_by]
    dashboard = _load(BUDGETS, spec)
    context = _context(client, dashboard, prometheus, spec)
    assert set(context.values) == {label for slo in grouped for label in slo.group_by}
    assert context.values["model"] == ["chat"]  # the sample's one model
    assert context.values.get("region", sorted(spec.regions)) == sorted(spec.regions)
    for slo in grouped:
        queries = [
            q for q in panel_queries(dashboard) if q.where.split("'")[1].startswith(f"{slo.name}: ")
        ]
        assert len(queries) >= 11, slo.name
        for query in queries:
            result = fetch_query_range(client, substitute(query.expr, context), context)
            groups = [tuple(s["metric"][label] for label in slo.group_by) for s in result]
            assert len(groups) == len(set(groups)), f"{query.where}: a group twice: {groups}"
            for index, label in enumerate(slo.group_by):
                assert {group[index] for group in groups} == set(context.values[label]), query
                for value in context.values[label]:
                    one = GrafanaContext(
                        context.start,
                        context.end,
                        context.scrape_interval,
                        {**context.values, label: [value]},
                    )
                    some = fetch_query_range(client, substitute(query.expr, one), one)
                    assert some and {s["metric"][label] for s in some} == {value}, query.where


def test_panels_over_an_engine_read_only_its_series_through_the_recordings(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    """Over vLLM Prometheus holds none of the gateway's request series: every request panel
    that had data above read the engine's series through the recordings, which map them."""
    names = set(client.label_values("__name__", None, prometheus.start, prometheus.end))
    gateway = {catalog.LLM_REQUESTS_TOTAL.name, catalog.LLM_REQUEST_DURATION_SECONDS.bucket}
    gateway |= {catalog.LLM_GENERATED_TOKENS_TOTAL.name, catalog.LLM_REROUTES_TOTAL.name}
    if spec.sources.profile == GATEWAY:
        assert gateway <= names
        return
    assert not gateway & names
    engine = PROFILES[spec.sources.profile].series
    assert f"{engine['request_duration'].names[0]}_bucket" in names
    assert set(engine["errors"].names) <= names
    assert {p99_record(spec), catalog.MODEL_ACTIVE_VERSION_RECORD} <= names
    assert not [name for name in names if name.startswith("redline:source:")]


def test_region_variable_lists_the_spec_regions_and_filters(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    dashboard = _load("red-lines.json", spec)
    context = _context(client, dashboard, prometheus, spec)
    assert context.values["region"] == sorted(spec.regions)
    p99 = next(q for q in panel_queries(dashboard) if p99_record(spec) in q.expr)
    for region in spec.regions:
        one = GrafanaContext(
            context.start, context.end, context.scrape_interval, {"region": [region]}
        )
        result = fetch_query_range(client, substitute(p99.expr, one), one)
        assert {series["metric"]["region"] for series in result} == {region}
    both = fetch_query_range(client, substitute(p99.expr, context), context)
    assert {series["metric"]["region"] for series in both} == set(spec.regions)


def test_red_line_panels_show_the_breach_the_sample_holds(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    """The P99 panel crosses the spec's red line during the sample's latency incident, and the
    critical-alert annotation marks it: the queries measure the right thing, not just anything."""
    dashboard = _load("red-lines.json", spec)
    context = _context(client, dashboard, prometheus, spec)
    p99 = next(q for q in panel_queries(dashboard) if p99_record(spec) in q.expr)
    result = fetch_query_range(client, substitute(p99.expr, context), context)
    peak = {s["metric"]["region"]: max(float(v) for _, v in s["values"]) for s in result}
    limit = spec.red_lines.latency_p99.threshold_seconds
    assert peak[spec.regions[0]] > limit > peak[spec.regions[1]]
    alerts = next(q for q in panel_queries(dashboard) if q.where.startswith("annotation 'Critical"))
    fired = fetch_query_range(client, substitute(alerts.expr, context), context)
    assert "RedLineLatencyP99" in {series["metric"]["alertname"] for series in fired}


def _query(dashboard: dict[str, Any], where: str) -> str:
    return next(q.expr for q in panel_queries(dashboard) if where in q.where)


def test_guard_rail_panels_show_the_samples_shadow_mode_and_pause(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    """The sample keeps semantic_rollback in shadow mode and pauses freeze_and_replay for a
    while: the state panel reads exactly that per playbook, and the shadow annotation marks the
    regression's shadow run with the alert it answered (what a rollback would have rolled)."""
    dashboard = _load("remediation.json", spec)
    context = _context(client, dashboard, prometheus, spec)
    state = _query(dashboard, "'Next alert: what each playbook does'")
    result = fetch_query_range(client, substitute(state, context), context)
    seen = {s["metric"]["playbook"]: {float(v) for _, v in s["values"]} for s in result}
    assert set(seen) == set(PLAYBOOK_NAMES)
    assert seen["semantic_rollback"] == {1.0}  # shadow
    assert seen["freeze_and_replay"] == {0.0, 3.0}  # acts, paused a while
    assert seen["reroute"] == {0.0}
    shadow = _query(dashboard, "annotation 'Shadow runs'")
    marks = fetch_query_range(client, substitute(shadow, context), context)
    assert {
        (m["metric"]["playbook"], m["metric"].get("alertname"), m["metric"].get("model_version"))
        for m in marks
    } == {("semantic_rollback", "SemanticRollbackTwoSignal", "v2")}
    skipped = _query(dashboard, "'Skipped runs by reason (range)'")
    found = fetch_query_range(client, substitute(skipped, context), context)
    last = {s["metric"]["outcome"]: float(s["values"][-1][1]) for s in found}
    assert last["paused"] >= 1 and last["over_budget"] >= 1 and last["breaker_open"] == 0


def test_delta_log_panels_show_a_bounded_log(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    """Held entries level off at the retention window's writes and grow only with the freeze's
    backlog; memory follows the entries."""
    dashboard = _load("rpo.json", spec)
    context = _context(client, dashboard, prometheus, spec)
    entries = _query(dashboard, "'Delta-log entries held, per collection'")
    memory = _query(dashboard, "'Delta-log memory, per collection'")
    (held,) = fetch_query_range(client, substitute(entries, context), context)
    (used,) = fetch_query_range(client, substitute(memory, context), context)
    values = [float(v) for _, v in held["values"]]
    assert held["metric"] == {"collection": "documents"}
    level = WRITES_PER_SECOND * RETENTION_SECONDS
    assert level <= values[-1] < level + 50  # trimmed level again after the replay
    assert max(values) > level + 1000  # the freeze's backlog, replayed and trimmed
    assert min(float(v) for _, v in used["values"]) > values[0]  # bytes, more than entries


def test_preview_draws_every_panel_with_data(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec, tmp_path: Path
) -> None:
    """The README's picture: every panel of the red-lines dashboard drawn from its queries."""
    pytest.importorskip("matplotlib", reason="matplotlib comes with the dev extras")
    from redline.devstack.dashcheck.preview import fetch_annotation_spans, fetch_panels, render_png

    dashboard = _load("red-lines.json", spec)
    context = _context(client, dashboard, prometheus, spec)
    panels = fetch_panels(client, dashboard, context)
    drawn = [p for p in panels if p.panel["type"] != "row"]
    assert drawn and all(p.series for p in drawn), [p.panel["title"] for p in drawn if not p.series]
    expr = next(a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a)
    spans = fetch_annotation_spans(client, expr, context)
    assert spans and all(start < end for start, end in spans)
    out = tmp_path / "red-lines.png"
    render_png(dashboard["title"], panels, spans, out)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and out.stat().st_size > 20_000
    committed = ROOT / "docs" / "red-lines.png"
    assert committed.stat().st_size < 300_000
    assert "red-lines.png" in (ROOT / "docs" / "dashboards.md").read_text("utf-8")


def test_crdt_panels_show_the_partition_and_the_convergence(
    client: PrometheusClient, prometheus: SamplePrometheus, spec: Spec
) -> None:
    """The sample cuts the CRDT session sync for a while: both directions' lag rises past the
    RPO, the divergent sessions show, and after the heal the convergence time holds the
    partition's length."""
    dashboard = _load("rpo.json", spec)
    context = _context(client, dashboard, prometheus, spec)
    lag = next(
        q.expr
        for q in panel_queries(dashboard)
        if "'CRDT sync lag" in q.where and "by (source_region" in q.expr
    )
    directions = fetch_query_range(client, substitute(lag, context), context)
    peaks = {
        (s["metric"]["source_region"], s["metric"]["target_region"]): max(
            float(v) for _, v in s["values"]
        )
        for s in directions
        if "source_region" in s["metric"]
    }
    regions = spec.regions[:2]
    assert set(peaks) == {(regions[0], regions[1]), (regions[1], regions[0])}
    assert all(peak > spec.rpo.session_crdt.max_seconds for peak in peaks.values())
    divergent = _query(dashboard, "'Divergent sessions'")
    (found,) = fetch_query_range(client, substitute(divergent, context), context)
    values = [float(v) for _, v in found["values"]]
    assert max(values) == 6 and values[-1] == 0  # diverged, then converged
    converge = _query(dashboard, "'Time to converge (last divergence)'")
    (last,) = fetch_query_range(client, substitute(converge, context), context)
    partition = (prometheus.end - prometheus.start) * 0.03
    assert abs(float(last["values"][-1][1]) - partition) <= 60  # the window, within two steps
