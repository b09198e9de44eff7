"""The spot drills as `redline drill spot-one` (and the others) runs them: a fleet of their own
beside the running stack, on the stack's Redis and spec, reported as a `DrillResult`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from redline.devstack.drills.base import DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.spot.fleet import FleetConfig, SpotFleet
from redline.devstack.drills.spot.scenarios import SPOT_DRILL_ORDER, run_spot_drill
from redline.slo.alerts import Alert


def _in_stack(name: str) -> Callable[[DrillContext], DrillResult]:
    """The scenario as a `redline drill` of the running stack (its Redis, its spec)."""

    def run(ctx: DrillContext) -> DrillResult:
        workdir = ctx.state.layout().data_dir / "spot-drills" / name
        config = FleetConfig(workdir, ctx.endpoints.redis_url, ctx.spec)
        started = time.time()
        fleet = SpotFleet(config)
        try:
            fleet.start(lambda message: ctx.say(name, message))
            report = run_spot_drill(name, fleet, lambda message: ctx.say(name, message))
        finally:
            fleet.stop()
        expect_alert = name == "spot-never-ready"
        result = DrillResult(
            name,
            Alert.SPOT_REPLACEMENT_SLOW if expect_alert else "",
            None,
            0.0,
            fault=f"spot preemption of {', '.join(report.nodes)} (time scale "
            f"{report.time_scale:g})",
            fault_at=report.fault_at or started,
            expect_alert=expect_alert,
        )
        if report.fault_at is not None and report.alert_firing_after is not None:
            result.firing_at = report.fault_at + report.alert_firing_after
        if report.fault_at is not None and report.alert_resolved_after is not None:
            result.recovered_at = report.fault_at + report.alert_resolved_after
        for check, ok, detail in report.checks:
            result.check(check, ok, detail)
        result.lost = report.non_recoverable_failures
        result.lost_detail = "client-visible non-recoverable failures" + (
            f": {report.failures[0]}" if report.failures else ""
        )
        result.notes.append(json.dumps(report.as_dict(), sort_keys=True))
        result.error = report.error
        return result

    return run


SPOT_DRILLS: dict[str, Callable[[DrillContext], DrillResult]] = {
    name: _in_stack(name) for name in SPOT_DRILL_ORDER
}
"""The spot drills as `redline drill NAME` runs them on the local stack."""


__all__ = ["SPOT_DRILLS"]
