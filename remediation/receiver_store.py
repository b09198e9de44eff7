"""The receiver's side of the job store (asyncio): new alerts enqueued by group commit with
their audit records, and the job reads of the receiver's API.

The receiver enqueues with one Lua script per group commit (the deliveries that arrived while
the previous commit was in flight): for every new alert, the idempotency key, the job hash, the
stream entry, the index entries and the alert's hash-chained audit record (`audit.py`) are
written together or not at all, in one round trip, before any of those deliveries is answered.
The records are built on the audit head the receiver last saw; when another writer moved it on,
or a key turned out to be taken, the script writes nothing and the receiver rebuilds.

Keys and the job record: `redline.remediation.jobs`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

import redis
import redis.asyncio as aredis

from redline.remediation.audit import (
    GENESIS,
    HEAD_MISSING,
    LUA_AUDIT_HEAD,
    AsyncAuditLog,
    AuditEntry,
    AuditError,
    Head,
    extend_chain,
)
from redline.remediation.jobs import (
    GROUP,
    IngestOutcome,
    Job,
    StoreKeys,
    build_job,
    build_job_fields,
    job_matches,
    now_iso,
)
from redline.remediation.models import Alert, WebhookPayload, idempotency_key

# The receiver's group commit: every new alert of the waiting deliveries and its audit record,
# in one script. KEYS: stream, index, active, audit records, audit head, then the idempotency
# key and job key of each alert. ARGV: ttl (s), now (ms), index retention (ms), the audit head
# the records were built on, the head after them, the genesis hash, the number of alerts, then
# each alert's job id ('' for an alert without a playbook: acknowledged only) and job fields
# (JSON), then the audit records. Nothing is written unless every idempotency key is new and the
# head is still the one the records were built on; otherwise the reply says which alerts were
# already recorded (position, stored value) and the current head, and the caller rebuilds.
_INGEST_LUA = f"""{LUA_AUDIT_HEAD}
local head = audit_head(KEYS[4], KEYS[5], ARGV[6])
if not head then return {{-1, '{HEAD_MISSING}'}} end
local count = tonumber(ARGV[7])
local recorded = {{}}
for i = 1, count do
  local existing = redis.call('GET', KEYS[4 + 2 * i])
  if existing then
    recorded[#recorded + 1] = i
    recorded[#recorded + 1] = existing
  end
end
if #recorded > 0 or head ~= ARGV[4] then return {{0, head, recorded}} end
local queued = false
for i = 1, count do
  local id = ARGV[6 + 2 * i]
  if id == '' then
    redis.call('SET', KEYS[4 + 2 * i], 'ack', 'EX', ARGV[1])
  else
    redis.call('SET', KEYS[4 + 2 * i], id, 'EX', ARGV[1])
    local flat = {{}}
    for name, value in pairs(cjson.decode(ARGV[7 + 2 * i])) do
      flat[#flat + 1] = name
      flat[#flat + 1] = value
    end
    redis.call('HSET', KEYS[5 + 2 * i], unpack(flat))
    redis.call('XADD', KEYS[1], '*', 'job', id)
    redis.call('ZADD', KEYS[2], ARGV[2], id)
    redis.call('ZADD', KEYS[3], ARGV[2], id)
    queued = true
  end
end
if queued then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
end
for i = 8 + 2 * count, #ARGV do redis.call('RPUSH', KEYS[4], ARGV[i]) end
redis.call('SET', KEYS[5], ARGV[5])
return {{1, ARGV[5]}}
"""


_PendingIngest = tuple[WebhookPayload, bool, "asyncio.Future[list[IngestOutcome]]"]

ACKNOWLEDGED = "ack"
"""What the idempotency key of an alert without a playbook holds (there is no job id)."""


def build_ingest_entry(alert: Alert, payload: WebhookPayload, job_id: str | None) -> AuditEntry:
    """The audit record of a new alert: `job.accepted` with its job, or `alert.acknowledged`."""
    common = {
        "fingerprint": alert.fingerprint,
        "status": alert.status,
        "alertname": alert.labels.get("alertname", ""),
        "receiver": payload.receiver,
        "group_key": payload.group_key,
    }
    if job_id is None:
        return AuditEntry("alert.acknowledged", None, {**common, "labels": dict(alert.labels)})
    return AuditEntry("job.accepted", job_id, {**common, "playbook": alert.playbook})


@dataclass(frozen=True)
class _NewAlert:
    """An alert of a group commit whose idempotency key was free when last looked at."""

    key: str
    job_id: str  # "" when the alert names no playbook: acknowledged, no job
    fields: str  # the job hash as one JSON argument ("{}" without a job)
    entry: AuditEntry


@dataclass(frozen=True)
class _Recorded:
    """What a group commit did: each delivery's idempotency keys (in alert order), the keys it
    wrote (value: job id or ACKNOWLEDGED) and those it found recorded already."""

    keys: list[list[str]]
    written: dict[str, str]
    found: dict[str, str]

    def outcomes(self, batch: Sequence[_PendingIngest]) -> list[list[IngestOutcome]]:
        """Each delivery's outcomes: the first alert of the commit with a written key is new,
        any later one with the same key (a concurrent or repeated delivery) a duplicate."""
        claimed: set[str] = set()
        answers: list[list[IngestOutcome]] = []
        for (payload, _, _), keys in zip(batch, self.keys, strict=True):
            mine: list[IngestOutcome] = []
            for alert, key in zip(payload.alerts, keys, strict=True):
                value = self.written.get(key)
                result: Literal["accepted", "duplicate", "acknowledged"] = "duplicate"
                if value is not None and key not in claimed:
                    claimed.add(key)
                    result = "acknowledged" if value == ACKNOWLEDGED else "accepted"
                stored = value if value is not None else self.found[key]
                job_id = None if stored == ACKNOWLEDGED else stored
                mine.append(
                    IngestOutcome(alert.fingerprint, alert.status, alert.playbook, job_id, result)
                )
            answers.append(mine)
        return answers


class AsyncJobStore:
    """The receiver's store operations (asyncio); new alerts are audited through `audit`."""

    def __init__(
        self, client: aredis.Redis, prefix: str, retention_seconds: int, audit: AsyncAuditLog
    ) -> None:
        self.client = client
        self.keys = StoreKeys(prefix)
        self.retention_seconds = retention_seconds
        self.audit = audit
        self._ingest = client.register_script(_INGEST_LUA)
        self._lock = asyncio.Lock()
        self._pending: list[_PendingIngest] = []

    async def ensure_group(self) -> None:
        """Create the stream and its consumer group if missing."""
        try:
            await self.client.xgroup_create(self.keys.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def ping(self) -> bool:
        """True when Redis answers."""
        return bool(await self.client.ping())

    async def ingest(self, payload: WebhookPayload, dry_run: bool) -> list[IngestOutcome]:
        """Record every new alert of `payload` and its audit record; return once both are in
        Redis. On redis.RedisError or AuditError nothing of this delivery was recorded.

        Deliveries that arrive while a commit is in flight are committed together in the next
        one (group commit): one script, so one round trip, records the new jobs of many
        requests and their audit records atomically; each request is answered only after its
        own alerts are recorded.
        """
        future: asyncio.Future[list[IngestOutcome]] = asyncio.get_running_loop().create_future()
        self._pending.append((payload, dry_run, future))
        async with self._lock:
            if not future.done():
                batch, self._pending = self._pending, []
                await self._commit(batch)
        return await future

    async def _commit(self, batch: list[_PendingIngest]) -> None:
        try:
            recorded = await self._record(batch)
        except (redis.RedisError, AuditError) as exc:
            for _, _, waiting in batch:
                waiting.set_exception(exc)
            return
        except BaseException:
            # Cancelled mid-commit: whoever else waits gets an answer (503), not a hang.
            for _, _, waiting in batch:
                if not waiting.done():
                    waiting.set_exception(redis.ConnectionError("ingest commit interrupted"))
            raise
        for (_, _, waiting), outcomes in zip(batch, recorded.outcomes(batch), strict=True):
            waiting.set_result(outcomes)

    async def _record(self, batch: list[_PendingIngest]) -> _Recorded:
        stamp = now_iso()
        keys: list[list[str]] = []
        new: dict[str, _NewAlert] = {}
        for payload, dry_run, _ in batch:
            keys.append([])
            for alert in payload.alerts:
                key = idempotency_key(alert)
                keys[-1].append(key)
                if key not in new:
                    new[key] = self._new_alert(alert, payload, key, dry_run, stamp)
        found: dict[str, str] = {}
        for _ in range(1000):
            if not new:
                break
            todo = list(new.values())
            taken = await self._write(todo)
            if taken is None:
                await self.audit.sync_file()
                break
            # Keys recorded meanwhile (another receiver, an earlier delivery of the same alert)
            # are duplicates; the others are rebuilt on the current audit head and tried again.
            for position, value in taken:
                found[todo[position].key] = value
                del new[todo[position].key]
        else:
            raise AuditError("audit append kept conflicting with other writers")
        written = {item.key: item.job_id or ACKNOWLEDGED for item in new.values()}
        return _Recorded(keys, written, found)

    def _new_alert(
        self, alert: Alert, payload: WebhookPayload, key: str, dry_run: bool, stamp: str
    ) -> _NewAlert:
        if alert.playbook is None:
            return _NewAlert(key, "", "{}", build_ingest_entry(alert, payload, None))
        job_id = key[:32]
        fields = build_job_fields(alert, payload, key, dry_run or alert.dry_run_requested, stamp)
        entry = build_ingest_entry(alert, payload, job_id)
        # One JSON argument, not 22: packing arguments dominates the client's cost.
        return _NewAlert(key, job_id, json.dumps(fields), entry)

    async def _write(self, todo: Sequence[_NewAlert]) -> list[tuple[int, str]] | None:
        """One run of the ingest script: None when it recorded everything, else what it found
        recorded already (position in `todo`, stored value) and it wrote nothing."""
        head = self.audit.known_head
        records, after = extend_chain(head, [item.entry for item in todo], datetime.now(UTC))
        ttl = self.retention_seconds
        keys = [self.keys.stream, self.keys.index, self.keys.active,
                self.audit.keys.records, self.audit.keys.head]  # fmt: skip
        args: list[str | int] = [ttl, int(time.time() * 1000), ttl * 1000,
                                 head.render(), after.render(), GENESIS, len(todo)]  # fmt: skip
        for item in todo:
            keys += (self.keys.idem(item.key), self.keys.job(item.job_id or "-"))
            args += (item.job_id, item.fields)
        args += records
        reply: list[Any] = await self._ingest(keys=keys, args=args)
        status = int(reply[0])
        if status < 0:
            raise AuditError(str(reply[1]))
        if status == 1:
            self.audit.known_head = after
            return None
        self.audit.known_head = Head.parse(str(reply[1]))
        pairs = reply[2]
        return [
            (int(position) - 1, str(value))
            for position, value in zip(pairs[::2], pairs[1::2], strict=True)
        ]

    async def get(self, job_id: str) -> Job | None:
        """The job with its steps, or None."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.job(job_id))
            pipe.lrange(self.keys.steps(job_id), 0, -1)
            fields, steps = await pipe.execute()
        return build_job(fields, steps) if fields else None

    async def list_jobs(
        self, playbook: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[Job]:
        """Newest jobs first, filtered (steps left out)."""
        ids = cast(
            list[str], await self.client.zrevrange(self.keys.index, 0, min(limit * 10, 10000))
        )
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(self.keys.job(job_id))
            rows = cast(list[dict[str, str]], await pipe.execute())
        return [build_job(f) for f in rows if job_matches(f, playbook, status)][:limit]

    async def run_metrics(self) -> dict[str, str]:
        """The shared run counters (raw hash)."""
        return cast(dict[str, str], await self.client.hgetall(self.keys.metrics))
