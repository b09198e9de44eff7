"""The durable job store in Redis: idempotent enqueue, the job stream, target locks, job records.

Keys (all under the hash tag `{prefix}`, so they live in one Redis Cluster slot and Lua scripts
may touch them together):

| key | type | holds |
|---|---|---|
| `{p}:idem:<key>` | string | job id (or `ack`) of an idempotency key; expires after retention |
| `{p}:job:<id>` | hash | the job record (`Job` fields; JSON for alert, plan, result) |
| `{p}:job:<id>:steps` | list | JSON step records, in order |
| `{p}:jobs` | stream | one entry `job=<id>` per runnable job; consumer group `workers` |
| `{p}:delayed` | zset | job ids due again (retry, busy target, deferred step), by due time (ms) |
| `{p}:index` | zset | every job id by creation time (ms), for `GET /jobs` |
| `{p}:active` | zset | unfinished job ids by creation time (ms): overdue and oldest-age gauges |
| `{p}:lock:<target>` | string | `<job id>|<worker token>`, with an expiry renewed while running |
| `{p}:metrics` | hash | run counters, duration and node-failure recovery histograms (workers) |
| `{p}:paused` | hash | playbook (or `*`: all) -> JSON {by, reason, at} while paused by a human |
| `{p}:breaker` | hash | `failures|<playbook>`: failed runs in a row; `open|<playbook>`: JSON |
| `{p}:budget:<playbook>:<target>` | zset | job ids admitted to act on the target, by time (ms) |

The receiver's group commit of new alerts: `redline.remediation.receiver_store`.

A job leaves the stream only in the script that records its final state or moves it to
`delayed`, and only while the worker settling it still owns its entry; a promoted delayed job is
re-added in one script. So a job is never lost between states, and never runnable twice at once.

"Recorded in Redis" is as durable as Redis is configured to be: `start_redis` runs with AOF and
`appendfsync everysec` (a crash of the Redis host may lose the last second); use
`appendfsync always` (or a replica and `WAIT`) where that second matters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

import redis
from pydantic import BaseModel, Field

from redline.remediation.models import Alert, WebhookPayload
from redline.slo import catalog

JobStatus = Literal[
    "queued", "running", "retrying", "waiting", "succeeded", "failed", "planned", "shadowed",
    "skipped",
]  # fmt: skip
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "planned", "shadowed", "skipped"})
GROUP = "workers"
_PROMOTE_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('XADD', KEYS[2], '*', 'job', id)
end
return #due
"""

# The lock is free, or held for this same job by a worker that lost the job's stream entry to
# us (we hold the entry now: we just read or reclaimed it), so the old holder can renew no more.
_ACQUIRE_LUA = """
local current = redis.call('GET', KEYS[1])
if (not current) or string.sub(current, 1, #ARGV[2] + 1) == ARGV[2] .. '|' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return {1, ARGV[1]}
end
return {0, current}
"""

# Renew only while this consumer still owns the stream entry (and the lock, when there is one);
# XCLAIM to ourselves resets the entry's idle time so no other worker reclaims a live job.
_RENEW_LUA = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= ARGV[3] then return 0 end
if ARGV[4] ~= '' then
  if redis.call('GET', KEYS[2]) ~= ARGV[4] then return 0 end
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'JUSTID')
return 1
"""

# Settle a job only while this consumer owns its entry: a worker that stalled past the claim
# time must not overwrite the outcome of the worker that took the job over. The run counters and
# the playbook's breaker change in the same script, so a settle lost to a Redis outage leaves
# no trace (the job stays pending and runs again), and one that happened is counted once.
# Returns 0 (not ours: nothing written), 1 (settled) or 2 (settled, and the breaker opened).
_SETTLE_LUA = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= ARGV[3] then return 0 end
if #ARGV >= 15 then redis.call('HSET', KEYS[2], unpack(ARGV, 15)) end
if ARGV[4] == 'finish' then
  redis.call('EXPIRE', KEYS[2], ARGV[5])
  redis.call('EXPIRE', KEYS[3], ARGV[5])
  redis.call('ZREM', KEYS[6], ARGV[6])
elseif ARGV[4] == 'defer' then
  redis.call('ZADD', KEYS[4], ARGV[7], ARGV[6])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if ARGV[8] ~= '' then
  redis.call('HINCRBY', KEYS[5], 'runs|' .. ARGV[8] .. '|' .. ARGV[9], 1)
  if ARGV[10] ~= '' then
    redis.call('HINCRBY', KEYS[5], 'bucket|' .. ARGV[8] .. '|' .. ARGV[10], 1)
    redis.call('HINCRBYFLOAT', KEYS[5], 'sum|' .. ARGV[8], ARGV[11])
    redis.call('HINCRBY', KEYS[5], 'count|' .. ARGV[8], 1)
  end
end
local result = 1
if ARGV[12] == 'fail' then
  local failures = redis.call('HINCRBY', KEYS[7], 'failures|' .. ARGV[8], 1)
  if failures >= tonumber(ARGV[13]) then
    if redis.call('HSETNX', KEYS[7], 'open|' .. ARGV[8], ARGV[14]) == 1 then result = 2 end
  end
elseif ARGV[12] == 'ok' then
  redis.call('HSET', KEYS[7], 'failures|' .. ARGV[8], 0)
end
return result
"""

