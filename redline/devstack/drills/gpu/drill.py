"""The `gpu-node-failure` drill: a GPU node failure recovered cold (a pod rebuilt) and then warm (a
replacement already loaded), each on a rig of its own (`rig.run_mode`) beside the running stack,
on the stack's Redis and spec.

The report holds, per mode, XID -> job, the recovery seconds the playbook observed into
`llm_node_failure_recovery_seconds{mode}` and the failed requests its clients counted; its checks:
both jobs recovered their node, each recovery is one observation of the histogram the receiver
serves with the job's seconds as its sum, the rebuild's model load shows on the cold path only
(cold >= boot, warm under cold - boot / 2), requests failed in both modes (counted, not assumed)
and fewer warm than cold.

As a `DrillResult` (`drill_gpu_node_failure`): the row's times are the cold run's (XID ->
`GPUXidCritical` firing -> the job -> its first step -> the replacement passing the readiness
gate, which is recovery here: the XID stays set, so the alert does not resolve). The requests
the rig's own clients saw fail are figures (per mode, beside the recovery seconds), bounded by
the checks; the board's `failed req` stays the stack's users' (its load generator's), allowed
none as for every drill. A Markdown note carries the cold/warm table, a JSON note the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from redline.devstack.config import pipeline_budget_seconds
from redline.devstack.drills.base import DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.gpu.rig import (
    MODES,
    PLAYBOOK,
    GpuDrillConfig,
    GpuDrillError,
    ModeOutcome,
    clean_keys,
    recovery_histogram,
    run_mode,
)
from redline.devstack.processes import ServiceError
from redline.platform.prometheus import PrometheusError
from redline.slo import catalog
from redline.slo.alerts import Alert

DRILL = "gpu-node-failure"
DRILL_FAILURES = (GpuDrillError, ServiceError, PrometheusError, httpx.HTTPError, redis.RedisError)
"""What makes the drill's report an error rather than a crash of the whole run."""
Say = Callable[[str], None]


@dataclass
class GpuDrillReport:
    """What the drill measured: one outcome per mode, the histogram, the checks."""

    time_scale: float
    boot_seconds: float
    clients: int
    outcomes: list[ModeOutcome] = field(default_factory=list)
    histogram: dict[str, tuple[float, float]] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    error: str | None = None

    def mode(self, name: str) -> ModeOutcome | None:
        """The outcome of one mode (None when it did not run)."""
        return next((o for o in self.outcomes if o.mode == name), None)

    @property
    def failed(self) -> int:
        """Failed requests of both modes."""
        return sum(o.failed for o in self.outcomes)

    @property
    def ok(self) -> bool:
        """Every check held and nothing broke."""
        return self.error is None and bool(self.checks) and all(ok for _, ok, _ in self.checks)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "drill": DRILL,
            "ok": self.ok,
            "time_scale": self.time_scale,
            "boot_seconds": self.boot_seconds,
            "clients": self.clients,
            "modes": [
                {
                    "mode": o.mode,
                    "node": o.node,
                    "xid_to_job_seconds": round(o.detect_seconds, 3),
                    "recovery_seconds": o.recovery_seconds,
                    "requests": o.requests,
                    "failed": o.failed,
                    "failed_share": round(o.failed_share, 4),
                    "failures": o.failures,
                    "job_id": o.job.id,
                }
                for o in self.outcomes
            ],  # fmt: skip
            "histogram": {m: {"count": c, "sum": s} for m, (c, s) in self.histogram.items()},
            "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in self.checks],
            "error": self.error,
        }


def build_checks(report: GpuDrillReport) -> list[tuple[str, bool, str]]:
    """The drill's checks over both modes' outcomes and the receiver's histogram."""
    checks: list[tuple[str, bool, str]] = []
    for outcome in report.outcomes:
        count, total = report.histogram.get(outcome.mode, (0.0, 0.0))
        checks.append((
            f"{outcome.mode}: one recovery in {catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS.name}",
            count == 1 and abs(total - outcome.recovery_seconds) <= 1e-3,
            f"count {count:g}, sum {total:.3f} s; the job recorded {outcome.recovery_seconds} s",
        ))  # fmt: skip
        checks.append((
            f"{outcome.mode}: requests failed until the drain (counted)",
            outcome.requests > 0 and outcome.failed > 0,
            f"{outcome.failed} of {outcome.requests} requests failed",
        ))  # fmt: skip
    cold, warm = report.mode(catalog.RECOVERY_COLD), report.mode(catalog.RECOVERY_WARM)
    if cold is None or warm is None:
        return [*checks, ("both modes ran", False, f"ran: {[o.mode for o in report.outcomes]}")]
    boot = report.boot_seconds
    checks.append((
        "cold recovery includes the rebuilt pod's model load",
        cold.recovery_seconds >= boot,
        f"cold {cold.recovery_seconds:.2f} s, model load {boot:g} s",
    ))  # fmt: skip
    checks.append((
        "warm recovery faster than cold by more than half the model load",
        warm.recovery_seconds < cold.recovery_seconds - boot / 2,
        f"warm {warm.recovery_seconds:.2f} s, cold {cold.recovery_seconds:.2f} s",
    ))  # fmt: skip
    checks.append((
        "warm recovery failed fewer requests than cold",
        warm.failed < cold.failed,
        f"warm {warm.failed}, cold {cold.failed}",
    ))  # fmt: skip
    return checks


