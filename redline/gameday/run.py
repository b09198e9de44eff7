"""`redline gameday run`: one experiment on the user's cluster, measured, judged and removed.

1. `gameday.start` is audited with the plan; then the fault: with `--apply` the Chaos Mesh object
   is created (`gameday.applied`), otherwise the operator injects it by hand and confirms
   (`gameday.injected`). The fault's time is the moment after either.
2. Every `poll_seconds` the observer reads Prometheus, Alertmanager and the receiver, and the
   timeline keeps each step's first sighting. Each step first seen is audited (`gameday.step`).
3. The fault lasts the experiment's duration (at most `--max-duration`): then the experiment is
   deleted (`gameday.removed`), whether or not Chaos Mesh already ended it. The game day goes on
   watching until the expected alert has resolved, at most until the RTO budget (or the
   duration, if longer) has passed since the fault; a negative drill ends with its fault. An
   abort condition (`gameday.abort`) ends it at once.
4. Whatever ended it (recovery, the watch's end, an abort, an error, Ctrl-C), the experiment is
   deleted if it is still there, then the failed requests (the error counter's increase over the
   game day) and the RPO (the worst value of the drill's RPO series) are read from Prometheus,
   the result judged against the budgets and audited (`gameday.result`).

Clock, sleep and the confirmation are parameters, so tests drive the loop with real services and
their own pace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import httpx

from redline.gameday.audit import Audit
from redline.gameday.cluster import ChaosMeshApi
from redline.gameday.observe import Observer, Timeline, abort_reason, advance
from redline.gameday.plan import GamedayPlan
from redline.gameday.report import GamedayResult, judge
from redline.platform.prometheus import PrometheusError
from redline.platform.spot import KubernetesError

SOURCE_ERRORS = (PrometheusError, httpx.HTTPError, KeyError, ValueError)
"""What a poll may raise when a source misbehaves: the game day stops, removes the experiment
and reports the error."""
STEPS = ("firing_at", "alertmanager_at", "notified_at", "playbook_started_at", "remediated_at",
         "recovered_at")  # fmt: skip


def _done(plan: GamedayPlan, timeline: Timeline, now: float) -> bool:
    if plan.expects is None:
        return now - timeline.fault_at >= plan.duration_seconds
    return timeline.recovered_at is not None


def watch_seconds(plan: GamedayPlan) -> float:
    """How long after the fault the game day watches at most for the recovery."""
    return max(plan.duration_seconds, plan.rto_budget_seconds)


def _window(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


def run_gameday(
    plan: GamedayPlan,
    observer: Observer,
    audit: Audit,
    chaos: ChaosMeshApi | None = None,
    *,
    confirm: Callable[[], None] | None = None,
    poll_seconds: float = 1.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = print,
) -> GamedayResult:
    """Run one game day to its end; the result (never raises for a source or API failure)."""
    audit.append(
        "gameday.start",
        drill=plan.drill,
        experiment=plan.experiment,
        expects=plan.expects,
        max_duration_seconds=plan.safety.max_duration_seconds,
    )
    applied = False
    timeline = Timeline(fault_at=clock())
    result = GamedayResult(plan, timeline, ended_at=timeline.fault_at)
    try:
        if chaos is not None:
            chaos.apply(plan)
            applied = True
            audit.append(
                "gameday.applied", object_kind=plan.kind, name=plan.name, namespace=plan.namespace
            )
            say(f"applied {plan.kind} {plan.namespace}/{plan.name}")
        elif confirm is not None:
            confirm()
            audit.append("gameday.injected", by="operator")
        timeline.fault_at = clock()
        fault_ends = timeline.fault_at + plan.duration_seconds
        watch_ends = timeline.fault_at + watch_seconds(plan)
        while True:
            now = clock()
            seen = observer.fetch(plan, now, timeline.fault_at)
            before = {step: getattr(timeline, step) for step in STEPS}
            advance(timeline, plan, seen)
            for step in STEPS:
                if before[step] is None and getattr(timeline, step) is not None:
                    since = timeline.since_fault(getattr(timeline, step))
                    audit.append("gameday.step", step=step.removesuffix("_at"), seconds=since)
                    say(f"[{now - timeline.fault_at:6.1f} s] {step.removesuffix('_at')}: {since} s")
            reason = abort_reason(plan, timeline, seen)
            if reason is not None:
                result.aborted = reason
                audit.append("gameday.abort", reason=reason)
                say(f"ABORT: {reason}")
                break
            if _done(plan, timeline, now) or now >= watch_ends:
                break
            if applied and now >= fault_ends:
                applied = not _remove(plan, chaos, audit, say, "its duration passed")
            sleep(poll_seconds)
    except (KubernetesError, *SOURCE_ERRORS) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        audit.append("gameday.error", error=result.error)
    finally:
        result.ended_at = clock()
        if applied:
            try:
                _remove(plan, chaos, audit, say, "the game day ended")
            except KubernetesError as exc:
                result.error = f"the experiment could not be deleted (delete it by hand): {exc}"
                audit.append("gameday.error", error=result.error)
    _measure_after(plan, observer, result)
    result.problems += judge(result)
    audit.append("gameday.result", verdict="pass" if result.ok else "fail",
                 problems=result.problems, aborted=result.aborted, error=result.error,
                 rto_seconds=result.rto_seconds, rpo_seconds=result.rpo_seconds,
                 failed_requests=result.failed_requests)  # fmt: skip
    return result


def _remove(
    plan: GamedayPlan,
    chaos: ChaosMeshApi | None,
    audit: Audit,
    say: Callable[[str], None],
    why: str,
) -> bool:
    """Delete the experiment (audited); True once it is gone."""
    assert chaos is not None
    existed = chaos.remove(plan)
    audit.append("gameday.removed", name=plan.name, existed=existed, why=why)
    say(f"removed {plan.kind} {plan.namespace}/{plan.name} ({why})")
    return True


def _measure_after(plan: GamedayPlan, observer: Observer, result: GamedayResult) -> None:
    """Failed requests and the RPO over the game day, from Prometheus."""
    window = _window(result.ended_at - result.timeline.fault_at)
    try:
        failed = observer.scalar(
            plan.failed_requests_query.replace("$window", window), result.ended_at
        )
        result.failed_requests = 0.0 if failed is None else failed
        if plan.rpo_query is not None:
            result.rpo_seconds = observer.scalar(f"max_over_time(({plan.rpo_query})[{window}:])",
                                                 result.ended_at)  # fmt: skip
    except SOURCE_ERRORS as exc:
        result.error = result.error or f"{type(exc).__name__}: {exc}"
