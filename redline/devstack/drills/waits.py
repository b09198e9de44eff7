"""The steps every drill waits through: quiet before the fault, firing, the webhook, the
playbook's job and its verify step, the audit trail's acknowledgement, the alert resolved."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

from redline.devstack.config import pipeline_budget_seconds
from redline.devstack.drills.base import DrillError, DrillResult, labels_match, parse_time
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.settle import diagnose, settle_seconds
from redline.devstack.parts import part_alive


def budget_for(ctx: DrillContext, for_seconds: float) -> float:
    """The pipeline budget of an alert with this `for` (one more scrape through federation)."""
    federated = ctx.endpoints.federated
    return round(pipeline_budget_seconds(ctx.spec, for_seconds, federated), 3)


def firing_timeout(result: DrillResult, onset_seconds: float) -> float:
    """How long to wait for the drill's alert to fire: the condition's onset after the fault plus
    the pipeline budget twice over (a busy machine), never under a minute. With production timing
    (15 s scrape and evaluation) a fixed minute is shorter than the pipeline itself."""
    return max(60.0, onset_seconds + 2 * result.budget_seconds)


def require_quiet(
    ctx: DrillContext,
    result: DrillResult,
    labels: Mapping[str, str],
    alert: str | None = None,
) -> None:
    """The drill's alert (or `alert`) must not be active before the fault: wait for the stack
    to settle (a previous drill, a busy machine) as long as the alert's evidence takes to
    clear, twice over; then fail naming the figure, the machine's load and the slowest parts."""
    name = alert or result.alert

    def quiet() -> bool | None:
        return True if not ctx.probe.alerts(name, labels) else None

    bound = settle_seconds(ctx.spec, name, budget_for(ctx, 0.0))
    what = f"{name} to be inactive before the fault"
    try:
        ctx.wait_for(result.drill, what, quiet, bound)
    except DrillError:
        found = diagnose(ctx, name, labels)
        raise DrillError(f"the stack did not settle within {bound:.0f} s: {found}") from None


def require_loadgen(ctx: DrillContext) -> None:
    """DrillError unless the stack's load generator runs (a drill that pauses it must see it
    resume afterwards)."""
    loadgen = ctx.state.part("loadgen")
    if loadgen is None or not part_alive(loadgen):
        raise DrillError("the load generator is not running")


class LoadgenPause:
    """The stack's load generator paused by its pause file (requests in flight finish, no new
    one starts) and resumed, once, however the drill ends: call `resume` in a `finally`."""

    def __init__(self, ctx: DrillContext) -> None:
        require_loadgen(ctx)
        self.path = ctx.state.layout().loadgen_pause

    def pause(self, why: str) -> None:
        """Pause the load generator, saying why in its pause file."""
        self.path.write_text(f"{why}\n")

    def resume(self) -> None:
        """Resume the load generator (nothing to do when it runs)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def wait_firing(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    """Wait for the alert to fire; record when (and when it went pending)."""

    def firing() -> dict[str, Any] | None:
        for alert in ctx.probe.alerts(result.alert, labels):
            if alert["state"] == "firing":
                return alert
        return None

    alert = ctx.wait_for(result.drill, f"{result.alert} to fire", firing, timeout)
    result.firing_at = time.time()
    if alert.get("activeAt"):
        result.pending_at = parse_time(alert["activeAt"])
    ctx.say(result.drill, f"{result.alert} firing after {result.since_fault(result.firing_at)} s")
    return alert


def job_matches(job: Mapping[str, Any], alertname: str, labels: Mapping[str, str]) -> bool:
    """True when the job was started by the alert `alertname` with these labels."""
    alert = job.get("alert") or {}
    return labels_match(alert.get("labels") or {}, {"alertname": alertname, **labels})


def wait_job(
    ctx: DrillContext,
    result: DrillResult,
    playbook: str,
    labels: Mapping[str, str],
    status: str,
    timeout: float,
) -> dict[str, Any]:
    """Wait for the receiver's job of this alert (firing or resolved) created after the fault."""
    after = (result.fault_at or 0.0) - 1.0

    def created() -> dict[str, Any] | None:
        for job in ctx.probe.jobs(playbook):
            if not job_matches(job, result.alert, labels):
                continue
            if (job.get("alert") or {}).get("status") != status:
                continue
            if parse_time(job["created_at"]) >= after:
                return job
        return None

    return ctx.wait_for(result.drill, f"the {status} webhook at the receiver", created, timeout)


