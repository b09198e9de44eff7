"""The session-RPO drill: the session replica consumer is frozen (SIGSTOP) while sessions are
written -> SessionRPOBreach -> acknowledged by the receiver (no playbook) -> resumed -> every
acknowledged session write on the replica."""

from __future__ import annotations

import signal
import time
import uuid

from redline.devstack.drills.base import DrillError, DrillResult, parse_time
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    budget_for,
    require_quiet,
    wait_acknowledged,
    wait_recovered,
)
from redline.devstack.parts import part_alive, signal_part
from redline.platform.sessions import SessionWriter, open_redis, stream_id_ms
from redline.slo.alerts import Alert


def drill_session_rpo(ctx: DrillContext) -> DrillResult:
    """Replica consumer frozen (stops reading and ACKing) -> SessionRPOBreach -> resumed."""
    spec = ctx.spec
    target = spec.rpo.session_state
    result = DrillResult("session-rpo", Alert.SESSION_RPO_BREACH, target.playbook,
                         budget_for(ctx, target.for_seconds))  # fmt: skip
    labels: dict[str, str] = {}
    require_quiet(ctx, result, labels)
    part = ctx.state.part("session-replica")
    if part is None or not part_alive(part):
        raise DrillError("the session replica consumer is not running")
    primary = open_redis(ctx.endpoints.redis_url, timeout_seconds=5.0)
    replica = open_redis(ctx.endpoints.session_replica_url, timeout_seconds=5.0)
    writer = SessionWriter(primary)
    run = uuid.uuid4().hex[:6]
    written: dict[str, str] = {}
    stopped = False
    try:
        result.fault = "session replica consumer frozen (SIGSTOP): it stops reading and ACKing"
        result.fault_at = time.time()
        signal_part(part, signal.SIGSTOP)
        stopped = True
        ctx.say(result.drill, f"fault injected: {result.fault}")
        first_id: str | None = None
        deadline = time.monotonic() + 60.0
        while result.firing_at is None and time.monotonic() < deadline:
            session = f"drill-rpo-{run}-{len(written)}"
            value = f'{{"turn": {len(written)}, "at": {time.time():.3f}}}'
            entry = writer.write(session, value)
            first_id = first_id or entry
            written[session] = value
            alerts = [a for a in ctx.probe.alerts(result.alert) if a["state"] == "firing"]
            if alerts:
                result.firing_at = time.time()
                result.pending_at = parse_time(alerts[0]["activeAt"])
                break
            time.sleep(0.2)
        if result.firing_at is None:
            raise DrillError(f"timed out after 60 s waiting for {result.alert} to fire")
        ctx.say(result.drill, f"{result.alert} firing after {result.since_fault(result.firing_at)}")
        assert first_id is not None
        onset = stream_id_ms(first_id) / 1000.0 + target.max_seconds
        result.condition_delay = max(0.0, onset - result.fault_at)
        result.condition_basis = (
            f"the first unreplicated write is {target.max_seconds:g} s old (the RPO)"
        )
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 30.0)
        result.notes.append("no playbook in the spec for session_state: the drill resumes it")
        ctx.say(result.drill, "repairing the consumer (SIGCONT)")
        signal_part(part, signal.SIGCONT)
        stopped = False
        result.remediated_at = time.time()
        wait_recovered(ctx, result, labels, 60.0)
        result.resolved_notified_at = wait_acknowledged(ctx, result, labels, "resolved", 30.0)
    finally:
        if stopped and part_alive(part):
            signal_part(part, signal.SIGCONT)

    def replicated() -> list[str] | None:
        missing = [s for s, v in written.items() if replica.get(writer.layout.key_for(s)) != v]
        return missing or None

    try:
        time.sleep(1.0)
        missing = replicated() or []
    finally:
        primary.close()
        replica.close()
    result.lost = len(missing)
    result.lost_detail = (
        f"{len(written)} session writes acknowledged during the fault; "
        f"{len(missing)} missing or different on the replica"
    )
    result.check("session writes on the replica", not missing, result.lost_detail)
    return result


__all__ = ["drill_session_rpo"]
