"""The latency drill: the primary region's P99 over the red line -> RedLineLatencyP99 -> the
reroute playbook moves traffic to the secondary -> P99 fine again -> routing restored."""

from __future__ import annotations

import time

from redline.devstack.drills.base import DrillError, DrillResult, parse_time
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    budget_for,
    require_quiet,
    run_playbook_loop,
    wait_firing,
    wait_job,
    wait_job_done,
    wait_recovered,
)
from redline.platform.routing import RoutingStore
from redline.rules.build import p99_record
from redline.slo.spec import parse_duration

LATENCY_FAULT_SECONDS = 0.9


def drill_latency(ctx: DrillContext) -> DrillResult:
    """Primary P99 over the red line -> RedLineLatencyP99 -> reroute -> P99 fine via secondary."""
    spec = ctx.spec
    red = spec.red_lines.latency_p99
    primary, secondary = ctx.endpoints.regions[0], ctx.endpoints.regions[1]
    result = DrillResult(
        "latency", "RedLineLatencyP99", red.playbook, budget_for(ctx, red.for_seconds)
    )
    labels = {"region": primary}
    require_quiet(ctx, result, labels)
    store = RoutingStore.from_url(ctx.endpoints.redis_url, regions=tuple(ctx.endpoints.regions))
    saved = ctx.probe.faults(primary)
    try:
        override = store.get_override()
        if override is not None:
            raise DrillError(f"a routing override is already set ({override}); clear it first")
        slow = {**saved, "latency": {"base_seconds": LATENCY_FAULT_SECONDS, "jitter": "none"}}
        result.fault = f"{primary}: +{LATENCY_FAULT_SECONDS} s on every request"
        result.fault_at = time.time()
        ctx.probe.set_faults(primary, slow)
        result.condition_delay = LATENCY_FAULT_SECONDS
        result.condition_basis = "the first slow request completes one injected latency later"
        ctx.say(result.drill, f"fault injected: {result.fault}")
        wait_firing(ctx, result, labels, 60.0)
        run_playbook_loop(ctx, result, labels, 60.0)
        now = store.get_override()
        result.check(
            "gateway routes to the secondary",
            now is not None and now.target_region == secondary,
            f"override: {now.target_region if now else None}",
        )
        record = p99_record(spec)
        threshold = red.threshold_seconds

        def secondary_ok() -> float | None:
            value = ctx.probe.value(f'{record}{{region="{secondary}"}}')
            return value if value is not None and value <= threshold else None

        p99 = ctx.wait_for(result.drill, f"P99 via {secondary} under {threshold} s",
                           secondary_ok, 30.0, 0.5)  # fmt: skip
        result.check(
            f"P99 via {secondary} under the red line", True, f"{p99:.3f} s <= {threshold} s"
        )
        ctx.say(result.drill, f"repairing {primary} (fault removed)")
        ctx.probe.set_faults(primary, saved)
        wait_recovered(ctx, result, labels, parse_duration(red.window) + 60.0)
        resolved = wait_job(ctx, result, "reroute", labels, "resolved", 30.0)
        result.resolved_notified_at = parse_time(resolved["created_at"])
        wait_job_done(ctx, result.drill, "reroute", resolved["id"], 90.0)

        def restored() -> bool | None:
            return True if store.get_override() is None else None

        ctx.wait_for(result.drill, "the routing to be restored", restored, 30.0)
        result.check("routing restored after the hold-down", True, "override cleared")
    finally:
        ctx.probe.set_faults(primary, saved)
        store.close()
    result.lost_detail = "n/a: a reroute moves requests, it writes no data"
    return result


__all__ = ["LATENCY_FAULT_SECONDS", "drill_latency"]
