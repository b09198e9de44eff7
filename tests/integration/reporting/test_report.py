"""SLO reports against a real Prometheus holding a backfilled month with known incidents.

Every expected number is computed here from the injected series (numpy over the counters and
gauges the sample wrote), never from Prometheus, and compared with the report's.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from redline.devstack.processes import Service, free_port
from redline.devstack.samples.report import (
    LATENCY,
    MINUTE,
    REGIONS,
    Sample,
    backfill,
    build_sample,
    ts,
    write_openmetrics,
)
from redline.reporting.render import format as fmt
from redline.reporting.render.html import render_html
from redline.reporting.render.markdown import render_markdown
from redline.reporting.render.tables import render_csv_tables
from redline.reporting.run import generate_report
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.report import Report, Window
from redline.slo.spec import Spec
from tests.support.report import sample_blocks, sample_prometheus

pytestmark = pytest.mark.integration

MONTH = Window(ts("2025-03-01T00:00"), ts("2025-03-31T00:00"))
WEEK = Window(ts("2025-03-24T00:00"), ts("2025-03-31T00:00"))
PP = 1e-4  # 0.01 percentage points, as a ratio
STEP = 60


@pytest.fixture(scope="module")
def sample_and_blocks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Sample, Path]:
    return sample_blocks(tmp_path_factory)


@pytest.fixture(scope="module")
def prometheus(
    sample_and_blocks: tuple[Sample, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    with sample_prometheus(sample_and_blocks[1], tmp_path_factory.mktemp("prom")) as service:
        yield service


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec(None).spec


@pytest.fixture(scope="module")
def month(prometheus: Service, spec: Spec) -> Report:
    return generate_report(prometheus.url, spec, "default", MONTH).report


@pytest.fixture(scope="module")
def week(prometheus: Service, spec: Spec) -> Report:
    return generate_report(prometheus.url, spec, "default", WEEK, step=STEP).report


# --- independent expectations from the injected data -----------------------------------------


def _index(sample: Sample, t: int) -> int:
    return (t - sample.start) // sample.step


def _increase(values: np.ndarray, sample: Sample, window: Window) -> float:
    # A counter at t counts the events of (t - step, t]: the period's events are v(end) - v(start).
    return float(values[_index(sample, window.end)] - values[_index(sample, window.start)])


def expected_slo(sample: Sample, name: str, window: Window, **labels: str) -> tuple[float, float]:
    """(events, bad events) of an SLO in the window, over the series with `labels`."""
    if name == "latency":
        total = sample.values(catalog.LLM_REQUEST_DURATION_SECONDS.count, **labels)
        fast = sample.values(catalog.LLM_REQUEST_DURATION_SECONDS.bucket, le="0.8", **labels)
        events = _increase(total, sample, window)
        return events, events - _increase(fast, sample, window)
    events = _increase(sample.values(catalog.LLM_REQUESTS_TOTAL, **labels), sample, window)
    errors = sample.values(catalog.LLM_REQUEST_ERRORS_TOTAL, **labels)
    return events, _increase(errors, sample, window)


def _steps(sample: Sample, window: Window) -> np.ndarray:
    t = sample.times
    return (t >= window.start) & (t < window.end)


def expected_over(sample: Sample, key: str, window: Window) -> float:
    """Seconds past a line at the sample resolution over [start, end)."""
    inside = _steps(sample, window)
    if key == "index_consistency":
        over = sample.values(catalog.VECTORDB_INDEX_STALENESS_SECONDS.name) > 12
    elif key == "context_keepalive":
        over = sample.values(catalog.SESSION_CONTEXT_TTL_SECONDS.name) < 300
    elif key == "rpo_session_state":
        over = sample.values(catalog.SESSION_CDC_RPO_SECONDS.name) > 3
    elif key == "rpo_lora_adapter":
        age = sample.times - sample.values(
            catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS.name
        )
        over = age > 90
    elif key == "latency_p99":
        # P99 over a 5 m rate window is above 0.8 s exactly when more than 1 % of the window's
        # requests were slower (0.8 is a bucket bound), in any region.
        lag = 5 * MINUTE // sample.step
        over = np.zeros(sample.count, dtype=bool)
        for region in REGIONS:
            total = sample.values(catalog.LLM_REQUEST_DURATION_SECONDS.count, region=region)
            fast = sample.values(
                catalog.LLM_REQUEST_DURATION_SECONDS.bucket, region=region, le="0.8"
            )
            d_total = total[lag:] - total[:-lag]
            d_fast = fast[lag:] - fast[:-lag]
            share_slow = 1 - d_fast / np.maximum(d_total, 1)
            over[lag:] |= share_slow > 0.01
    else:
        raise KeyError(key)
    return float(np.sum(over & inside) * sample.step)


# --- the correctness test ----------------------------------------------------------------------


def test_attainment_and_budget_equal_the_injected_counts(
    month: Report, sample_and_blocks: tuple[Sample, Path], spec: Spec
) -> None:
    sample = sample_and_blocks[0]
    objectives = {slo.name: slo.objective for slo in spec.slos}
    for slo in month.slos:
        events, bad = expected_slo(sample, slo.name, MONTH)
        assert slo.events == pytest.approx(events, abs=0.5)
        assert slo.bad_events == pytest.approx(bad, abs=0.5)
        assert slo.attainment is not None and slo.budget_consumed is not None
        assert abs(slo.attainment - (1 - bad / events)) < PP
        allowed = (1 - objectives[slo.name]) * events
        assert slo.budget_allowed_bad == pytest.approx(allowed, rel=1e-6)
        assert abs(slo.budget_consumed - bad / allowed) < PP
        assert slo.budget_remaining == pytest.approx(1 - slo.budget_consumed, abs=1e-9)
        assert slo.hours == slo.hours_with_data == 720
        assert slo.status == "pass"
    latency = next(s for s in month.slos if s.name == "latency")
    assert latency.worst_hour is not None
    assert latency.worst_hour.isoformat().startswith("2025-03-03T10:00")
    assert latency.burn_rate_peak is not None and latency.burn_rate_peak > 14.4


def test_a_grouped_slo_reports_its_fleet_and_each_group_with_its_own_budget(
    month: Report, prometheus: Service, sample_and_blocks: tuple[Sample, Path], spec: Spec
) -> None:
    sample = sample_and_blocks[0]
    slos = tuple(slo.model_copy(update={"group_by": ("region",)}) for slo in spec.slos)
    grouped = spec.model_copy(update={"slos": slos})
    report = generate_report(prometheus.url, grouped, "grouped", MONTH).report
    objectives = {slo.name: slo.objective for slo in spec.slos}
    for slo, fleet in zip(report.slos, month.slos, strict=True):
        # The fleet's row is the ungrouped SLO's, read from the raw series.
        assert slo.group_by == ["region"] and not fleet.groups
        assert slo.events == pytest.approx(fleet.events, abs=0.5)
        assert slo.bad_events == pytest.approx(fleet.bad_events, abs=0.5)
        assert sorted(g.labels["region"] for g in slo.groups) == sorted(REGIONS)
        for group in slo.groups:
            events, bad = expected_slo(sample, slo.name, MONTH, region=group.labels["region"])
            assert group.events == pytest.approx(events, abs=0.5)
            assert group.bad_events == pytest.approx(bad, abs=0.5)
            assert group.budget_consumed is not None
            assert abs(group.budget_consumed - bad / ((1 - objectives[slo.name]) * events)) < PP
            assert group.hours_with_data == 720
        consumed = [g.budget_consumed or 0.0 for g in slo.groups]
        assert consumed == sorted(consumed, reverse=True)
    # The injected latency incident hit the primary alone: its group spent the most.
    latency = next(s for s in report.slos if s.name == "latency")
    assert latency.groups[0].labels == {"region": "primary"}
    markdown = render_markdown(report)
    assert "### SLO groups" in markdown and "| latency | region=primary |" in markdown
    assert "SLO groups" not in render_markdown(month)
    rows = list(csv.DictReader(io.StringIO(render_csv_tables(report)["slo_groups.csv"])))
    assert len(rows) == len(REGIONS) * len(report.slos)
    assert "slo_groups.csv" not in render_csv_tables(month)
    assert "<h3>SLO groups</h3>" in render_html(report)


def test_time_over_each_red_line_and_rpo_equals_the_injected_breaches(
    month: Report, sample_and_blocks: tuple[Sample, Path]
) -> None:
    sample = sample_and_blocks[0]
    assert month.step_seconds == STEP  # detected from the data's 60 s sampling
    signals = {s.key: s for s in [*month.red_lines, *month.rpos]}
    for key in ("latency_p99", "context_keepalive", "index_consistency"):
        expected = expected_over(sample, key, MONTH)
        assert expected > 0
        assert abs(signals[key].seconds_over - expected) <= STEP, key
        assert signals[key].status == "fail"  # each one's alert fired
    # The latency incident: 45 minutes of slow requests seen through a 5 m window.
    lat = signals["latency_p99"]
    assert lat.worst_hour is not None and lat.worst_hour.isoformat().startswith("2025-03-03T10")
    assert abs(lat.worst_hour_seconds_over - (LATENCY[1] + 4 * MINUTE)) <= STEP  # type: ignore[operator]
    for key in ("rpo_session_state", "rpo_lora_adapter"):
        assert abs(signals[key].seconds_over - expected_over(sample, key, MONTH)) <= STEP, key
        assert signals[key].status == "fail"
    assert signals["rpo_session_state"].peak == pytest.approx(7.0)
    assert signals["rpo_lora_adapter"].peak == pytest.approx(560.0)
    index = signals["rpo_embedding_index"]
    assert index.status == "pass" and index.seconds_over == 0
    assert index.peak is not None and index.p99 is not None and index.p99 <= index.peak <= 4.0
    drift = month.drift[0]
    assert drift.instance == "documents/mmd" and drift.threshold == pytest.approx(0.01)
    assert drift.seconds_over == pytest.approx(3 * 3600, abs=STEP)
    assert drift.peak == pytest.approx(0.03)


def test_incidents_are_the_injected_alerts(
    month: Report, sample_and_blocks: tuple[Sample, Path]
) -> None:
    sample = sample_and_blocks[0]
    got = [(i.alert, int(i.start.timestamp()), i.duration_seconds) for i in month.incidents]
    want = sorted((a.name, a.start, float(a.seconds)) for a in sample.alerts)
    assert sorted(got) == [(n, s, pytest.approx(d, abs=STEP)) for n, s, d in want]
    assert all(not i.ongoing and not i.started_before_period for i in month.incidents)
    severities = {i.alert: i.severity for i in month.incidents}
    assert severities["RedLineLatencyP99"] == "critical"
    assert severities["EmbeddingDrift"] == "warning"
    assert month.summary.incidents == len(sample.alerts)


def test_remediation_runs_and_maturity(month: Report) -> None:
    runs = {(r.playbook, r.outcome): r for r in month.remediation}
    assert runs[("reroute", "succeeded")].runs == pytest.approx(1)
    assert runs[("reroute", "failed")].runs == pytest.approx(1)
    assert runs[("freeze_and_replay", "succeeded")].runs == pytest.approx(1)
    assert runs[("reroute", "succeeded")].mean_duration_seconds == pytest.approx(21.0)
    assert runs[("freeze_and_replay", "succeeded")].mean_duration_seconds == pytest.approx(95.0)
    m = month.maturity
    # Probes everywhere and back up; no verified rollback, so level 2 is out of reach.
    assert m.level == 1 and m.next_level == 2
    assert any("rollbacks verified" in item for item in m.missing_for_next)
    checks = {c.id: c.status for c in m.checks}
    assert checks["healthz_probes"] == "met" and checks["self_recovery"] == "met"
    assert checks["session_rpo"] == "not_met" and checks["index_rpo"] == "met"
    assert checks["lora_interval"] == "not_met"  # default spec: 120 s checkpoints, 90 s RPO
    assert checks["replay_verified"] == "met" and checks["reroute_verified"] == "met"
    # Six hours of diverging answers (DIVERGENCE) pull the month's mean similarity down, not
    # below the bar: the check reads the period's mean, and its evidence the lowest answer.
    assert checks["output_hash"] == "met" and checks["embedding_similarity"] == "met"
    evidence = {c.id: c.evidence for c in m.checks}["embedding_similarity"]
    assert "lowest single answer 0.610" in evidence


def test_remediation_lists_what_ran_what_shadow_would_have_done_and_skips(
    month: Report, sample_and_blocks: tuple[Sample, Path]
) -> None:
    """Each injected run at its minute, with the alert routed to its playbook that was firing
    then (its labels name the target), from the counters' increases and `ALERTS` alone."""
    sample = sample_and_blocks[0]
    got = [(int(a.at.timestamp()), a.playbook, a.outcome) for a in month.remediation_actions]
    assert got == sorted((r.at, r.playbook, r.outcome) for r in sample.runs)
    texts = {a.outcome: a.text for a in month.remediation_actions}
    assert texts["shadow"] == (
        "shadow: would have rolled back chat v2 at 2025-03-10 10:02 UTC (semantic_rollback)"
    )
    assert texts["over_budget"] == (
        "skipped, over budget: did not reroute traffic away from primary "
        "at 2025-03-03 10:20 UTC (reroute)"
    )
    shadow = next(a for a in month.remediation_actions if a.kind == "shadow")
    assert shadow.alert == "SemanticRollbackTwoSignal"
    assert shadow.target == {"model": "chat", "model_version": "v2"}
    freeze = next(a for a in month.remediation_actions if a.playbook == "freeze_and_replay")
    assert freeze.target == {
        "collection": "documents", "red_line": "index_consistency", "replica": "secondary",
    }  # fmt: skip
    assert month.summary.remediation_shadow_runs == 1
    assert month.summary.remediation_skipped_runs == 1
    (guard,) = month.remediation_guards
    assert guard.playbook == "semantic_rollback" and guard.mode_at_end == "shadow"
    assert not guard.paused_during and not guard.breaker_open_during


