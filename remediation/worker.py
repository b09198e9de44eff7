"""The worker: takes jobs from the stream, runs their playbook under a target lock, records it.

One loop per worker: promote delayed jobs that are due, reclaim one job whose worker died (its
stream entry idle longer than `claim_idle_seconds`, XAUTOCLAIM), else read one new job (blocking
up to `poll_seconds`), and run it:

1. a finished job (duplicate entry) or a missing one is dropped; an unknown playbook or an
   alert without the playbook's target label fails the job at once (visible, never dropped);
2. a resolution waits until its firing job has finished (`waiting_for`);
3. the guard rails (`guards.py`), in order: a playbook in mode `off` or paused by a human skips
   the job; dry runs stop after the plan; mode `shadow` plans, runs the read-only steps and
   records the rest as what it would do (no lock, nothing changed); an open breaker or a firing
   job over its target's budget skips the job. A skip is a finished job (`skipped`) with its
   reason, an audit record and a run counted under the skip's outcome;
4. the target lock is taken (act mode); if another job holds it the job waits;
5. the attempt is counted (not when a waiting job resumes); a job that has used
   `max_attempts` (e.g. it crashed its worker every time) ends failed;
6. plan → each step → verify (firing) or plan_resolve → each resolve step (resolved), every
   step recorded in the job and the audit trail, while a lease thread renews the lock and the
   stream entry. A step that returns `Deferred` parks the job (`waiting`) on the delayed queue
   with its cursor and state; the worker and the lock are free until it is due, and any worker
   continues it from that step;
7. the outcome is settled atomically with the entry's removal, the run counters and the
   playbook's breaker: succeeded / planned / shadowed / failed, or on a `TransientError` a retry
   after exponential backoff.

Redis failing under the worker (connection lost, timeout) is never recorded as the job's
outcome: the attempt is abandoned, its entry stays pending and is reclaimed once Redis is back.
With the spec's `redis.min_replicas_ack`, every audit append waits for that many replicas
(WAIT); too few in time is a ReplicaAckError, logged as not acknowledged and handled like Redis
failing: an unsettled job is reclaimed and run again, never taken as done.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis
from pydantic import ValidationError

from redline.core.redisconn import ReplicaAckError, open_redis
from redline.remediation.audit import AuditLog
from redline.remediation.guards import (
    GuardStore,
    Policies,
    SkipOutcome,
    build_breaker_record,
    load_durability,
    load_policies,
)
from redline.remediation.jobs import (
    SETTLED_BREAKER_OPENED,
    TERMINAL,
    BreakerUpdate,
    Entry,
    Job,
    JobStatus,
    JobStore,
    RunCount,
    now_iso,
)
from redline.remediation.models import Alert, job_id_for
from redline.remediation.playbook import (
    Deferred,
    LeaseLostError,
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    PlaybookRegistry,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RemediationSettings
from redline.slo.spec import PlaybookPolicy, RedisDurability

log = logging.getLogger(__name__)

REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)
"""Redis failing under the worker: never a job's outcome."""


class StepFailedError(PlaybookError):
    """A step or the verification reported failure; the job ends failed."""


def connect(settings: RemediationSettings) -> redis.Redis:
    """A Redis client for workers: short connect timeout, read timeout above the block time."""
    return open_redis(
        settings.redis_url,
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=settings.poll_seconds + 5.0,
    )


def backoff_seconds(settings: RemediationSettings, attempt: int, jitter: float = 1.0) -> float:
    """Delay before attempt `attempt + 1`: initial x 2^(attempt-1), capped, times `jitter`."""
    delay: float = settings.backoff_initial_seconds * float(2 ** max(attempt - 1, 0))
    return min(settings.backoff_max_seconds, delay) * jitter


@dataclass(frozen=True)
class Finished:
    """The steps ran to an end: the job's final status and run outcome."""

    status: JobStatus
    outcome: str
    error: str = ""


