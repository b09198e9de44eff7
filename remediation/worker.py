"""The worker: takes jobs from the stream, runs their playbook under a target lock, records it.

One loop per worker: promote delayed jobs that are due, reclaim one job whose worker died (its
stream entry idle longer than `claim_idle_seconds`, XAUTOCLAIM), else read one new job (blocking
up to `poll_seconds`), and run it:

1. a finished job (duplicate entry) or a missing one is dropped; an unknown playbook or an
   alert without the playbook's target label fails the job at once (visible, never dropped);
2. a resolution waits until its firing job has finished (`waiting_for`);
3. the target lock is taken (not for dry runs); if another job holds it the job waits;
4. the attempt is counted; a job that has used `max_attempts` (e.g. it crashed its worker
   every time) ends failed;
5. plan → each step → verify (firing) or plan_resolve → each resolve step (resolved), every
   step recorded in the job and the audit trail, while a lease thread renews the lock and the
   stream entry; dry runs stop after the plan;
6. the outcome is settled atomically with the entry's removal: succeeded / planned / failed, or
   on a `TransientError` a retry after exponential backoff.
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
from typing import Any

import redis
from pydantic import ValidationError

from redline.remediation.audit import AuditLog
from redline.remediation.jobs import TERMINAL, Entry, Job, JobStatus, JobStore
from redline.remediation.models import Alert, job_id_for
from redline.remediation.playbook import (
    LeaseLostError,
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    PlaybookRegistry,
    TransientError,
)
from redline.remediation.settings import RemediationSettings

log = logging.getLogger(__name__)


class StepFailedError(PlaybookError):
    """A step or the verification reported failure; the job ends failed."""


def connect(settings: RemediationSettings) -> redis.Redis:
    """A Redis client for workers: short connect timeout, read timeout above the block time."""
    return redis.Redis.from_url(
        settings.redis_url,
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=settings.poll_seconds + 5.0,
    )


def backoff_seconds(settings: RemediationSettings, attempt: int, jitter: float = 1.0) -> float:
    """Delay before attempt `attempt + 1`: initial x 2^(attempt-1), capped, times `jitter`."""
    delay: float = settings.backoff_initial_seconds * float(2 ** max(attempt - 1, 0))
    return min(settings.backoff_max_seconds, delay) * jitter


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
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.client = client
        self.store = JobStore(client, settings.key_prefix, settings.retention_seconds)
        self.audit = audit or AuditLog(client, settings.key_prefix, settings.audit_file)
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
            except (redis.ConnectionError, redis.TimeoutError) as exc:
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
        token = f"{self.consumer}:{uuid.uuid4().hex[:8]}"
        lock_value = f"{job.id}|{token}"
        locked = not job.dry_run
        if locked:
            ttl_ms = int(self.settings.lock_ttl_seconds * 1000)
            acquired, holder = self.store.acquire_lock(target, job.id, token, ttl_ms)
            if not acquired:
                self._wait(job, entry, holder.split("|", 1)[0])
                return
        try:
            if job.attempts >= self.settings.max_attempts:
                self._fail(
                    job,
                    entry,
                    f"gave up after {job.attempts} attempts: "
                    f"the last one did not finish (worker died or lost its lease); "
                    f"last error: {job.error or 'none'}",
                    playbook.name,
                )
                return
            self._attempt(job, entry, alert, playbook, target, firing, lock_value, locked)
        finally:
            if locked:
                self.store.release_lock(target, lock_value)

    def _attempt(
        self,
        job: Job,
        entry: Entry,
        alert: Alert,
        playbook: Playbook,
        target: str,
        firing: Job | None,
        lock_value: str,
        locked: bool,
    ) -> None:
        attempt = self.store.start_attempt(job.id, target, self.consumer)
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
        self.audit.append(
            "job.started",
            job.id,
            playbook=playbook.name,
            target=target,
            attempt=attempt,
            dry_run=job.dry_run,
            worker=self.consumer,
            alert=job.alert,
        )

        def recorder(name: str, detail: str, data: Mapping[str, Any]) -> None:
            self._record(job.id, attempt, "record", name, True, detail, data, None)

        ctx = PlaybookContext(
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
        )
        try:
            status, outcome = self._run_steps(playbook, ctx)
        except LeaseLostError:
            log.warning("job %s: taken over by another worker; abandoning attempt", job.id)
            self.audit.append("job.abandoned", job.id, attempt=attempt, worker=self.consumer)
            return
        except TransientError as exc:
            seconds = time.monotonic() - started
            error = f"{type(exc).__name__}: {exc}"
            if attempt >= self.settings.max_attempts:
                self._settle_final(
                    job, entry, playbook.name, "failed", "failed", seconds, attempt,
                    f"gave up after {attempt} attempts; last error: {error}",
                )  # fmt: skip
                return
            delay = backoff_seconds(self.settings, attempt, self._random.uniform(0.9, 1.1))
            if self.store.defer(
                entry,
                self.consumer,
                delay,
                {"status": "retrying", "error": error},
                (playbook.name, "retry", seconds),
            ):
                self.audit.append(
                    "job.retry", job.id, attempt=attempt, error=error, delay_seconds=delay
                )
            return
        except PlaybookError as exc:
            self._settle_final(
                job, entry, playbook.name, "failed", "failed", time.monotonic() - started,
                attempt, str(exc),
            )  # fmt: skip
            return
        except Exception as exc:  # noqa: BLE001 - a playbook bug must fail its job, not the worker
            log.exception("job %s: playbook %s raised", job.id, playbook.name)
            self._settle_final(
                job, entry, playbook.name, "failed", "failed", time.monotonic() - started,
                attempt, f"{type(exc).__name__}: {exc}",
            )  # fmt: skip
            return
        finally:
            lease.stop()
        if lease.lost.is_set():
            log.warning("job %s: lease lost during the last step; not settling", job.id)
            return
        self._settle_final(
            job, entry, playbook.name, status, outcome, time.monotonic() - started, attempt, ""
        )

    def _run_steps(self, playbook: Playbook, ctx: PlaybookContext) -> tuple[JobStatus, str]:
        steps: Sequence[PlannedStep] = (
            playbook.plan_resolve(ctx) if ctx.resolved else playbook.plan(ctx)
        )
        plan = [step.as_dict() for step in steps]
        self.store.set_fields(ctx.job_id, {"plan": json.dumps(plan, default=str)})
        self._record(ctx.job_id, ctx.attempt, "plan", "plan", True,
                     f"{len(plan)} step(s)", {"steps": plan}, None)  # fmt: skip
        if ctx.dry_run:
            return "planned", "dry_run"
        phase = "resolve" if ctx.resolved else "execute"
        for step in steps:
            ctx.ensure_lease()
            started = time.monotonic()
            result = playbook.resolve(ctx, step) if ctx.resolved else playbook.execute(ctx, step)
            self._record(ctx.job_id, ctx.attempt, phase, step.name, result.ok, result.detail,
                         result.data, time.monotonic() - started)  # fmt: skip
            if not result.ok:
                raise StepFailedError(f"step {step.name} failed: {result.detail}")
        if not ctx.resolved:
            ctx.ensure_lease()
            started = time.monotonic()
            result = playbook.verify(ctx)
            self._record(ctx.job_id, ctx.attempt, "verify", "verify", result.ok, result.detail,
                         result.data, time.monotonic() - started)  # fmt: skip
            if not result.ok:
                raise StepFailedError(f"verification failed: {result.detail}")
        return "succeeded", "succeeded"

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
            {"status": "queued" if job.status != "retrying" else "retrying", "waiting_for": holder},
        )

    def _fail(self, job: Job, entry: Entry, error: str, playbook: str = "unknown") -> None:
        self._settle_final(job, entry, playbook, "failed", "failed", 0.0, job.attempts, error)

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
    ) -> None:
        settled = self.store.finish(
            entry,
            self.consumer,
            status,
            {"outcome": outcome, "error": error},
            (playbook, outcome, seconds),
        )
        if not settled:
            log.warning("job %s: no longer ours; outcome %s not recorded", job.id, outcome)
            return
        if error:
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
        )


def start_workers(
    settings: RemediationSettings,
    registry: PlaybookRegistry,
    count: int,
    stop: threading.Event,
) -> list[threading.Thread]:
    """Start `count` worker threads (one Redis client each) that run until `stop` is set."""
    threads: list[threading.Thread] = []
    for index in range(count):
        thread = threading.Thread(
            target=_work, args=(settings, registry, stop), name=f"redline-worker-{index}"
        )
        thread.start()
        threads.append(thread)
    return threads


def _work(settings: RemediationSettings, registry: PlaybookRegistry, stop: threading.Event) -> None:
    client = connect(settings)
    try:
        Worker(settings, registry, client).run(stop)
    finally:
        client.close()
