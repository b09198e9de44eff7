"""The local stack's pieces that need no stack: state, ports, load mix, baselines, drills."""

from __future__ import annotations

import io
import os
import random
import socket
import time
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from redline.cli.stack import DRILL_HELP
from redline.devstack.drills.base import DrillError, DrillResult, labels_match, parse_time
from redline.devstack.drills.registry import (
    ALLOWANCES,
    DRILL_NAMES,
    DRILL_ORDER,
    DRILLS,
    resolve_names,
)
from redline.devstack.drills.regression import regression_latency
from redline.devstack.drills.run import drill_lock
from redline.devstack.drills.settle import evidence_seconds, settle_seconds
from redline.devstack.errors import PortInUseError, StackError
from redline.devstack.layout import StackLayout
from redline.devstack.loadgen import (
    LoadgenSettings,
    LoadStats,
    build_call,
    build_prompt,
    build_reference_embeddings,
)
from redline.devstack.models import build_adapter_files, build_histogram_quantile
from redline.devstack.processes import start_ticks
from redline.devstack.report import build_report, build_rows, render_json
from redline.devstack.runtime import choose_ports, prepare_run_dir
from redline.devstack.state import read_state
from redline.platform.golden import GOLDEN_SET
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import parse_duration

# ---- state and ports ---------------------------------------------------------------------------


def test_zombies_and_missing_pids_count_as_gone() -> None:
    assert start_ticks(os.getpid()) is not None
    assert start_ticks(2**22 + 12345) is None


def test_a_foreign_non_empty_directory_is_never_cleaned(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(StackError, match="not a redline run directory"):
        prepare_run_dir(StackLayout(tmp_path), lambda _: None)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_a_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path)
    layout.state_file.write_text('{"format": 1, "parts": "nope"}')
    with pytest.raises(StackError, match="not a redline state file"):
        read_state(layout)


def test_ports_asked_for_must_be_free_and_name_a_part() -> None:
    parts = ("redis", "gateway", "prometheus")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"gateway={port}"):
            choose_ports(parts, {"gateway": port})
    with pytest.raises(StackError, match="unknown part.*grafana"):
        choose_ports(parts, {"grafana": 3000})
    chosen = choose_ports(parts, {})
    assert set(chosen) == set(parts) and len(set(chosen.values())) == 3


# ---- load generator ----------------------------------------------------------------------------


def test_the_load_mix_follows_its_shares() -> None:
    settings = LoadgenSettings(adapter_share=0.85, golden_share=0.05, stream_share=0.3)
    rng = random.Random(3)
    calls = [build_call(rng, settings) for _ in range(4000)]
    models = Counter(c.body["model"] for c in calls)
    assert 0.82 < models["chat-lora"] / len(calls) < 0.88
    golden = [c for c in calls if c.golden is not None]
    assert 0.03 < len(golden) / len(calls) < 0.07
    assert all(not c.stream and c.body["temperature"] == 0 for c in golden)
    assert all(c.golden in GOLDEN_SET for c in golden)
    assert 0.25 < sum(c.stream for c in calls) / len(calls) < 0.32
    assert any(len(c.body["messages"]) > 1 for c in calls)


def test_prompts_and_the_drift_reference_are_reproducible() -> None:
    assert build_prompt(random.Random(1)) == build_prompt(random.Random(1))
    reference = build_reference_embeddings(50, seed=9)
    assert reference.shape == (50, 256)
    assert (reference == build_reference_embeddings(50, seed=9)).all()


def test_load_stats_summarize_recent_rate_and_quantiles() -> None:
    stats = LoadStats()
    now = time.time()
    for i in range(100):
        stats.record("200", "v1", "primary", 0.01 * (i + 1))
    stats.record("404", "unknown", "unknown", 0.01)
    summary = stats.summary(now=now + 1)
    assert summary["completed"] == 101
    assert summary["statuses"] == {"200": 100, "404": 1}
    assert summary["recent_seconds"]["p99"] >= 0.99