def test_calendar_gives_each_day_its_own_attainment(
    month: Report, sample_and_blocks: tuple[Sample, Path]
) -> None:
    sample = sample_and_blocks[0]
    assert len(month.calendar) == 30
    day = next(d for d in month.calendar if d.day.isoformat() == "2025-03-12")
    events, bad = expected_slo(
        sample, "availability", Window(ts("2025-03-12T00:00"), ts("2025-03-13T00:00"))
    )
    attained = day.slo_attainment["availability"]
    assert attained is not None and abs(attained - (1 - bad / events)) < PP
    assert day.slo_status["availability"] == "fail" and day.incidents == 1
    quiet = next(d for d in month.calendar if d.day.isoformat() == "2025-03-02")
    assert set(quiet.slo_status.values()) == {"pass"} and quiet.incidents == 0
    assert sum(quiet.red_line_seconds_over.values()) == 0


def test_deltas_against_the_previous_week(
    week: Report, month: Report, sample_and_blocks: tuple[Sample, Path]
) -> None:
    sample = sample_and_blocks[0]
    latency = next(s for s in week.slos if s.name == "latency")
    events, bad = expected_slo(sample, "latency", WEEK.previous)
    assert latency.previous_attainment is not None and latency.attainment is not None
    assert abs(latency.previous_attainment - (1 - bad / events)) < PP
    row = next(d for d in week.deltas if d.subject == "slo:latency" and d.metric == "attainment")
    assert row.change == pytest.approx(latency.attainment - latency.previous_attainment, abs=1e-9)
    assert row.change > 0  # the previous week had the 20-minute slowdown
    lat = next(d for d in week.deltas if d.subject == "red_line:latency_p99")
    assert lat.previous == pytest.approx(
        expected_over(sample, "latency_p99", WEEK.previous), abs=STEP
    )
    assert week.summary.previous_incidents == 1  # the index staleness page on 2025-03-20
    # The month before the data: no deltas, said so, and no fake previous numbers.
    assert any("previous period" in n and "no data" in n for n in month.notes)
    assert all(s.previous_attainment is None for s in month.slos)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "redline.cli", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_same_numbers_in_every_format(prometheus: Service, tmp_path: Path) -> None:
    done = _cli(
        "--prometheus", prometheus.url, "--from", "2025-03-01", "--to", "2025-03-31",
        "--format", "md,html,csv,json", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "slo-report.json").read_text())
    assert data["schema_version"] == "redline.report/v1"
    report = Report.model_validate(data)
    markdown = (tmp_path / "slo-report.md").read_text()
    page = (tmp_path / "slo-report.html").read_text()
    with (tmp_path / "csv" / "slos.csv").open() as handle:
        rows = {row["slo"]: row for row in csv.DictReader(handle)}
    for slo in report.slos:
        assert slo.attainment is not None and slo.budget_consumed is not None
        assert float(rows[slo.name]["attainment"]) == slo.attainment
        assert float(rows[slo.name]["budget_consumed"]) == slo.budget_consumed
        for text in (
            fmt.pct(slo.attainment),
            fmt.pct(slo.budget_consumed),
            fmt.rate(slo.burn_rate_peak),
        ):
            assert text in markdown and text in page
    with (tmp_path / "csv" / "red_lines.csv").open() as handle:
        lines = {row["key"]: row for row in csv.DictReader(handle)}
    for line in report.red_lines:
        assert float(lines[line.key]["seconds_over"]) == line.seconds_over
        assert fmt.duration(line.seconds_over) in markdown
        assert fmt.duration(line.seconds_over) in page
    with (tmp_path / "csv" / "incidents.csv").open() as handle:
        incidents = list(csv.DictReader(handle))
    assert [r["alert"] for r in incidents] == [i.alert for i in report.incidents]
    expected_tables = {
        "slos.csv", "red_lines.csv", "rpos.csv", "drift.csv", "saturation.csv", "incidents.csv",
        "remediation.csv",
        "remediation_actions.csv", "remediation_guards.csv", "calendar.csv", "deltas.csv",
        "maturity.csv", "slo_hourly.csv", "signal_hourly.csv",
    }  # fmt: skip
    assert {p.name for p in (tmp_path / "csv").iterdir()} == expected_tables
    with (tmp_path / "csv" / "remediation_actions.csv").open() as handle:
        actions = list(csv.DictReader(handle))
    assert [r["text"] for r in actions] == [a.text for a in report.remediation_actions]
    shadow = [a.text for a in report.remediation_actions if a.kind == "shadow"]
    assert shadow and all(text in markdown and text in page for text in shadow)
    # Self-contained: no scripts, stylesheets, images or fonts fetched from anywhere.
    assert not re.findall(r'(?:src|href)\s*=\s*"(?:https?:)?//', page)
    assert "<script" not in page and "<link" not in page and "@import" not in page


