"""GPU node failure, cold against warm recovery (#30), end to end over real components, as the
`gpu-node-failure` drill runs it (`redline/devstack/drills/gpu/`): an XID injected into the fake
dcgm-exporter -> a real Prometheus running the generated GPU rules fires `GPUXidCritical` -> a
real Alertmanager on the generated config -> the real receiver -> a real worker runs
`gpu_node_failure` (taint on the fake Kubernetes API, drain through the real gateway, readiness
gate) -> the replacement passes the gate, admission reopens.

The node's model is served by one instance only, behind a Service front, so what the node's loss
costs clients shows: cold, a pod rebuilt only now loads its model for the notes' 42 s scaled by
the time scale; warm, a replacement started (and loaded) beforehand. Each mode reports the
recovery seconds from the receiver's `llm_node_failure_recovery_seconds{mode}` and the
client-visible failed requests (counted, not assumed), as a Markdown table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.devstack.drills.gpu.drill import DRILL, build_result, render_table, run_gpu_drill
from redline.devstack.drills.gpu.rig import GpuDrillConfig
from redline.devstack.drills.registry import ALLOWANCES, BY_NAME_ONLY, DRILL_ORDER, DRILLS
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_drill_is_registered_by_name_only() -> None:
    assert DRILL in DRILLS and DRILL in BY_NAME_ONLY and DRILL not in DRILL_ORDER
    # The stack's users: the failures of the drill's own clients are its figures.
    assert ALLOWANCES[DRILL].failed_requests == 0


def test_warm_recovery_beats_a_pod_rebuild_and_fails_fewer_requests(
    redis_url: str, tmp_path: Path
) -> None:
    spec = apply_profile(load_spec().spec, "local")  # 1 s scrape and evaluation, 1 s group_wait
    config = GpuDrillConfig(tmp_path, redis_url, spec)
    lines: list[str] = []
    report = run_gpu_drill(config, lines.append)
    assert report.error is None, f"{report.error}\n" + "\n".join(lines)
    print(
        f"\nGPU node failure, {config.time_scale:g}x time (spot timings; the notes' 42 s pod "
        f"rebuild as {config.boot_seconds:g} s), {config.clients} clients through the gateway:\n"
        + render_table(report)
    )
    cold, warm = report.outcomes
    assert (cold.mode, warm.mode) == (catalog.RECOVERY_COLD, catalog.RECOVERY_WARM)
    for outcome in report.outcomes:
        assert outcome.job.status == "succeeded", outcome.job.error
    # Both measured against the same histogram the receiver serves: one observation each.
    for outcome in report.outcomes:
        count, total = report.histogram[outcome.mode]
        assert count == 1 and total == pytest.approx(outcome.recovery_seconds, abs=1e-3)
    # The rebuilt pod's model load is on the cold path only.
    assert cold.recovery_seconds >= config.boot_seconds
    assert warm.recovery_seconds < cold.recovery_seconds - config.boot_seconds / 2
    # The failing GPU fails requests in both until the drain; the rebuild keeps failing them.
    for outcome in report.outcomes:
        assert outcome.requests > 0 and outcome.failed > 0, outcome
    assert warm.failed < cold.failed, render_table(report)
    failed_checks = [c for c in report.checks if not c[1]]
    assert not failed_checks and report.ok, failed_checks
    # As `redline drill` shows it: the cold run's times, both modes' figures.
    result = build_result(report, 3.0, cold.injected_at)
    assert result.ok, result.as_dict()
    assert result.failed_requests is None  # run_drills counts the stack's load generator
    figures = {figure.label: figure.value for figure in result.figures}
    assert figures == {
        "cold recovery": cold.recovery_seconds, "cold failed": cold.failed,
        "cold requests": cold.requests, "warm recovery": warm.recovery_seconds,
        "warm failed": warm.failed, "warm requests": warm.requests,
    }  # fmt: skip
    assert result.firing_at is not None and result.recovered_at is not None
    assert result.notes[0] == render_table(report)