_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

DURATION_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


RECOVERY = catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS
RECOVERY_BUCKET = "recovery_bucket"
RECOVERY_SUM = "recovery_sum"
RECOVERY_COUNT = "recovery_count"

# A playbook adds an observation's bucket, sum and count together, or nothing: one script.
_RECOVERY_LUA = """
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('HINCRBYFLOAT', KEYS[1], ARGV[2], ARGV[4])
redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
return 1
"""


def recovery_bucket_index(seconds: float) -> int:
    """Index of the recovery histogram's bucket `seconds` falls in (len(buckets): +Inf)."""
    for index, bound in enumerate(RECOVERY.buckets):
        if seconds <= bound:
            return index
    return len(RECOVERY.buckets)


def build_recovery_fields(mode: str, seconds: float) -> tuple[str, str, str]:
    """The run-metrics hash fields one recovery observation adds to: bucket, sum, count."""
    if mode not in catalog.RECOVERY_MODES:
        raise ValueError(f"recovery mode {mode!r} is not one of {catalog.RECOVERY_MODES}")
    return (
        f"{RECOVERY_BUCKET}|{mode}|{recovery_bucket_index(seconds)}",
        f"{RECOVERY_SUM}|{mode}",
        f"{RECOVERY_COUNT}|{mode}",
    )


def write_recovery(client: redis.Redis, key: str, mode: str, seconds: float) -> None:
    """Observe one node-failure recovery into the run-metrics hash `key` (the receiver's
    `/metrics` reads it back)."""
    bucket, total, count = build_recovery_fields(mode, seconds)
    client.register_script(_RECOVERY_LUA)(keys=[key], args=[bucket, total, count, repr(seconds)])


class JobStoreError(Exception):
    """The store holds something it cannot read (a corrupt job record)."""


@dataclass(frozen=True)
class StoreKeys:
    """Redis key names of one store."""

    prefix: str

    def _k(self, name: str) -> str:
        return f"{{{self.prefix}}}:{name}"

    def idem(self, key: str) -> str:
        """Idempotency key."""
        return self._k(f"idem:{key}")

    def job(self, job_id: str) -> str:
        """Job hash."""
        return self._k(f"job:{job_id}")

    def steps(self, job_id: str) -> str:
        """Job step list."""
        return self._k(f"job:{job_id}:steps")

    def lock(self, target: str) -> str:
        """Target lock."""
        return self._k(f"lock:{target}")

    @property
    def stream(self) -> str:
        """The job stream."""
        return self._k("jobs")

    @property
    def delayed(self) -> str:
        """Delayed (retry / lock-wait) jobs."""
        return self._k("delayed")

    @property
    def index(self) -> str:
        """All jobs by creation time."""
        return self._k("index")

    @property
    def metrics(self) -> str:
        """Run metrics shared by workers."""
        return self._k("metrics")

    @property
    def active(self) -> str:
        """Unfinished jobs by creation time."""
        return self._k("active")

    @property
    def paused(self) -> str:
        """Paused playbooks."""
        return self._k("paused")

    @property
    def breaker(self) -> str:
        """Breaker state of every playbook."""
        return self._k("breaker")

    def budget(self, playbook: str, target: str) -> str:
        """Runs admitted on one target by one playbook."""
        return self._k(f"budget:{playbook}:{target}")