@dataclass(frozen=True)
class Waiting:
    """A step deferred: the plan index to continue at and what the step asked for."""

    cursor: int
    deferred: Deferred


def build_skip(
    policy: PlaybookPolicy, paused: Mapping[str, Any] | None, playbook: str
) -> tuple[SkipOutcome, str] | None:
    """Why a job is skipped before anything else is considered (mode off, paused), or None."""
    if policy.mode == "off":
        return "off", f"playbook {playbook} is off (remediation.playbooks.{playbook}.mode)"
    if paused is not None:
        return "paused", (
            f"playbook {playbook} paused by {paused.get('by', '?')} at {paused.get('at', '?')}: "
            f"{paused.get('reason', '')} (redline remediation resume {playbook})"
        )
    return None


def build_breaker_reason(playbook: str, breaker: Mapping[str, Any]) -> str:
    """Why a job is skipped while the playbook's breaker is open (from its stored record)."""
    return (
        f"playbook {playbook}'s breaker is open since {breaker.get('at', '?')} after "
        f"{breaker.get('failures', '?')} failed runs in a row (last: {breaker.get('error', '?')}); "
        f"a human resumes it with `redline remediation resume {playbook}`"
    )


class _Lease:
    """Renews the target lock and the stream entry while a job runs; notices a takeover."""

    def __init__(
        self,
        store: JobStore,
        entry: Entry,
        consumer: str,
        target: str | None,
        lock_value: str,
        ttl_ms: int,
        interval: float,
    ) -> None:
        self._store = store
        self._entry = entry
        self._consumer = consumer
        self._target = target
        self._lock_value = lock_value
        self._ttl_ms = ttl_ms
        self._interval = interval
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redline-lease", daemon=True)

    def start(self) -> None:
        """Start renewing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing."""
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        """Raise LeaseLostError once the job or its lock was taken over."""
        if self.lost.is_set():
            raise LeaseLostError(f"job {self._entry.job_id}: lease lost")

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                owned = self._store.renew(
                    self._entry.entry_id,
                    self._consumer,
                    self._target,
                    self._lock_value,
                    self._ttl_ms,
                )
            except redis.RedisError as exc:
                # Keep trying: the lock outlives a short outage; a long one ends in a takeover.
                log.warning("job %s: lease renewal failed: %s", self._entry.job_id, exc)
                continue
            if not owned:
                self.lost.set()
                return