def test_prometheus_down_is_a_clear_error() -> None:
    done = _cli("--prometheus", f"http://127.0.0.1:{free_port()}", "--period", "7d")
    assert done.returncode == 3
    assert "is not reachable" in done.stderr and "Traceback" not in done.stderr


def test_a_period_before_any_data_is_a_clear_error(prometheus: Service) -> None:
    done = _cli("--prometheus", prometheus.url, "--from", "2024-06-01", "--to", "2024-06-08")
    assert done.returncode == 4
    assert "holds no samples" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--from", "2025-03-05", "--to", "2025-03-05"), "empty period"),
        (("--from", "2025-03-05T10:30", "--to", "2025-03-06"), "whole UTC hours"),
        (("--period", "7x"), "--period"),
        (("--from", "yesterday", "--to", "2025-03-06"), "--from"),
        (("--from", "2999-01-01", "--to", "2999-01-02"), "future"),
        (("--period", "7d", "--format", "md,docx"), "allowed: md, html, pdf, csv, json"),
    ],
)
def test_bad_periods_and_formats_are_clear_errors(
    prometheus: Service, args: tuple[str, ...], message: str
) -> None:
    done = _cli("--prometheus", prometheus.url, *args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_missing_series_and_recordings(tmp_path: Path, spec: Spec) -> None:
    """Only the request series, plus recorded series: missing sections say so, never 100 %."""
    day = Window(ts("2025-03-01T00:00"), ts("2025-03-02T00:00"))
    sample = build_sample(days=1)
    keep = {
        catalog.LLM_REQUEST_DURATION_SECONDS.bucket, catalog.LLM_REQUEST_DURATION_SECONDS.count,
        catalog.LLM_REQUESTS_TOTAL.name, catalog.LLM_REQUEST_ERRORS_TOTAL.name,
    }  # fmt: skip
    sample.series = {k: v for k, v in sample.series.items() if k in keep}
    sample.alerts = []
    # Recorded series win over the raw ones where they exist (values unlike the raw data).
    sample.add(
        catalog.slo_errors_record("1h"), {"slo": "availability"}, np.full(sample.count, 0.25)
    )
    sample.add(
        catalog.quantile_record(catalog.LLM_REQUEST_DURATION_SECONDS.name, "99", "5m"),
        {"region": "primary"},
        np.full(sample.count, 0.9),
    )
    source = write_openmetrics(sample, tmp_path / "partial.om")
    backfill(source, tmp_path / "blocks")
    with sample_prometheus(tmp_path / "blocks", tmp_path / "prom") as service:
        report = generate_report(service.url, spec, "default", day, step=STEP).report
    availability = next(s for s in report.slos if s.name == "availability")
    assert availability.attainment == pytest.approx(0.75, abs=1e-6)
    assert availability.status == "fail"
    latency_line = report.red_lines[0]
    assert latency_line.key == "latency_p99" and latency_line.peak == pytest.approx(0.9)
    assert latency_line.seconds_over == pytest.approx(86400 - 0, abs=STEP)
    assert any("read from the recording rule" in n for n in report.notes)
    for sig in [*report.red_lines[1:], *report.rpos, *report.drift]:
        assert sig.status == "no_data" and sig.attained is None and sig.peak is None, sig.key
        assert sig.message and "no samples of" in sig.message
    assert any(catalog.VECTORDB_INDEX_STALENESS_SECONDS.name in n for n in report.notes)
    assert report.incidents == [] and report.summary.status == "fail"
    assert {c.status for c in report.maturity.checks if c.id == "session_rpo"} == {"no_data"}