def wait_job_done(
    ctx: DrillContext, drill: str, playbook: str, job_id: str, timeout: float
) -> dict[str, Any]:
    """Wait until a job ends; DrillError naming its error when it failed."""

    def done() -> dict[str, Any] | None:
        job = ctx.probe.job(job_id)
        return job if job["status"] in ("succeeded", "failed", "planned") else None

    job = ctx.wait_for(drill, f"job {job_id} ({playbook}) to finish", done, timeout, 0.2)
    if job["status"] != "succeeded":
        raise DrillError(f"job {job_id} ({playbook}) ended {job['status']}: {job.get('error')}")
    return job


def step_time(job: Mapping[str, Any], phase: str, name: str | None = None) -> float | None:
    """When the job recorded its first step of `phase` (and `name`), ok or not."""
    for step in job.get("steps") or []:
        if step.get("phase") == phase and (name is None or step.get("name") == name):
            return float(step["at"])
    return None


def last_verify(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The job's last successful verify step (None: it recorded none)."""
    steps = [s for s in job.get("steps") or [] if s.get("phase") == "verify" and s.get("ok")]
    return steps[-1] if steps else None


def run_playbook_loop(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    """Notification -> playbook start -> verified, from the receiver's job record."""
    assert result.playbook is not None
    job = wait_job(ctx, result, result.playbook, labels, "firing", timeout)
    result.job_id = job["id"]
    result.notified_at = parse_time(job["created_at"])
    ctx.say(result.drill, f"webhook received: job {job['id']} ({result.playbook})")
    job = wait_job_done(ctx, result.drill, result.playbook, job["id"], timeout)
    result.playbook_started_at = step_time(job, "plan")
    verify = last_verify(job)
    if verify is not None:
        result.remediated_at = float(verify["at"])
        result.check("playbook verified", True, str(verify.get("detail", "")))
    else:
        result.check("playbook verified", False, "the job succeeded without a verify record")
    ctx.say(result.drill, f"{result.playbook} verified: {verify.get('detail') if verify else ''}")
    return job


def wait_acknowledged(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], status: str, timeout: float
) -> float:
    """When the receiver acknowledged the webhook of an alert without a playbook (audit trail)."""
    after = (result.fault_at or 0.0) - 1.0

    def seen() -> float | None:
        for record in ctx.probe.audit():
            data = record.get("data") or {}
            if record.get("kind") != "alert.acknowledged" or data.get("status") != status:
                continue
            if not labels_match(data.get("labels") or {}, {"alertname": result.alert, **labels}):
                continue
            at = parse_time(str(record["ts"]))
            if at >= after:
                return at
        return None

    return ctx.wait_for(result.drill, f"the {status} webhook at the receiver", seen, timeout)


def wait_recovered(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], timeout: float
) -> None:
    """Wait until the alert is no longer active in Prometheus."""

    def gone() -> bool | None:
        return True if not ctx.probe.alerts(result.alert, labels) else None

    ctx.wait_for(result.drill, f"{result.alert} to resolve", gone, timeout)
    result.recovered_at = time.time()
    ctx.say(result.drill, f"recovered after {result.since_fault(result.recovered_at)} s")


__all__ = [
    "budget_for",
    "require_loadgen",
    "job_matches",
    "last_verify",
    "require_quiet",
    "run_playbook_loop",
    "step_time",
    "wait_acknowledged",
    "wait_firing",
    "wait_job",
    "wait_job_done",
    "wait_recovered",
]
