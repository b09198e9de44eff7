"""The partition drill: the CRDT session sync between the first two regions is cut (both sync
processes paused through their regions' flag) while both regions write to the same sessions,
conflicting edits included -> SessionCrdtRPOBreach -> acknowledged by the receiver (no playbook)
-> healed -> both regions converge to the same state, with every acknowledged message there
unless a newer remove took it (last writer wins), and the convergence time printed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    budget_for,
    require_quiet,
    wait_acknowledged,
    wait_firing,
    wait_recovered,
)
from redline.devstack.layout import build_session_sync_parts
from redline.devstack.parts import part_alive
from redline.platform import crdt
from redline.platform.session_sync import (
    CrdtSessionStore,
    WriteReceipt,
    set_paused,
    wait_converged,
)
from redline.platform.sessions import open_redis
from redline.slo import catalog
from redline.slo.alerts import Alert

SESSIONS = 6
SHARED = ("greeting", "plan")
"""Messages both regions hold before the cut and then edit or remove on both sides."""


def _expected(
    base: dict[str, crdt.SessionState], receipts: Sequence[WriteReceipt]
) -> dict[str, crdt.SessionState]:
    states = dict(base)
    for receipt in receipts:
        states[receipt.session_id] = crdt.apply(
            states.get(receipt.session_id, crdt.EMPTY), receipt.op
        )
    return states


def _lost_messages(
    state: crdt.SessionState, receipts: Sequence[WriteReceipt], session_id: str
) -> list[str]:
    """Acknowledged message ops the state does not honour: an add whose element is absent
    though no newer remove exists, or a remove whose element is present though no newer add."""
    ops = [r.op for r in receipts if r.session_id == session_id]
    problems = []
    for op in ops:
        if not op.element.startswith(f"{crdt.Kind.MESSAGE.value}:"):
            continue
        later = [o for o in ops if o.element == op.element and o.stamp > op.stamp]
        if op.is_add and not any(not o.is_add for o in later):
            if not crdt.present(state, op.element):
                problems.append(f"{session_id}/{op.element}: acknowledged add missing")
        elif not op.is_add and not any(o.is_add for o in later):
            if crdt.present(state, op.element):
                problems.append(f"{session_id}/{op.element}: acknowledged remove not honoured")
    return problems


def drill_partition(ctx: DrillContext) -> DrillResult:
    """Cut the CRDT session sync, write on both sides, heal, prove convergence."""
    target = ctx.spec.rpo.session_crdt
    regions = list(ctx.endpoints.crdt_session_urls)
    result = DrillResult("partition", Alert.SESSION_CRDT_RPO_BREACH, target.playbook,
                         budget_for(ctx, target.for_seconds))  # fmt: skip
    parts = [ctx.state.part(name) for name in build_session_sync_parts(ctx.state.regions)]
    if len(regions) < 2 or any(part is None for part in parts):
        result.not_applicable = "this run has no CRDT session sync (started before it existed)"
        return result
    if not all(part is not None and part_alive(part) for part in parts):
        raise DrillError("a CRDT session sync process is not running")
    first, second = regions[0], regions[1]
    labels = {"source_region": first, "target_region": second}
    require_quiet(ctx, result, labels)
    urls = ctx.endpoints.crdt_session_urls
    clients = [open_redis(urls[region], timeout_seconds=5.0) for region in (first, second)]
    a, b = (CrdtSessionStore(c, r) for c, r in zip(clients, (first, second), strict=True))
    run = uuid.uuid4().hex[:6]
    sessions = [f"drill-partition-{run}-{n}" for n in range(SESSIONS)]
    receipts: list[WriteReceipt] = []
    cut = False
    try:
        # Before the cut: each session has the shared messages in both regions.
        for session in sessions:
            for message in SHARED:
                receipts.append(a.add_message(session, message, f"{message} from {first}"))
            receipts.append(b.set_variable(session, "lang", "en"))
        if wait_converged((a, b), sessions, timeout=30.0) is None:
            raise DrillError("the regions did not converge before the cut (is the sync running?)")
        base = {s: a.state(s) for s in sessions}
        receipts.clear()

        result.fault = "CRDT session sync cut both ways (pause flag in both regions)"
        set_paused(a.client, True)
        set_paused(b.client, True)
        cut = True
        result.fault_at = time.time()
        ctx.say(result.drill, f"fault injected: {result.fault}")
        result.condition_delay = target.max_seconds
        result.condition_basis = (
            f"the first unsynced delta is {target.max_seconds:g} s old (the RPO)"
        )
        turn = 0

        def write_both() -> None:
            nonlocal turn
            for session in sessions:
                receipts.append(a.add_message(session, f"{first}-{turn}", f"turn {turn}"))
                receipts.append(b.add_message(session, f"{second}-{turn}", f"turn {turn}"))
                # Conflicting edits: both set the topic; one edits, the other removes a
                # shared message, the other way round for the second one.
                receipts.append(a.set_variable(session, "topic", f"{first} {turn}"))
                receipts.append(b.set_variable(session, "topic", f"{second} {turn}"))
                if turn == 0:
                    receipts.append(a.remove_message(session, SHARED[0]))
                    receipts.append(b.add_message(session, SHARED[0], f"edited in {second}"))
                    receipts.append(b.remove_message(session, SHARED[1]))
                    receipts.append(a.add_message(session, SHARED[1], f"edited in {first}"))
                if turn == 1:
                    receipts.append(b.unset_variable(session, "lang"))
            turn += 1

        def firing() -> bool | None:
            write_both()
            alerts = [x for x in ctx.probe.alerts(result.alert, labels) if x["state"] == "firing"]
            return True if alerts else None

        ctx.wait_for(result.drill, "writes on both sides until the RPO alert", firing, 90.0, 0.5)
        wait_firing(ctx, result, labels, 10.0)
        # The writes stop; once the sessions are quiet past the probe's settle time the
        # divergence gauge counts them (a session still being written is the RPO's to catch).
        query = f"max({catalog.SESSION_CRDT_DIVERGENT_SESSIONS})"

        def divergent() -> float | None:
            value = ctx.probe.value(query)
            return value if value is not None and value >= len(sessions) else None

        seen = ctx.wait_for(result.drill, "the divergent sessions gauge", divergent, 30.0, 0.2)
        result.figure("divergent sessions before the heal", int(seen))
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 30.0)
        result.notes.append("no playbook in the spec for session_crdt: the drill heals it")

        ctx.say(result.drill, "healing the partition (pause flags cleared)")
        healed_at = time.time()
        set_paused(a.client, False)
        set_paused(b.client, False)
        cut = False
        converged = wait_converged((a, b), sessions, timeout=60.0)
        if converged is None:
            raise DrillError("the regions did not converge within 60 s of the heal")
        result.remediated_at = healed_at + converged
        result.figure("convergence after heal", converged, "s")
        result.figure("operations during the partition", len(receipts))
        ctx.say(result.drill, f"converged {converged:.3f} s after the heal "
                f"({len(receipts)} operations written during the partition)")  # fmt: skip
        wait_recovered(ctx, result, labels, 60.0)
        result.resolved_notified_at = wait_acknowledged(ctx, result, labels, "resolved", 30.0)

        expected = _expected(base, receipts)
        in_a = {s: a.state(s) for s in sessions}
        in_b = {s: b.state(s) for s in sessions}
        identical = all(crdt.same_content(in_a[s], in_b[s]) for s in sessions)
        result.check("both regions hold identical states", identical,
                     f"{len(sessions)} sessions compared element by element")  # fmt: skip
        matches = all(crdt.same_content(in_a[s], expected[s]) for s in sessions)
        result.check("states equal the CRDT merge of every acknowledged operation", matches,
                     f"{len(receipts)} operations replayed by redline.platform.crdt")  # fmt: skip
        problems = [p for s in sessions for p in _lost_messages(in_a[s], receipts, s)]
        result.lost = len(problems)
        result.lost_detail = (
            f"{len(receipts)} operations acknowledged during the partition; "
            f"{len(problems)} messages lost or removes not honoured"
            + (f": {', '.join(problems[:5])}" if problems else "")
        )
        result.check("no acknowledged message lost, removes honoured", not problems,
                     result.lost_detail)  # fmt: skip
    finally:
        if cut:
            set_paused(a.client, False)
            set_paused(b.client, False)
        for client in clients:
            client.close()
    return result


__all__ = ["drill_partition"]