def render_table(report: GpuDrillReport) -> str:
    """The cold/warm comparison as Markdown."""
    lines = [
        "| mode | XID -> job (s) | recovery (s) | requests | failed | failed share | failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in report.outcomes:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(o.failures.items())) or "-"
        lines.append(
            f"| {o.mode} | {o.detect_seconds:.2f} | {o.recovery_seconds:.2f} | {o.requests} | "
            f"{o.failed} | {o.failed_share:.1%} | {kinds} |"
        )
    return "\n".join(lines)


def run_gpu_drill(config: GpuDrillConfig, say: Say = lambda _: None) -> GpuDrillReport:
    """Cold, then warm; the report (a step that failed or timed out is its error)."""
    report = GpuDrillReport(config.time_scale, config.boot_seconds, config.clients)
    try:
        clean_keys(config.redis_url, config.key_prefix)
        for mode in MODES:
            say(f"{mode}: starting its rig")
            outcome = run_mode(config, mode, say)
            report.outcomes.append(outcome)
            say(f"{mode}: recovered in {outcome.recovery_seconds:.2f} s, "
                f"{outcome.failed}/{outcome.requests} requests failed")  # fmt: skip
        report.histogram = recovery_histogram(config)
    except DRILL_FAILURES as exc:
        report.error = f"{type(exc).__name__}: {exc}"
    if report.error is None:
        report.checks = build_checks(report)
    return report


def build_result(report: GpuDrillReport, spec_budget: float, started: float) -> DrillResult:
    """The report as the board's row: the cold run's times, both modes' failures and figures."""
    cold = report.mode(catalog.RECOVERY_COLD)
    result = DrillResult(
        DRILL,
        Alert.GPU_XID_CRITICAL,
        PLAYBOOK,
        spec_budget,
        fault=f"XID on a GPU node, recovered cold then warm (time scale {report.time_scale:g}; "
        f"a pod rebuild loads for {report.boot_seconds:g} s)",
        fault_at=cold.injected_at if cold is not None else started,
    )
    if cold is not None:
        result.firing_at = cold.firing_at
        result.notified_at = cold.notified_at
        result.playbook_started_at = cold.playbook_started_at
        result.remediated_at = result.recovered_at = cold.recovered_at
        result.job_id = cold.job.id
    for outcome in report.outcomes:
        result.figure(f"{outcome.mode} recovery", outcome.recovery_seconds, "s")
        result.figure(f"{outcome.mode} failed", outcome.failed)
        result.figure(f"{outcome.mode} requests", outcome.requests)
    # The rig's clients fail on purpose and are figures; `failed_requests` stays the stack's
    # users' (run_drills counts its load generator), as every drill's: none may fail.
    for name, ok, detail in report.checks:
        result.check(name, ok, detail)
    if report.outcomes:
        result.notes.append(render_table(report))
    result.notes.append(json.dumps(report.as_dict(), sort_keys=True))
    result.error = report.error
    return result


def drill_gpu_node_failure(ctx: DrillContext) -> DrillResult:
    """`redline drill gpu-node-failure`: the rig beside the running stack, on its Redis and spec."""
    workdir = ctx.state.layout().data_dir / "gpu-drill"
    config = GpuDrillConfig(workdir, ctx.endpoints.redis_url, ctx.spec)
    started = time.time()
    report = run_gpu_drill(config, lambda message: ctx.say(DRILL, message))
    return build_result(report, pipeline_budget_seconds(ctx.spec, 0.0), started)


__all__ = [
    "DRILL",
    "GpuDrillReport",
    "build_checks",
    "build_result",
    "drill_gpu_node_failure",
    "render_table",
    "run_gpu_drill",
]
