"""Reports per source profile: the notes name the profile and what it cannot measure, and the
report's PromQL reads the catalog's names for the profile (the rules' mirror of an engine's
series), never the gateway's raw series where the profile maps them."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest

from redline.devstack.samples.dashboards import profile_spec
from redline.reporting.queries import (
    latency_exprs,
    signal_exprs,
    slo_hourly_query,
    slo_total_expr,
)
from redline.reporting.render.charts import build_charts
from redline.reporting.render.html import render_html
from redline.reporting.render.markdown import render_markdown
from redline.reporting.render.tables import render_csv_tables, render_json
from redline.rules.records import request_duration
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.report import ReportInput, SignalSeries, SloSeries, Window, build_report
from redline.slo.report.signals import signal_defs, source_notes
from redline.slo.sources import CANONICAL, PROFILES
from redline.slo.spec import Spec

H = 3600
T0 = int(datetime(2025, 3, 1, tzinfo=UTC).timestamp())
ENGINES = [name for name in PROFILES if name != "redline-gateway"]


def _spec(profile: str) -> Spec:
    default = load_spec().spec
    if profile == "redline-gateway":
        return default
    return profile_spec(default, profile, "chat" if profile == "tgi" else None)


def _report_notes(spec: Spec) -> list[str]:
    window = Window(T0, T0 + 2 * H)
    hours: dict[float, float] = {T0 + H: 1000.0, T0 + 2 * H: 1000.0}
    data = ReportInput(
        window=window,
        slos={slo.name: SloSeries(hours, dict.fromkeys(hours, 0.001)) for slo in spec.slos},
        signals={},
        notes=("P99 latency read from the recording rule x",),
    )
    report = build_report(
        spec, data, spec_source="test", prometheus="http://p", generated_at=datetime.now(UTC)
    )
    return report.notes


def test_the_gateway_report_names_its_source_and_reroutes_included() -> None:
    notes = _report_notes(_spec("redline-gateway"))
    assert notes[0] == (
        "source: redline's gateway (OpenAI-compatible, in the data path), "
        "sources.profile redline-gateway; P99 measured end to end at the gateway, "
        "cross-region reroutes included"
    )
    assert notes[1] == "P99 latency read from the recording rule x"
    assert not [n for n in notes if n.startswith("not measured")]


def test_the_vllm_report_says_what_vllm_cannot_measure() -> None:
    spec = _spec("vllm")
    notes = _report_notes(spec)
    assert notes[0].startswith(f"source: {PROFILES['vllm'].title}, sources.profile vllm,")
    assert "its own series read where they are" in notes[0]
    assert catalog.MODEL_ACTIVE_INFO.name in notes[0]
    assert notes[1].startswith(
        "not measured with vllm: P99 including cross-region reroutes — latency is measured "
        "inside the engine"
    )
    assert not any(n.startswith("not measured with vllm: errors by model") for n in notes)
    assert any(
        n.startswith(
            "errors from vllm:request_success_total, vllm:admission_rejections_total: "
            'finished_reason="error"'
        )
        for n in notes
    )
    (latency,) = [d for d in signal_defs(spec) if d.key == "latency_p99"]
    assert "reroute" not in latency.title


@pytest.mark.parametrize("profile", ENGINES)
def test_every_engine_profile_lists_each_missing_capability(profile: str) -> None:
    spec = _spec(profile)
    notes = source_notes(spec)
    assert f"sources.profile {profile}" in notes[0]
    missing = [n for n in notes if n.startswith(f"not measured with {profile}: ")]
    assert len(missing) == len(PROFILES[profile].missing)
    assert "P99 including cross-region reroutes" in missing[0]


def test_the_maturity_check_of_p99_incl_reroute_is_not_measured_without_the_gateway() -> None:
    spec = _spec("vllm")
    window = Window(T0, T0 + 2 * H)
    hours: dict[float, float] = {T0 + H: 1000.0, T0 + 2 * H: 1000.0}
    data = ReportInput(
        window=window, slos={"latency": SloSeries(hours, dict.fromkeys(hours, 0.0))}, signals={}
    )
    report = build_report(
        spec, data, spec_source="t", prometheus="http://p", generated_at=datetime.now(UTC)
    )
    checks = {c.id: c for c in report.maturity.checks}
    assert checks["latency"].status == "no_data"
    assert "sources.profile vllm" in checks["latency"].evidence
    assert checks["regions"].status == "not_met"
    assert "without cross-region reroutes" in checks["regions"].evidence


def _reads(expr: str, name: str) -> bool:
    return (
        re.search(rf"(?<![\w:]){re.escape(name)}(_bucket|_count|_sum)?(?![\w:])", expr) is not None
    )


@pytest.mark.parametrize("profile", ENGINES)
def test_report_queries_read_the_mirror_not_the_gateways_series(profile: str) -> None:
    spec = _spec(profile)
    exprs = [slo_hourly_query(spec, slo) for slo in spec.slos]
    exprs += [slo_total_expr(spec, slo, "1h") for slo in spec.slos]
    for recorded in (True, False):
        found = latency_exprs(spec, 60, recorded)
        exprs += [found.flag, found.peak, found.value]
    gateway = [metric.name for metric in CANONICAL.values()]
    for expr in exprs:
        assert not [name for name in gateway if _reads(expr, name)], expr
    joined = "\n".join(exprs)
    engine = PROFILES[spec.sources.profile].series
    assert request_duration(spec) == engine["request_duration"].names[0]
    assert f"{request_duration(spec)}_count" in joined
    assert all(name in joined for name in engine["requests"].names)


def test_the_gateway_report_reads_the_gateways_series() -> None:
    spec = _spec("redline-gateway")
    raw = latency_exprs(spec, 60, recorded=False)
    assert f"{catalog.LLM_REQUEST_DURATION_SECONDS.bucket}{{le=" in raw.flag


@pytest.mark.parametrize(
    ("profile", "keys"),
    [
        ("redline-gateway", []),
        ("vllm", ["engine_queue_time", "engine_kv_cache"]),
        ("sglang", ["engine_queue_time", "engine_kv_cache"]),
        ("tgi", ["engine_queue_time"]),
        ("nim", ["engine_kv_cache"]),
        ("otel-genai", []),
    ],
)
def test_the_report_follows_the_engines_saturation_where_the_source_has_it(
    profile: str, keys: list[str]
) -> None:
    """Engine profiles add their saturation lines to the report (the warning's thresholds, read
    from the saturation family's records); the gateway and OpenTelemetry have none."""
    spec = _spec(profile)
    defs = [d for d in signal_defs(spec) if d.kind == "saturation"]
    assert [d.key for d in defs] == keys
    for defn in defs:
        assert defn.alert == "EngineSaturationRising"
        assert defn.series.startswith("redline:engine_")
        assert signal_exprs(spec, defn, 60).value == f"max({defn.series})"


def test_a_saturated_hour_shows_in_every_format() -> None:
    """An hour in which the P99 wait passed its line: the Markdown, CSV and JSON carry it."""
    spec = _spec("vllm")
    window = Window(T0, T0 + 2 * H)
    hours = (T0 + H, T0 + 2 * H)
    wait = SignalSeries(15.0, dict(zip(hours, (0.1, 0.9), strict=True)),
                        dict(zip(hours, (0.0, 40.0), strict=True)),
                        dict.fromkeys(hours, 240.0))  # fmt: skip
    data = ReportInput(
        window=window,
        slos={
            slo.name: SloSeries(dict.fromkeys(hours, 1000.0), dict.fromkeys(hours, 0.0))
            for slo in spec.slos
        },  # fmt: skip
        signals={"engine_queue_time": [("", wait)]},
    )
    report = build_report(
        spec, data, spec_source="test", prometheus="http://p", generated_at=datetime.now(UTC)
    )
    [queue, kv] = report.saturation
    assert queue.key == "engine_queue_time" and queue.seconds_over == 600.0
    assert (queue.peak, queue.status, kv.status) == (0.9, "warn", "no_data")
    assert report.summary.status == "pass"  # a warning is no failed red line
    markdown = render_markdown(report)
    assert "## Engine saturation (leading indicators)" in markdown
    assert "| Engine P99 wait in the queue (5m) | 0.400 s | WARN | 0.900 s |" in markdown
    assert "engine_queue_time" in render_csv_tables(report)["saturation.csv"]
    html = render_html(report, build_charts(report))
    assert '<section id="saturation">' in html and "Engine P99 wait in the queue" in html
    assert json.loads(render_json(report))["saturation"][0]["seconds_over"] == 600.0
