"""The `latency-persistent` drill's counting: flips, restores, the detection window, the bounds,
its registration, its board lines and its answer on a stack without a gateway."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
from rich.console import Console

from redline.devstack.config import build_part_commands, render_settings
from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.latency_persistent import (
    NAME,
    ClientSample,
    RoutingSample,
    build_not_applicable,
    max_outside,
    nearest_rank,
    recorded_detection_end,
    summarize_clients,
    summarize_routing,
)
from redline.devstack.drills.registry import DRILL_ORDER, DRILLS, resolve_names
from redline.devstack.drills.restore import WORKER_PART, load_reroute_settings, restore_bound
from redline.devstack.layout import StackLayout, build_endpoints, build_ported_parts
from redline.devstack.report import build_figure_lines, build_report, build_rows, render_json
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Spec

REGIONS = ("primary", "secondary")


@pytest.fixture()
def local_spec() -> Spec:
    return apply_profile(load_spec().spec, "local")


def _routing(*targets: str | None, start: float = 100.0) -> list[RoutingSample]:
    """One sample every 0.5 s from `start`; "?" stands for an unread sample."""
    return [
        RoutingSample(start + 0.5 * i, None if t == "?" else t, ok=t != "?")
        for i, t in enumerate(targets)
    ]


def test_a_reroute_held_while_slow_and_restored_once_after_the_repair() -> None:
    samples = _routing(None, None, "secondary", "secondary", "secondary", "secondary", None, None)
    summary = summarize_routing(samples, "primary", repaired_at=102.2)
    assert (summary.reroutes, summary.flips, summary.restores) == (1, 0, 1)
    assert summary.reroute_at == 101.0 and summary.restore_at == 103.0
    assert summary.samples == 8 and summary.unread == 0


def test_a_move_back_while_the_primary_is_slow_is_a_flip_and_each_is_counted() -> None:
    flapping = _routing(None, "secondary", None, None, "secondary", None, "secondary", None)
    summary = summarize_routing(flapping, "primary", repaired_at=103.2)
    assert summary.flips == 2 and summary.flip_times == (101.0, 102.5)
    assert summary.reroutes == 3
    assert summary.restores == 1 and summary.restore_at == 103.5
    # An override pointing at the primary sends its traffic back just as well.
    back = summarize_routing(_routing(None, "secondary", "primary"), "primary", None)
    assert back.flips == 1 and back.restores == 0


def test_unread_samples_are_skipped_not_taken_for_a_move() -> None:
    samples = _routing("?", None, "secondary", "?", "?", "secondary", None)
    summary = summarize_routing(samples, "primary", repaired_at=102.0)
    assert (summary.reroutes, summary.flips, summary.restores) == (1, 0, 1)
    assert summary.unread == 3 and summary.samples == 4
    # Samples arrive in any order; never repaired: every move back is a flip.
    never = summarize_routing(list(reversed(_routing(None, "secondary", None))), "primary", None)
    assert never.flips == 1 and never.restores == 0 and never.restore_at is None


def test_client_latency_outside_detection_and_requests_to_the_slow_primary() -> None:
    samples = [
        ClientSample(99.0, 0.05, "200", "primary"),  # before the fault
        ClientSample(100.5, 0.95, "200", "primary"),  # detection: fault -> reroute
        ClientSample(103.9, 0.93, "200", "primary"),  # still detection
        ClientSample(104.0, 0.06, "200", "secondary"),  # rerouted
        ClientSample(110.0, 0.91, "200", "primary"),  # a flip: the slow primary served it
        ClientSample(120.0, 0.07, "200", "primary"),  # after the repair
        ClientSample(121.0, 10.0, "error", None),
    ]
    summary = summarize_clients(samples, "primary", 100.0, 104.0, 115.0, 0.99)
    assert summary.requests == 7 and summary.failed == 1
    assert summary.outside_detection == 5
    assert summary.served_by_slow_primary == 1
    assert summary.max_seconds == 10.0 and summary.p99_seconds == 10.0
    healthy = summarize_clients(samples[:4] + samples[5:6], "primary", 100.0, 104.0, 115.0, 0.5)
    assert healthy.served_by_slow_primary == 0 and healthy.p99_seconds == 0.06
    # Never rerouted: everything after the fault is detection.
    stuck = summarize_clients(samples, "primary", 100.0, None, None, 0.99)
    assert stuck.outside_detection == 1 and stuck.served_by_slow_primary == 0


def test_nearest_rank_and_max_outside_a_window() -> None:
    assert nearest_rank([], 0.99) is None
    assert nearest_rank([float(v) for v in range(1, 101)], 0.99) == 99.0
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0
    points = [(99.0, 0.2), (100.0, 0.95), (120.0, 0.9), (134.0, 0.3), (135.0, math.nan)]
    assert max_outside(points, 100.0, 134.0) == (0.3, 2)
    assert max_outside(points, 90.0, 200.0) == (None, 0)


def test_the_recorded_p99_detection_window_and_the_restore_bound(local_spec: Spec) -> None:
    # Local profile: a 30 s window, 1 s scrape and evaluation, a 0.9 s fault.
    assert recorded_detection_end(10.0, local_spec, False) == pytest.approx(10 + 30 + 0.9 + 1 + 2)
    assert recorded_detection_end(10.0, local_spec, True) == pytest.approx(10 + 30 + 0.9 + 2 + 2)
    assert restore_bound(5.0, 1.0, local_spec, True) == 5 + 5 + 2 + 1
    assert restore_bound(5.0, 1.0, local_spec, False) == 5 + 5 + 1 + 1


def test_the_drill_reads_the_reroute_settings_the_worker_runs_with(
    local_spec: Spec, tmp_path: Path
) -> None:
    layout = StackLayout(tmp_path)
    ports = {part: 21000 + i for i, part in enumerate(build_ported_parts(REGIONS))}
    endpoints = build_endpoints(ports, REGIONS)
    with pytest.raises(DrillError, match="cannot read the reroute settings"):
        load_reroute_settings(layout)
    commands = build_part_commands(local_spec, endpoints, layout, None, 30.0, 7, python="py")
    worker = next(c for c in commands if c.part == WORKER_PART)
    layout.config_dir.mkdir(parents=True)
    layout.settings_file(WORKER_PART).write_text(render_settings(worker.settings))
    settings = load_reroute_settings(layout)
    assert settings.restore_for_seconds == 5.0 and settings.hold_down_seconds == 3.0
    assert settings.restore_check_seconds == 1.0
    assert settings.prometheus_url == endpoints.prometheus_url


def test_the_drill_is_registered_and_runs_last_in_all() -> None:
    assert NAME in DRILLS
    assert DRILL_ORDER[-1] == NAME
    assert resolve_names([NAME]) == [NAME]
    assert NAME in resolve_names(["all"])


def test_without_a_gateway_the_drill_says_it_does_not_apply(local_spec: Spec) -> None:
    result = build_not_applicable(local_spec, "vllm")
    assert result.ok and not result.checks and result.fault_at is None
    assert result.not_applicable is not None and "no gateway" in result.not_applicable
    assert build_rows([result])[0]["result"] == "n/a"
    assert build_figure_lines([result]) == [f"{NAME}: does not apply: {result.not_applicable}"]
    assert '"not_applicable": "the vllm stack has no gateway' in render_json([result])
    # A check that failed is a failure, applicable or not.
    result.check("something", False, "broken")
    assert build_rows([result])[0]["result"] == "FAILED"


def test_the_board_shows_the_figures(local_spec: Spec) -> None:
    result = DrillResult(NAME, "RedLineLatencyP99", "reroute", 5.0, fault_at=100.0)
    result.figure("flips while slow", 0)
    result.figure("restores after repair", 1)
    result.figure("repair -> restore", 7.4123, "s")
    result.figure("client P99 outside detection", None, "s")
    assert [vars(f) for f in result.figures][2] == {
        "label": "repair -> restore",
        "value": 7.412,
        "unit": "s",
    }
    line = build_figure_lines([result])[0]
    assert line == (
        f"{NAME}: flips while slow 0 · restores after repair 1 · repair -> restore 7.41 s · "
        "client P99 outside detection -"
    )
    for width in (80, 200):
        console = Console(width=width, file=io.StringIO(), force_terminal=False, color_system=None)
        console.print(build_report([result], console.width))
        output = console.file.getvalue()  # type: ignore[attr-defined]
        assert "flips while slow" in output and "7.41 s" in output, output
