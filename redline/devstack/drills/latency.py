"""The latency drill: the primary region's P99 over the red line -> RedLineLatencyP99 -> the
reroute playbook moves traffic to the secondary -> P99 fine again -> routing restored.

In a stack without redline's gateway (`redline up --source vllm`) nothing can reroute: the
spec's latency red line has no playbook there (`build_source_spec`), so the alert pages a human
and the receiver acknowledges it in the audit trail; the drill checks that no routing override
was set, plays the human by removing the fault, and times the recovery."""

from __future__ import annotations

import time

from redline.devstack.drills.base import DrillError, DrillResult, parse_time
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.restore import (
    load_reroute_settings,
    restore_bound,
    restore_for_seconds,
)
from redline.devstack.drills.settle import settle_seconds
from redline.devstack.drills.waits import (
    budget_for,
    firing_timeout,
    require_quiet,
    run_playbook_loop,
    wait_acknowledged,
    wait_firing,
    wait_job,
    wait_job_done,
    wait_recovered,
)
from redline.platform.routing import RoutingStore
from redline.remediation.settings import RerouteSettings
from redline.rules.build import p99_record
from redline.slo.alerts import Alert
from redline.slo.spec import parse_duration

LATENCY_FAULT_SECONDS = 0.9


def drill_latency(ctx: DrillContext) -> DrillResult:
    """Primary P99 over the red line -> RedLineLatencyP99 -> reroute -> P99 fine via secondary
    (without a gateway: -> paged, acknowledged -> fault removed -> P99 fine again)."""
    if not ctx.endpoints.has_gateway:
        return _drill_latency_paged(ctx)
    spec = ctx.spec
    red = spec.red_lines.latency_p99
    primary, secondary = ctx.endpoints.regions[0], ctx.endpoints.regions[1]
    result = DrillResult(
        "latency", Alert.RED_LINE_LATENCY_P99, red.playbook, budget_for(ctx, red.for_seconds)
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
        wait_firing(ctx, result, labels, firing_timeout(result, LATENCY_FAULT_SECONDS))
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

        ctx.wait_for(result.drill, "the routing to be restored", restored, restore_wait(ctx))
        result.check("routing restored after the hold-down", True, "override cleared")
    finally:
        ctx.probe.set_faults(primary, saved)
        store.close()
    result.lost_detail = "n/a: a reroute moves requests, it writes no data"
    return result


def restore_wait(ctx: DrillContext) -> float:
    """How long the routing may take to be restored once the resolved job ended: the restore
    bound of the running worker's settings, and, when the region that took the traffic breached
    in turn (a loaded machine) and was rerouted away from, its own alert's evidence to clear and
    its pipeline, twice over (the bound `require_quiet` waits for a quiet stack)."""
    try:
        settings = load_reroute_settings(ctx.probe.layout)
    except DrillError:
        # A stack whose worker reads its settings elsewhere (the compose services): the
        # playbook's defaults, the longest hold-down it would use, bound the wait.
        settings = RerouteSettings()
    bound = restore_bound(
        restore_for_seconds(settings, ctx.spec),
        settings.restore_check_seconds,
        ctx.spec,
        ctx.endpoints.federated,
    )
    evidence = settle_seconds(ctx.spec, Alert.RED_LINE_LATENCY_P99, budget_for(ctx, 0.0))
    return settings.hold_down_seconds + bound + evidence


def _drill_latency_paged(ctx: DrillContext) -> DrillResult:
    """No gateway: the breach pages a human (no playbook), nothing is rerouted; the fault's
    removal is the repair and the alert resolves once the slow requests leave the window."""
    spec = ctx.spec
    red = spec.red_lines.latency_p99
    primary = ctx.endpoints.regions[0]
    result = DrillResult(
        "latency", Alert.RED_LINE_LATENCY_P99, red.playbook, budget_for(ctx, red.for_seconds)
    )
    if red.playbook is not None:
        raise DrillError(
            f"red_lines.latency_p99.playbook is {red.playbook!r}, but the {ctx.endpoints.source} "
            "stack has no gateway: its spec pages a human on this red line (no playbook)"
        )
    labels = {"region": primary}
    require_quiet(ctx, result, labels)
    store = RoutingStore.from_url(ctx.endpoints.redis_url, regions=tuple(ctx.endpoints.regions))
    saved = ctx.probe.faults(primary)
    try:
        slow = {**saved, "latency": {"base_seconds": LATENCY_FAULT_SECONDS, "jitter": "none"}}
        result.fault = f"{primary}: +{LATENCY_FAULT_SECONDS} s on every request"
        result.fault_at = time.time()
        ctx.probe.set_faults(primary, slow)
        result.condition_delay = LATENCY_FAULT_SECONDS
        result.condition_basis = "the first slow request completes one injected latency later"
        ctx.say(result.drill, f"fault injected: {result.fault}")
        wait_firing(ctx, result, labels, firing_timeout(result, LATENCY_FAULT_SECONDS))
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 60.0)
        ctx.say(result.drill, "paged: the receiver acknowledged the alert (no playbook)")
        override = store.get_override()
        result.check(
            "nothing rerouted (no gateway in the path)",
            override is None,
            f"routing override: {override.target_region if override else None}",
        )
        ctx.say(result.drill, f"repairing {primary} (fault removed, as the paged human would)")
        ctx.probe.set_faults(primary, saved)
        restored = ctx.probe.faults(primary)
        result.remediated_at = time.time()
        result.check(
            f"{primary} fault removed",
            restored.get("latency") == saved.get("latency"),
            f"latency knobs: {restored.get('latency')}",
        )
        wait_recovered(ctx, result, labels, parse_duration(red.window) + 60.0)
        result.resolved_notified_at = wait_acknowledged(ctx, result, labels, "resolved", 30.0)
        record = p99_record(spec)
        threshold = red.threshold_seconds
        p99 = ctx.probe.value(f'{record}{{region="{primary}"}}')
        result.check(
            f"P99 of {primary} under the red line again",
            p99 is not None and p99 <= threshold,
            f"{p99} s <= {threshold} s",
        )
    finally:
        ctx.probe.set_faults(primary, saved)
        store.close()
    result.notes.append(
        f"no gateway in the {ctx.endpoints.source} stack: nothing can reroute, so the red line "
        "pages a human (no playbook); the drill removes the fault as that human would"
    )
    result.lost_detail = "n/a: no data is written"
    return result


__all__ = ["LATENCY_FAULT_SECONDS", "drill_latency", "restore_wait"]