# ---- baselines ---------------------------------------------------------------------------------


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = (0.1, 0.2, 0.5, 1.0)
    # 100 values: 50 in (0, 0.1], 40 in (0.1, 0.2], 10 in (0.2, 0.5].
    values = [0.05] * 50 + [0.15] * 40 + [0.3] * 10
    # rank 99 falls in (0.2, 0.5]: 0.2 + 0.3 * (99 - 90) / 10
    assert build_histogram_quantile(values, buckets, 0.99) == pytest.approx(0.47)
    assert build_histogram_quantile(values, buckets, 0.5) == pytest.approx(0.1)
    assert build_histogram_quantile([5.0] * 10, buckets, 0.99) == 1.0  # +Inf: top bound
    with pytest.raises(ValueError):
        build_histogram_quantile([], buckets, 0.99)


def test_adapter_versions_differ_and_carry_their_version() -> None:
    v1, v2 = build_adapter_files("v1"), build_adapter_files("v2")
    assert v1["version"] == b"v1\n"
    assert v1["adapter_model.safetensors"] != v2["adapter_model.safetensors"]
    assert v1 == build_adapter_files("v1")


# ---- drills ------------------------------------------------------------------------------------


def test_drill_names_resolve_all_in_order_and_reject_unknown() -> None:
    assert resolve_names(["all"]) == list(DRILL_ORDER)
    assert resolve_names(["latency", "latency", "staleness"]) == ["latency", "staleness"]
    with pytest.raises(DrillError, match="unknown drill 'nope'; choose from: all, "):
        resolve_names(["nope"])


def test_timestamps_of_every_api_parse() -> None:
    assert parse_time("2026-11-30T07:32:25.435611+00:00") == pytest.approx(1796023945.435611)
    assert parse_time("2026-11-30T07:32:25.435611123Z") == pytest.approx(1796023945.435611)
    assert parse_time("2026-11-30T07:32:25Z") == pytest.approx(1796023945.0)
    assert labels_match({"a": "1", "b": "2"}, {"a": "1"})
    assert not labels_match({"a": "1"}, {"a": "1", "b": "2"})


def _result(**changes: object) -> DrillResult:
    result = DrillResult("latency", "RedLineLatencyP99", "reroute", 5.0, fault_at=100.0)
    for key, value in changes.items():
        setattr(result, key, value)
    return result


def test_a_drill_is_ok_only_when_its_loop_closed_and_nothing_was_lost() -> None:
    closed = _result(firing_at=105.0, playbook_started_at=106.0, recovered_at=130.0, lost=0)
    assert closed.ok
    assert closed.as_dict()["time_to_detect"] == 5.0
    assert not _result(firing_at=105.0).ok  # never recovered
    assert not _result(firing_at=105.0, recovered_at=130.0, lost=2).ok
    failed_check = _result(firing_at=105.0, recovered_at=130.0)
    failed_check.check("override", False, "none")
    assert not failed_check.ok
    negative = _result(expect_alert=False)
    assert negative.ok
    assert not _result(expect_alert=False, firing_at=120.0).ok


def test_the_budget_is_judged_after_the_faults_onset() -> None:
    result = _result(playbook_started_at=107.5, condition_delay=0.9)
    assert result.within_budget  # 7.5 - 0.9 <= 5 + 2
    assert not _result(playbook_started_at=107.5).within_budget
    no_playbook = _result(playbook=None, notified_at=104.0)
    assert no_playbook.pipeline_end == 4.0 and no_playbook.within_budget


def test_regression_latency_clears_the_gate_below_the_red_line() -> None:
    spec = apply_profile(load_spec().spec, "local")
    added = regression_latency(spec, 0.2)
    assert 0.2 + added >= 1.15 * 0.2
    assert 0.2 + added < spec.red_lines.latency_p99.threshold_seconds
    with pytest.raises(DrillError, match="no room"):
        regression_latency(spec, 0.7)