class Job(BaseModel):
    """A job as `/jobs` shows it."""

    id: str = Field(description="Job id (derived from the idempotency key).")
    key: str = Field(description="Idempotency key: SHA-256 of fingerprint|startsAt|status.")
    playbook: str = Field(description="Playbook named by the alert.")
    status: JobStatus = Field(
        description="queued, running, retrying, waiting (a deferred step); finished: succeeded, "
        "failed, planned (dry run), shadowed (shadow mode), skipped (off, paused, over budget, "
        "breaker open)."
    )
    dry_run: bool = Field(description="Plan only; nothing is changed.")
    mode: str | None = Field(None, description="The playbook's mode when the job ran.")
    attempts: int = Field(description="Attempts started so far.")
    target: str | None = Field(None, description="What the playbook acts on (lock key).")
    alert: dict[str, Any] = Field(description="The alert, as received.")
    group_key: str = Field("", description="Alertmanager group key of the delivery.")
    receiver: str = Field("", description="Alertmanager receiver of the delivery.")
    created_at: str = Field(description="When the job was accepted (UTC, ISO 8601).")
    updated_at: str = Field(description="Last change.")
    finished_at: str | None = Field(None, description="When the job ended.")
    outcome: str | None = Field(
        None,
        description="succeeded, failed, dry_run, shadow, off, paused, over_budget or "
        "breaker_open once finished.",
    )
    error: str | None = Field(None, description="Why the job failed or is being retried.")
    reason: str | None = Field(
        None, description="Why the job was skipped, or what its deferred step waits for."
    )
    waiting_for: str | None = Field(None, description="Job holding the target, or the firing job.")
    next_attempt_at: str | None = Field(
        None, description="When a retrying or waiting job runs again."
    )
    plan: list[dict[str, Any]] | None = Field(None, description="The planned steps.")
    cursor: int | None = Field(
        None, description="Index in the plan of the step a waiting job runs next."
    )
    step_state: dict[str, Any] | None = Field(
        None, description="What the deferred step handed itself for its next run."
    )
    steps: list[dict[str, Any]] = Field(default_factory=list, description="Recorded steps.")


@dataclass(frozen=True)
class IngestOutcome:
    """What became of one alert of a delivery."""

    fingerprint: str
    status: str
    playbook: str | None
    job_id: str | None
    result: Literal["accepted", "duplicate", "acknowledged"]


@dataclass(frozen=True)
class Entry:
    """A stream entry handed to a worker."""

    entry_id: str
    job_id: str


@dataclass(frozen=True)
class RunCount:
    """What a settle adds to the run metrics: the outcome, and the duration unless None."""

    playbook: str
    outcome: str
    seconds: float | None = None


@dataclass(frozen=True)
class BreakerUpdate:
    """How a settle changes the playbook's breaker: a failed run (it opens once `threshold`
    failed in a row, storing `record`) or a successful one (the count starts again)."""

    failed: bool
    threshold: int = 1
    record: str = ""


SETTLED_BREAKER_OPENED = 2
"""`JobStore.finish` answer: settled, and this failure opened the playbook's breaker."""


