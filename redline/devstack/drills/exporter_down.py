"""The exporter-down drill: the exporter is killed -> SLIAbsent (no red line goes silent) ->
the stack restarts the exporter -> resolved."""

from __future__ import annotations

import signal
import time

from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    budget_for,
    require_quiet,
    wait_acknowledged,
    wait_firing,
    wait_recovered,
)
from redline.devstack.parts import part_alive, restart_part, signal_part
from redline.slo.alerts import Alert

EXPORTER_SLIS = ("session_rpo", "index_staleness")


def drill_exporter_down(ctx: DrillContext) -> DrillResult:
    """Exporter killed -> SLIAbsent (no silent red line) -> exporter restarted -> resolved."""
    spec = ctx.spec
    result = DrillResult("exporter-down", Alert.SLI_ABSENT, None,
                         budget_for(ctx, spec.timing.absent_for_seconds))  # fmt: skip
    labels = {"sli": EXPORTER_SLIS[0]}
    for sli in EXPORTER_SLIS:
        require_quiet(ctx, result, {"sli": sli})
    part = ctx.state.part("exporters")
    if part is None or not part_alive(part):
        raise DrillError("the exporter is not running")
    result.fault = f"exporter process killed (SIGKILL, pid {part.pid})"
    result.fault_at = time.time()
    signal_part(part, signal.SIGKILL)
    ctx.say(result.drill, f"fault injected: {result.fault}")
    result.condition_basis = "its series go stale at the next failed scrape"
    try:
        wait_firing(ctx, result, labels, 60.0)
        others = [s for s in EXPORTER_SLIS[1:] if ctx.probe.alerts(result.alert, {"sli": s})]
        result.check(
            "every SLI of the exporter is reported absent",
            len(others) == len(EXPORTER_SLIS) - 1,
            f"also active: {', '.join(others) or 'none'}",
        )
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 30.0)
    finally:
        ctx.say(result.drill, "restarting the exporter")
        fresh = restart_part(ctx.state, "exporters")
    result.remediated_at = time.time()
    result.notes.append(f"no playbook: the stack restarted the exporter (new pid {fresh.pid})")
    wait_recovered(ctx, result, labels, 60.0)
    for sli in EXPORTER_SLIS[1:]:

        def resolved(sli: str = sli) -> bool | None:
            return True if not ctx.probe.alerts(result.alert, {"sli": sli}) else None

        ctx.wait_for(result.drill, f"{Alert.SLI_ABSENT} {sli} to resolve", resolved, 30.0)
    result.resolved_notified_at = wait_acknowledged(ctx, result, labels, "resolved", 30.0)
    result.lost_detail = "n/a: a dead exporter loses measurements, not user data"
    return result


__all__ = ["EXPORTER_SLIS", "drill_exporter_down"]
