"""Run drills on one stack, one at a time: each restores what it broke and waits until the stack
is back to normal, so the next starts clean. An alert that resolves slowly (the rollback gate's)
is awaited in the background while the next drills run, and at the end."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence

import httpx

from redline.core.locks import exclusive_lock
from redline.devstack.drills.base import DrillError, DrillResult, Progress, matching_alerts
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.probe import StackProbe, open_prometheus
from redline.devstack.drills.registry import ALLOWANCES, DRILLS, resolve_names
from redline.devstack.layout import StackLayout
from redline.devstack.state import StackState
from redline.platform.prometheus import PrometheusError
from redline.slo.spec import Spec


def drill_lock(layout: StackLayout) -> contextlib.AbstractContextManager[None]:
    """One drill run per stack at a time: two would break each other's faults."""
    busy = DrillError(f"drills are already running on the stack in {layout.root}; wait for them")
    return exclusive_lock(layout.root / ".drill.lock", busy)


def run_drill(name: str, ctx: DrillContext) -> DrillResult:
    """Run one drill; a drill that breaks off is a failed result carrying the reason."""
    started = time.time()
    failures = ctx.probe.loadgen_failures()
    try:
        result = DRILLS[name](ctx)
    except Exception as exc:  # one broken drill is a failed result; the others still run
        result = DrillResult(name, "", None, 0.0, fault_at=started)
        result.error = str(exc) if isinstance(exc, DrillError) else f"{type(exc).__name__}: {exc}"
        ctx.say(name, f"FAILED: {result.error}")
    result.finished_at = time.time()
    try:
        counts = ctx.probe.loadgen_failures()
    except OSError:
        counts = {}
    failed = {k: v - failures.get(k, 0) for k, v in counts.items() if v - failures.get(k, 0)}
    if result.failed_requests is None:  # a drill may count its own clients' failures
        result.failed_requests = sum(failed.values())
        result.failed_detail = ", ".join(f"{n} x {status}" for status, n in sorted(failed.items()))
    allowance = ALLOWANCES[name]
    result.allowed_failures, result.allowance = allowance.failed_requests, allowance.why
    return result


class DeferredWatcher:
    """Polls deferred alerts in a thread so their resolution is timed while other drills run."""

    def __init__(self, ctx: DrillContext, interval: float = 0.25) -> None:
        self.ctx = ctx
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill-recovery", daemon=True)

    def _run(self) -> None:
        with open_prometheus(self.ctx.endpoints, timeout=5.0) as prometheus:
            while not self.stop.wait(self.interval):
                for item in list(self.ctx.deferred):
                    if item.result.recovered_at is not None:
                        continue
                    try:
                        alerts = prometheus.alerts()
                    except PrometheusError:
                        continue
                    active = matching_alerts(alerts, item.result.alert, item.labels)
                    if not active:
                        item.result.recovered_at = time.time()
                        self.ctx.say(item.result.drill, "recovered (alert resolved)")

    def __enter__(self) -> DeferredWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def run_drills(
    names: Sequence[str],
    state: StackState,
    spec: Spec,
    progress: Progress,
    on_result: Callable[[DrillResult], None] | None = None,
) -> list[DrillResult]:
    """Run the named drills in sequence on one stack; deferred recoveries are awaited last."""
    wanted = resolve_names(names)
    results: list[DrillResult] = []
    with (
        drill_lock(state.layout()),
        httpx.Client(timeout=10.0, trust_env=False) as http,
        open_prometheus(state.endpoints()) as prometheus,
    ):
        ctx = DrillContext(state, spec, StackProbe(state, http, prometheus), progress)
        ctx.defer_recovery = len(wanted) > 1
        with DeferredWatcher(ctx):
            for name in wanted:
                progress(name, "starting")
                result = run_drill(name, ctx)
                results.append(result)
                if any(item.result is result for item in ctx.deferred):
                    progress(name, "remediated; its alert resolves in the background")
                elif on_result is not None:
                    on_result(result)
            for item in ctx.deferred:
                if item.result.recovered_at is None:
                    remaining = max(1.0, item.deadline - time.time())

                    def resolved(r: DrillResult = item.result) -> bool | None:
                        return True if r.recovered_at is not None else None

                    try:
                        what = f"{item.result.alert} to resolve"
                        ctx.wait_for(item.result.drill, what, resolved, remaining, 0.5)
                    except DrillError as exc:
                        item.result.error = str(exc)
                item.result.finished_at = time.time()
                progress(
                    item.result.drill,
                    f"recovered after {item.result.since_fault(item.result.recovered_at)} s",
                )
                if on_result is not None:
                    on_result(item.result)
    return results


__all__ = ["DeferredWatcher", "drill_lock", "run_drill", "run_drills"]