class Worker:
    """Runs remediation jobs; many may run, in threads or processes, on one store."""

    def __init__(
        self,
        settings: RemediationSettings,
        registry: PlaybookRegistry,
        client: redis.Redis,
        *,
        name: str | None = None,
        audit: AuditLog | None = None,
        policies: Policies | None = None,
        durability: RedisDurability | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.client = client
        self.store = JobStore(client, settings.key_prefix, settings.retention_seconds)
        self.guards = GuardStore(client, settings.key_prefix)
        self.policies = policies or load_policies(
            settings.spec, settings.profile, settings.policies
        )
        # The spec's `redis`: how many replicas must hold an audit record before it counts.
        self.durability = durability or load_durability(settings.spec)
        self.audit = audit or AuditLog(
            client,
            settings.key_prefix,
            settings.audit_file,
            min_replicas_ack=self.durability.min_replicas_ack,
            ack_timeout_ms=self.durability.ack_timeout_ms,
        )
        self.consumer = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._random = random.Random()
        self._group_ready = False

    def run(self, stop: threading.Event) -> None:
        """Work until `stop` is set; Redis outages are waited out, never fatal."""
        log.info(
            "worker %s started; playbooks: %s", self.consumer, ", ".join(self.registry.names())
        )
        while not stop.is_set():
            try:
                self.run_once()
            except ReplicaAckError as exc:
                # Recorded on the primary, not acknowledged by its replicas: never taken as
                # done. A job not yet settled stays pending and is reclaimed.
                log.error("worker %s: write not acknowledged by the replicas: %s", self.consumer,
                          exc)  # fmt: skip
                stop.wait(min(1.0, self.settings.poll_seconds))
            except REDIS_DOWN as exc:
                log.warning("worker %s: Redis unavailable (%s); retrying", self.consumer, exc)
                self._group_ready = False
                stop.wait(min(1.0, self.settings.poll_seconds))
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    log.exception("worker %s: unexpected Redis error", self.consumer)
                    stop.wait(min(1.0, self.settings.poll_seconds))
                self._group_ready = False
            except Exception:  # noqa: BLE001 - one bad job must not stop the worker
                # The job's entry stays pending; it is reclaimed and, after max_attempts, failed.
                log.exception("worker %s: unexpected error", self.consumer)
                stop.wait(min(1.0, self.settings.poll_seconds))
        log.info("worker %s stopped", self.consumer)

    def run_once(self, block_ms: int | None = None) -> int:
        """Promote due jobs, then run at most one job; returns how many were run (0 or 1)."""
        if not self._group_ready:
            self.store.ensure_group()
            self._group_ready = True
        self.store.promote_due()
        entries = self.store.reclaim(self.consumer, int(self.settings.claim_idle_seconds * 1000))
        if not entries:
            wait = int(self.settings.poll_seconds * 1000) if block_ms is None else block_ms
            entries = self.store.read(self.consumer, wait)
        for entry in entries:
            self.process(entry)
        return len(entries)

    def process(self, entry: Entry) -> None:
        """Run the job of one stream entry this worker owns."""
        job = self.store.get(entry.job_id) if entry.job_id else None
        if job is None:
            log.warning("stream entry %s names no job (%r); dropped", entry.entry_id, entry.job_id)
            self.store.drop_entry(entry, self.consumer)
            return
        if job.status in TERMINAL:
            self.store.drop_entry(entry, self.consumer)
            return
        try:
            alert = Alert.model_validate_json(json.dumps(job.alert))
        except ValidationError as exc:
            self._fail(job, entry, f"job record holds an invalid alert: {exc}")
            return
        playbook = self.registry.get(job.playbook)
        if playbook is None:
            known = ", ".join(self.registry.names()) or "none"
            self._fail(job, entry, f"unknown playbook {job.playbook!r}; registered: {known}")
            return
        try:
            target = playbook.target(alert)
        except PlaybookError as exc:
            self._fail(job, entry, str(exc), playbook.name)
            return
        firing: Job | None = None
        if alert.status == "resolved":
            firing = self.store.get(job_id_for(alert, "firing"))
            if firing is not None and firing.status not in TERMINAL:
                self._wait(job, entry, firing.id)
                return
        mode = self._admit(job, entry, alert, playbook.name, target)
        if mode is None:
            return
        token = f"{self.consumer}:{uuid.uuid4().hex[:8]}"
        lock_value = f"{job.id}|{token}"
        locked = mode == "act"
        if locked:
            ttl_ms = int(self.settings.lock_ttl_seconds * 1000)
            acquired, holder = self.store.acquire_lock(target, job.id, token, ttl_ms)
            if not acquired:
                self._wait(job, entry, holder.split("|", 1)[0])
                return
        try:
            resuming = job.status == "waiting"
            if not resuming and job.attempts >= self.settings.max_attempts:
                self._settle_final(
                    job, entry, playbook.name, "failed", "failed", 0.0, job.attempts,
                    f"gave up after {job.attempts} attempts: "
                    f"the last one did not finish (worker died or lost its lease); "
                    f"last error: {job.error or 'none'}",
                    mode,
                )  # fmt: skip
                return
            self._attempt(job, entry, alert, playbook, target, firing, lock_value, mode)
        finally:
            if locked:
                self.store.release_lock(target, lock_value)

    def _admit(
        self, job: Job, entry: Entry, alert: Alert, playbook: str, target: str
    ) -> str | None:
        """The mode the job runs in (act, shadow, dry_run), or None once it was skipped."""
        policy = self.policies.get(playbook)
        gate = self.guards.gate(playbook)
        skip = build_skip(policy, gate.paused, playbook)
        if skip is None and not job.dry_run and policy.mode == "act":
            if gate.breaker is not None:
                skip = "breaker_open", build_breaker_reason(playbook, gate.breaker)
            elif policy.budget is not None and alert.status == "firing":
                budget = policy.budget
                now_ms = int(time.time() * 1000)
                admitted, count = self.guards.admit(playbook, target, job.id, budget, now_ms)
                if not admitted:
                    skip = (
                        "over_budget",
                        (
                            f"over budget: {count} run(s) of {playbook} on {target} in the last "
                            f"{budget.per} (budget {budget.runs} per {budget.per})"
                        ),
                    )
        if skip is not None:
            outcome, reason = skip
            self._skip(job, entry, playbook, outcome, reason, policy.mode)
            return None
        if job.dry_run:
            return "dry_run"
        return policy.mode

    def _skip(
        self, job: Job, entry: Entry, playbook: str, outcome: str, reason: str, mode: str
    ) -> None:
        settled = self.store.finish(
            entry,
            self.consumer,
            "skipped",
            {"outcome": outcome, "reason": reason, "mode": mode},
            RunCount(playbook, outcome),
        )
        if not settled:
            return
        log.warning("job %s (%s) skipped: %s", job.id, playbook, reason)
        self.audit.append(
            "job.skipped", job.id, playbook=playbook, outcome=outcome, reason=reason, mode=mode,
            alert=job.alert,
        )  # fmt: skip

    def _attempt(
        self,
        job: Job,
        entry: Entry,
        alert: Alert,
        playbook: Playbook,
        target: str,
        firing: Job | None,
        lock_value: str,
        mode: str,
    ) -> None:
        attempt, lease, started = self._begin_attempt(
            job, entry, playbook, target, lock_value, mode
        )
        ctx = self._context(job, alert, playbook, target, firing, attempt, lease, mode)
        shadow = mode == "shadow"
        try:
            ran = self._run_steps(playbook, ctx, job, mode)
        except LeaseLostError:
            log.warning("job %s: taken over by another worker; abandoning attempt", job.id)
            self.audit.append("job.abandoned", job.id, attempt=attempt, worker=self.consumer)
            return
        except REDIS_DOWN:
            # Not the job's outcome: the entry stays pending and is reclaimed when Redis is back.
            log.warning("job %s: Redis failed mid-attempt; the job will be reclaimed", job.id)
            raise
        except TransientError as exc:
            self._retry(job, entry, playbook.name, attempt, exc, time.monotonic() - started, mode)
            return
        except PlaybookError as exc:
            self._settle_final(
                job, entry, playbook.name, "shadowed" if shadow else "failed",
                "shadow" if shadow else "failed", time.monotonic() - started, attempt, str(exc),
                mode,
            )  # fmt: skip
            return
        except Exception as exc:  # noqa: BLE001 - a playbook bug must fail its job, not the worker
            log.exception("job %s: playbook %s raised", job.id, playbook.name)
            error = f"{type(exc).__name__}: {exc}"
            self._settle_final(
                job, entry, playbook.name, "shadowed" if shadow else "failed",
                "shadow" if shadow else "failed", time.monotonic() - started, attempt, error, mode,
            )  # fmt: skip
            return
        finally:
            lease.stop()
        if lease.lost.is_set():
            log.warning("job %s: lease lost during the last step; not settling", job.id)
            return
        seconds = time.monotonic() - started
        if isinstance(ran, Waiting):
            self._defer_step(job, entry, playbook.name, attempt, ran, seconds)
            return
        self._settle_final(
            job, entry, playbook.name, ran.status, ran.outcome, seconds, attempt, ran.error, mode
        )

    def _begin_attempt(
        self,
        job: Job,
        entry: Entry,
        playbook: Playbook,
        target: str,
        lock_value: str,
        mode: str,
    ) -> tuple[int, _Lease, float]:
        """Count the attempt, start its lease (and the target's lock when acting), audit it;
        the attempt's number, its lease and when it started (monotonic)."""
        resuming = job.status == "waiting"
        locked = mode == "act"
        attempt = self.store.start_attempt(
            job.id, target, self.consumer, mode=mode, count=not resuming
        )
        interval = min(self.settings.lock_ttl_seconds, self.settings.claim_idle_seconds) / 3
        lease = _Lease(
            self.store,
            entry,
            self.consumer,
            target if locked else None,
            lock_value,
            int(self.settings.lock_ttl_seconds * 1000),
            interval,
        )
        lease.start()
        started = time.monotonic()
        try:
            self.audit.append(
                "job.resumed" if resuming else "job.started",
                job.id,
                playbook=playbook.name,
                target=target,
                attempt=attempt,
                dry_run=job.dry_run,
                mode=mode,
                worker=self.consumer,
                **({"cursor": job.cursor} if resuming else {"alert": job.alert}),
            )
        except BaseException:
            # A renewed lease would keep the entry from ever going idle and being reclaimed.
            lease.stop()
            raise
        return attempt, lease, started

    def _context(
        self,
        job: Job,
        alert: Alert,
        playbook: Playbook,
        target: str,
        firing: Job | None,
        attempt: int,
        lease: _Lease,
        mode: str,
    ) -> PlaybookContext:
        """What the playbook's steps see of this attempt."""

        def recorder(name: str, detail: str, data: Mapping[str, Any]) -> None:
            self._record(job.id, attempt, "record", name, True, detail, data, None)

        return PlaybookContext(
            job_id=job.id,
            playbook=playbook.name,
            alert=alert,
            target=target,
            dry_run=job.dry_run,
            attempt=attempt,
            redis=self.client,
            firing_job=firing,
            log=logging.getLogger(f"redline.remediation.playbook.{playbook.name}"),
            recorder=recorder,
            lease_check=lease.check,
            state=dict(job.step_state or {}),
            shadow=mode == "shadow",
        )

    def _retry(
        self,
        job: Job,
        entry: Entry,
        playbook: str,
        attempt: int,
        exc: TransientError,
        seconds: float,
        mode: str,
    ) -> None:
        """After a retryable failure: give up at the last attempt, else retry after a backoff."""
        shadow = mode == "shadow"
        error = f"{type(exc).__name__}: {exc}"
        if attempt >= self.settings.max_attempts:
            self._settle_final(
                job, entry, playbook, "shadowed" if shadow else "failed",
                "shadow" if shadow else "failed", seconds, attempt,
                f"gave up after {attempt} attempts; last error: {error}", mode,
            )  # fmt: skip
            return
        delay = backoff_seconds(self.settings, attempt, self._random.uniform(0.9, 1.1))
        if self.store.defer(
            entry,
            self.consumer,
            delay,
            {"status": "retrying", "error": error},
            RunCount(playbook, "retry", seconds),
        ):
            self.audit.append(
                "job.retry", job.id, attempt=attempt, error=error, delay_seconds=delay
            )

    def _plan(
        self, playbook: Playbook, ctx: PlaybookContext, job: Job
    ) -> tuple[list[PlannedStep], int]:
        """The steps and the index to start at: the recorded plan at the cursor of a job that
        deferred before, else a fresh plan (recorded) from the first step."""
        if job.cursor is not None and job.plan is not None:
            return [PlannedStep.from_dict(step) for step in job.plan], job.cursor
        steps = list(playbook.plan_resolve(ctx) if ctx.resolved else playbook.plan(ctx))
        plan = [step.as_dict() for step in steps]
        self.store.set_fields(ctx.job_id, {"plan": json.dumps(plan, default=str)})
        self._record(ctx.job_id, ctx.attempt, "plan", "plan", True,
                     f"{len(plan)} step(s)", {"steps": plan}, None)  # fmt: skip
        return steps, 0

    def _run_steps(
        self, playbook: Playbook, ctx: PlaybookContext, job: Job, mode: str
    ) -> Finished | Waiting:
        steps, cursor = self._plan(playbook, ctx, job)
        if mode == "dry_run":
            return Finished("planned", "dry_run")
        if mode == "shadow":
            return self._shadow(playbook, ctx, steps)
        phase = "resolve" if ctx.resolved else "execute"
        resumed = job.cursor is not None
        for index in range(cursor, len(steps)):
            step = steps[index]
            step_ctx = ctx if index == cursor else replace(ctx, state={})
            step_ctx.ensure_lease()
            started = time.monotonic()
            result = (
                playbook.resolve(step_ctx, step)
                if ctx.resolved
                else playbook.execute(step_ctx, step)
            )
            if isinstance(result, Deferred):
                if result.record:
                    self._record(ctx.job_id, ctx.attempt, phase, step.name, True,
                                 f"waiting {result.seconds:g} s: {result.reason}",
                                 {"deferred_seconds": result.seconds, "state": dict(result.state)},
                                 time.monotonic() - started)  # fmt: skip
                return Waiting(index, result)
            self._record(ctx.job_id, ctx.attempt, phase, step.name, result.ok, result.detail,
                         result.data, time.monotonic() - started)  # fmt: skip
            if not result.ok:
                raise StepFailedError(f"step {step.name} failed: {result.detail}")
            if resumed:
                # A job that waited once keeps its plan: record how far it got.
                self.store.set_fields(ctx.job_id, {"cursor": str(index + 1), "step_state": ""})
        if not ctx.resolved:
            ctx.ensure_lease()
            started = time.monotonic()
            verified = playbook.verify(ctx)
            self._record(ctx.job_id, ctx.attempt, "verify", "verify", verified.ok,
                         verified.detail, verified.data, time.monotonic() - started)  # fmt: skip
            if not verified.ok:
                raise StepFailedError(f"verification failed: {verified.detail}")
        return Finished("succeeded", "succeeded")

    def _shadow(
        self, playbook: Playbook, ctx: PlaybookContext, steps: Sequence[PlannedStep]
    ) -> Finished:
        """Run the read-only steps, record the others as what they would do; change nothing."""
        would: list[str] = []
        for step in steps:
            ctx.ensure_lease()
            if not step.read_only:
                would.append(step.description)
                self._record(ctx.job_id, ctx.attempt, "shadow", step.name, True,
                             f"would: {step.description}", dict(step.params), None)  # fmt: skip
                continue
            started = time.monotonic()
            result: StepResult | Deferred = (
                playbook.resolve(ctx, step) if ctx.resolved else playbook.execute(ctx, step)
            )
            seconds = time.monotonic() - started
            if isinstance(result, Deferred):
                self._record(ctx.job_id, ctx.attempt, "shadow", step.name, True,
                             f"would wait {result.seconds:g} s: {result.reason}",
                             {"deferred_seconds": result.seconds}, seconds)  # fmt: skip
                continue
            self._record(ctx.job_id, ctx.attempt, "check", step.name, result.ok, result.detail,
                         result.data, seconds)  # fmt: skip
            if not result.ok:
                return Finished(
                    "shadowed", "shadow", f"would have failed at {step.name}: {result.detail}"
                )
        summary = "; ".join(would) if would else "nothing to change"
        self.store.set_fields(ctx.job_id, {"reason": f"shadow: would {summary}"})
        return Finished("shadowed", "shadow")

    def _defer_step(
        self, job: Job, entry: Entry, playbook: str, attempt: int, waiting: Waiting, seconds: float
    ) -> None:
        deferred = waiting.deferred
        fields = {
            "status": "waiting",
            "cursor": str(waiting.cursor),
            "step_state": json.dumps(dict(deferred.state), default=str, sort_keys=True),
            "reason": deferred.reason,
            "error": "",
        }
        if self.store.defer(entry, self.consumer, deferred.seconds, fields):
            if deferred.record:
                self.audit.append(
                    "job.waiting", job.id, playbook=playbook, attempt=attempt,
                    cursor=waiting.cursor, delay_seconds=deferred.seconds,
                    reason=deferred.reason, seconds=round(seconds, 6),
                )  # fmt: skip
        else:
            log.warning("job %s: no longer ours; deferral not recorded", job.id)

    def _record(
        self,
        job_id: str,
        attempt: int,
        phase: str,
        name: str,
        ok: bool,
        detail: str,
        data: Mapping[str, Any],
        seconds: float | None,
    ) -> None:
        step: dict[str, Any] = {
            "attempt": attempt,
            "phase": phase,
            "name": name,
            "ok": ok,
            "detail": detail,
            "data": dict(data),
            "worker": self.consumer,
            "at": time.time(),
        }
        if seconds is not None:
            step["seconds"] = round(seconds, 6)
        self.store.add_step(job_id, step)
        self.audit.append("step", job_id, **{k: v for k, v in step.items() if k != "at"})

    def _wait(self, job: Job, entry: Entry, holder: str) -> None:
        self.store.defer(
            entry,
            self.consumer,
            self.settings.lock_wait_seconds,
            {"status": job.status if job.status in ("retrying", "waiting") else "queued",
             "waiting_for": holder},
        )  # fmt: skip

    def _fail(self, job: Job, entry: Entry, error: str, playbook: str = "unknown") -> None:
        self._settle_final(job, entry, playbook, "failed", "failed", 0.0, job.attempts, error, "")

    def _settle_final(
        self,
        job: Job,
        entry: Entry,
        playbook: str,
        status: JobStatus,
        outcome: str,
        seconds: float,
        attempt: int,
        error: str,
        mode: str,
    ) -> None:
        breaker: BreakerUpdate | None = None
        if mode == "act" and outcome in ("succeeded", "failed"):
            threshold = self.policies.get(playbook).breaker.failures
            record = build_breaker_record(playbook, threshold, error, now_iso())
            breaker = BreakerUpdate(outcome == "failed", threshold, record)
        fields = {"outcome": outcome, "error": error}
        if mode:
            fields["mode"] = mode
        settled = self.store.finish(
            entry, self.consumer, status, fields, RunCount(playbook, outcome, seconds), breaker
        )
        if not settled:
            log.warning("job %s: no longer ours; outcome %s not recorded", job.id, outcome)
            return
        if error and status == "failed":
            log.error("job %s (%s) failed: %s", job.id, playbook, error)
        self.audit.append(
            "job.finished",
            job.id,
            playbook=playbook,
            status=status,
            outcome=outcome,
            attempt=attempt,
            error=error,
            seconds=round(seconds, 6),
            mode=mode,
        )
        if settled == SETTLED_BREAKER_OPENED:
            log.error("playbook %s: breaker open after %s failed runs in a row", playbook,
                      breaker.threshold if breaker else "?")  # fmt: skip
            self.audit.append(
                "breaker.opened", job.id, playbook=playbook,
                failures=breaker.threshold if breaker else None, error=error,
            )  # fmt: skip


def start_workers(
    settings: RemediationSettings,
    registry: PlaybookRegistry,
    count: int,
    stop: threading.Event,
    policies: Policies | None = None,
) -> list[threading.Thread]:
    """Start `count` worker threads (one Redis client each) that run until `stop` is set."""
    threads: list[threading.Thread] = []
    for index in range(count):
        thread = threading.Thread(
            target=_work,
            args=(settings, registry, stop, policies),
            name=f"redline-worker-{index}",
        )
        thread.start()
        threads.append(thread)
    return threads


def _work(
    settings: RemediationSettings,
    registry: PlaybookRegistry,
    stop: threading.Event,
    policies: Policies | None,
) -> None:
    client = connect(settings)
    try:
        Worker(settings, registry, client, policies=policies).run(stop)
    finally:
        client.close()