def now_iso() -> str:
    """Current UTC time, ISO 8601 with microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def build_job_fields(
    alert: Alert, payload: WebhookPayload, key: str, dry_run: bool, stamp: str
) -> dict[str, str]:
    """The hash fields of a new job whose idempotency key is `key`."""
    return {
        "id": key[:32],
        "key": key,
        "playbook": alert.playbook or "",
        "status": "queued",
        "dry_run": "1" if dry_run else "0",
        "attempts": "0",
        "alert": alert.model_dump_json(by_alias=True),
        "group_key": payload.group_key,
        "receiver": payload.receiver,
        "created_at": stamp,
        "updated_at": stamp,
    }


def build_job(fields: Mapping[str, str], steps: Sequence[str] = ()) -> Job:
    """A Job from its hash fields and step list; JobStoreError when they are corrupt."""
    try:
        return Job(
            id=fields["id"],
            key=fields["key"],
            playbook=fields["playbook"],
            status=cast(JobStatus, fields["status"]),
            dry_run=fields.get("dry_run") == "1",
            attempts=int(fields.get("attempts", "0")),
            target=fields.get("target") or None,
            alert=json.loads(fields["alert"]),
            group_key=fields.get("group_key", ""),
            receiver=fields.get("receiver", ""),
            created_at=fields["created_at"],
            updated_at=fields.get("updated_at", fields["created_at"]),
            mode=fields.get("mode") or None,
            finished_at=fields.get("finished_at") or None,
            outcome=fields.get("outcome") or None,
            error=fields.get("error") or None,
            reason=fields.get("reason") or None,
            waiting_for=fields.get("waiting_for") or None,
            next_attempt_at=fields.get("next_attempt_at") or None,
            plan=json.loads(fields["plan"]) if fields.get("plan") else None,
            cursor=int(fields["cursor"]) if fields.get("cursor") else None,
            step_state=json.loads(fields["step_state"]) if fields.get("step_state") else None,
            steps=[json.loads(step) for step in steps],
        )
    except (KeyError, ValueError) as exc:
        raise JobStoreError(f"job record {fields.get('id', '?')} is corrupt: {exc}") from None


def job_matches(fields: Mapping[str, str], playbook: str | None, status: str | None) -> bool:
    """True when a job record exists and has the playbook and status asked for (None: any)."""
    if not fields:
        return False
    if playbook is not None and fields.get("playbook") != playbook:
        return False
    return status is None or fields.get("status") == status


def bucket_index(seconds: float) -> int:
    """Index of the histogram bucket `seconds` falls in (len(DURATION_BUCKETS) for +Inf)."""
    for index, bound in enumerate(DURATION_BUCKETS):
        if seconds <= bound:
            return index
    return len(DURATION_BUCKETS)


class JobStore:
    """Synchronous store operations: workers, tests and the CLI."""

    def __init__(self, client: redis.Redis, prefix: str, retention_seconds: int) -> None:
        self.client = client
        self.keys = StoreKeys(prefix)
        self.retention_seconds = retention_seconds
        self._promote = client.register_script(_PROMOTE_LUA)
        self._acquire = client.register_script(_ACQUIRE_LUA)
        self._renew = client.register_script(_RENEW_LUA)
        self._release = client.register_script(_RELEASE_LUA)
        self._settle_script = client.register_script(_SETTLE_LUA)

    def ensure_group(self) -> None:
        """Create the stream and its consumer group (from the start: no entry is skipped)."""
        try:
            self.client.xgroup_create(self.keys.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def get(self, job_id: str) -> Job | None:
        """The job with its steps, or None."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.job(job_id))
            pipe.lrange(self.keys.steps(job_id), 0, -1)
            fields, steps = pipe.execute()
        return build_job(fields, steps) if fields else None

    def list_jobs(
        self, playbook: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[Job]:
        """Newest jobs first, filtered (steps left out)."""
        ids = cast(list[str], self.client.zrevrange(self.keys.index, 0, min(limit * 10, 10000)))
        if not ids:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(self.keys.job(job_id))
            rows = cast(list[dict[str, str]], pipe.execute())
        return [build_job(f) for f in rows if job_matches(f, playbook, status)][:limit]

    def read(self, consumer: str, block_ms: int) -> list[Entry]:
        """At most one new entry for `consumer`, waiting up to `block_ms`."""
        reply = self.client.xreadgroup(
            GROUP, consumer, {self.keys.stream: ">"}, count=1, block=block_ms
        )
        entries: list[Entry] = []
        for _stream, messages in cast(list[Any], reply or []):
            for entry_id, body in messages:
                entries.append(Entry(entry_id, (body or {}).get("job", "")))
        return entries

    def reclaim(self, consumer: str, min_idle_ms: int) -> list[Entry]:
        """At most one entry idle for `min_idle_ms` (its worker died), now owned by `consumer`."""
        start = "0-0"
        while True:
            reply: list[Any] = self.client.xautoclaim(
                self.keys.stream, GROUP, consumer, min_idle_ms, start_id=start, count=1
            )
            start, messages = reply[0], reply[1]
            entries = [Entry(eid, (body or {}).get("job", "")) for eid, body in messages if body]
            if entries or start == "0-0":
                return entries

    def promote_due(self, now_ms: int | None = None) -> int:
        """Move delayed jobs whose time has come back onto the stream."""
        due = now_ms if now_ms is not None else int(time.time() * 1000)
        return int(self._promote(keys=[self.keys.delayed, self.keys.stream], args=[due]))

    def acquire_lock(self, target: str, job_id: str, token: str, ttl_ms: int) -> tuple[bool, str]:
        """Take the target lock for `job_id`; (False, holder value) when another job has it."""
        status, value = self._acquire(
            keys=[self.keys.lock(target)], args=[f"{job_id}|{token}", job_id, ttl_ms]
        )
        return int(status) == 1, str(value)

    def renew(
        self, entry_id: str, consumer: str, target: str | None, lock_value: str, ttl_ms: int
    ) -> bool:
        """Extend the lease on a running job; False when it was taken over."""
        lock_key = self.keys.lock(target) if target else self.keys.lock("-")
        return bool(
            self._renew(
                keys=[self.keys.stream, lock_key],
                args=[GROUP, entry_id, consumer, lock_value if target else "", ttl_ms],
            )
        )

    def release_lock(self, target: str, lock_value: str) -> None:
        """Release the target lock if this job still holds it."""
        self._release(keys=[self.keys.lock(target)], args=[lock_value])

    def start_attempt(
        self, job_id: str, target: str | None, consumer: str, mode: str = "act", count: bool = True
    ) -> int:
        """Mark the job running and count the attempt (not when `count` is False: a waiting job
        resumed); returns the attempt number."""
        stamp = now_iso()
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.keys.job(job_id), "attempts", 1 if count else 0)
            pipe.hset(
                self.keys.job(job_id),
                mapping={
                    "status": "running",
                    "mode": mode,
                    "target": target or "",
                    "worker": consumer,
                    "updated_at": stamp,
                    "waiting_for": "",
                    "next_attempt_at": "",
                },
            )
            attempts, _ = pipe.execute()
        return max(int(attempts), 1)

    def add_step(self, job_id: str, step: Mapping[str, Any]) -> None:
        """Append a step record to the job."""
        self.client.rpush(self.keys.steps(job_id), json.dumps(step, sort_keys=True, default=str))

    def set_fields(self, job_id: str, fields: Mapping[str, str]) -> None:
        """Update job fields."""
        mapping: dict[Any, Any] = {**fields, "updated_at": now_iso()}
        self.client.hset(self.keys.job(job_id), mapping=mapping)

    def finish(
        self,
        entry: Entry,
        consumer: str,
        status: JobStatus,
        fields: Mapping[str, str],
        run: RunCount | None = None,
        breaker: BreakerUpdate | None = None,
    ) -> int:
        """Record the final state, take the entry off the stream, count the run and update the
        playbook's breaker, atomically.

        0 (and nothing written) when `consumer` no longer owns the entry, 1 when settled,
        `SETTLED_BREAKER_OPENED` when settled and this failure opened the breaker.
        """
        stamp = now_iso()
        mapping = {**fields, "status": status, "updated_at": stamp, "finished_at": stamp}
        return self._settle(entry, consumer, "finish", mapping, 0, run, breaker)

    def defer(
        self,
        entry: Entry,
        consumer: str,
        delay_seconds: float,
        fields: Mapping[str, str],
        run: RunCount | None = None,
    ) -> bool:
        """Park the job in `delayed` for `delay_seconds` and take its entry off, atomically."""
        due_ms = int((time.time() + delay_seconds) * 1000)
        due = datetime.fromtimestamp(due_ms / 1000, UTC).isoformat(timespec="milliseconds")
        mapping = {**fields, "updated_at": now_iso(), "next_attempt_at": due}
        return self._settle(entry, consumer, "defer", mapping, due_ms, run, None) > 0

    def drop_entry(self, entry: Entry, consumer: str) -> bool:
        """Acknowledge and delete a stream entry that has nothing left to run."""
        return self._settle(entry, consumer, "drop", {}, 0, None, None) > 0

    def _settle(
        self,
        entry: Entry,
        consumer: str,
        mode: str,
        fields: Mapping[str, str],
        due_ms: int,
        run: RunCount | None,
        breaker: BreakerUpdate | None,
    ) -> int:
        playbook, outcome = (run.playbook, run.outcome) if run is not None else ("", "")
        seconds = run.seconds if run is not None else None
        bucket = "" if seconds is None else bucket_index(seconds)
        change = "" if breaker is None else "fail" if breaker.failed else "ok"
        args: list[str | int | float] = [
            GROUP, entry.entry_id, consumer, mode, self.retention_seconds, entry.job_id, due_ms,
            playbook, outcome, bucket, repr(float(seconds or 0.0)),
            change, breaker.threshold if breaker else 1, breaker.record if breaker else "",
        ]  # fmt: skip
        args.extend(item for pair in fields.items() for item in pair)
        job_id = entry.job_id or "-"
        reply = self._settle_script(
            keys=[self.keys.stream, self.keys.job(job_id), self.keys.steps(job_id),
                  self.keys.delayed, self.keys.metrics, self.keys.active, self.keys.breaker],
            args=args,
        )  # fmt: skip
        return int(reply)