def test_report_rows_and_json() -> None:
    ok = _result(firing_at=105.2, notified_at=106.0, playbook_started_at=106.3,
                 remediated_at=108.0, recovered_at=140.0, condition_delay=0.9,
                 failed_requests=0)  # fmt: skip
    row = build_rows([ok])[0]
    assert row["detect"] == "5.2 s"
    assert row["playbook start"] == "6.3 s (5.4)"
    assert row["budget+2"] == "7.0 s ok"
    assert row["lost"] == "n/a" and row["result"] == "ok"
    assert '"drill": "latency"' in render_json([ok])


def test_two_drill_runs_on_one_stack_are_refused(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path)
    with drill_lock(layout):
        with pytest.raises(DrillError, match="drills are already running"):
            with drill_lock(layout):
                pass
    with drill_lock(layout):
        pass


def test_every_drill_is_named_in_the_help_and_resolves() -> None:
    for name in DRILL_NAMES:
        assert name in DRILL_HELP
        assert resolve_names([name]) == [name]
    assert "spot-one" not in resolve_names(["all"])  # the spot drills run a fleet of their own


def _render(results: list[DrillResult], width: int) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=False, color_system=None)
    console.print(build_report(results, console.width))
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(output, str)
    return output


def test_the_drill_report_fits_80_columns_without_cutting_a_cell() -> None:
    """Output that is not a terminal is 80 columns wide (`make demo | tee`): the table would cut
    every cell to `dri…`, so the report prints one block per drill instead."""
    closed = _result(firing_at=105.2, notified_at=106.0, playbook_started_at=106.3,
                     remediated_at=108.0, recovered_at=140.0, condition_delay=0.9,
                     failed_requests=0, lost=0)  # fmt: skip
    webhook = DrillResult("exporter-down", "SLIAbsent", None, 6.0, fault_at=100.0,
                          firing_at=104.0, notified_at=104.5, recovered_at=120.0)  # fmt: skip
    failed = DrillResult("regression-negative", "SemanticRollbackTwoSignal", "semantic_rollback",
                         9.0, fault_at=100.0, expect_alert=False, error="boom")  # fmt: skip
    results = [closed, webhook, failed]
    narrow = _render(results, 80)
    assert "…" not in narrow
    assert max(len(line) for line in narrow.splitlines()) <= 80
    for row in build_rows(results):
        for header, text in row.items():
            assert text in narrow, f"{row['drill']}: {header} {text!r} cut or missing"
    wide = _render(results, 200)
    assert "…" not in wide and "playbook start" in wide.splitlines()[2]  # the table's header


def test_a_drill_with_more_failed_requests_than_its_allowance_is_not_ok() -> None:
    closed: dict[str, object] = {"firing_at": 105.2, "notified_at": 106.0, "lost": 0,
                                 "playbook_started_at": 106.3, "remediated_at": 108.0,
                                 "recovered_at": 140.0}  # fmt: skip
    assert _result(**closed, failed_requests=0).ok
    over = _result(**closed, failed_requests=3)
    assert not over.ok and not over.within_allowance
    assert build_rows([over])[0]["failed req"] == "3/0"
    assert build_rows([over])[0]["result"] == "FAILED"
    counted = _result(**closed, failed_requests=3, allowed_failures=None)
    assert counted.ok and build_rows([counted])[0]["failed req"] == "3"


def test_every_drill_names_its_allowance_and_why() -> None:
    for name in DRILLS:
        allowance = ALLOWANCES[name]
        assert allowance.why, name
        assert allowance.failed_requests == 0, name  # no drill may fail a user request


def test_the_settle_bound_follows_the_alerts_own_evidence() -> None:
    spec = apply_profile(load_spec().spec, "local")
    window = parse_duration(spec.red_lines.latency_p99.window)
    latency = spec.red_lines.latency_p99
    assert evidence_seconds(spec, "RedLineLatencyP99") == window + latency.for_seconds
    gate = spec.rollback.window_seconds + spec.rollback.for_seconds
    assert settle_seconds(spec, "SemanticRollbackTwoSignal", 6.0) == max(90.0, 2 * (gate + 6.0))
    assert settle_seconds(spec, "SLIAbsent", 6.0) == 90.0
