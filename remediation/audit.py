"""The hash-chained audit trail: every job and step, in Redis (authoritative) and a JSONL mirror.

Each record is a JSON object `{seq, ts, kind, job_id, data, prev, hash}`: `prev` is the `hash` of
the record before it (64 zeros for the first) and `hash` is the SHA-256 of the canonical JSON
(sorted keys, no spaces, UTF-8) of the record without `hash`. Editing a record breaks its hash;
removing, inserting or reordering records breaks `seq` and the `prev` links. The head
(`<count>:<last hash>`) is kept in its own key, so a truncated Redis list is detected too.

Appends are serialized across processes by a compare-and-set Lua script on the head: a writer
builds its records on the head it knows and the script appends them only if that head is still
current; otherwise it returns the current head and the writer rebuilds. The chain can never
fork. The JSONL file mirrors the Redis list in chain order: after each commit the writer takes
an exclusive `flock` on the file and appends the records that follow the file's last `seq`,
read back from Redis, so concurrent writers never interleave out of order.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import redis
import redis.asyncio as aredis

from redline.core.redisconn import ReplicaAckError, wait_for_replicas

log = logging.getLogger(__name__)

GENESIS = "0" * 64
RECORD_FIELDS = ("seq", "ts", "kind", "job_id", "data", "prev", "hash")

HEAD_MISSING = "audit head key missing"

# The stored head (`<count>:<hash>`), the genesis head for an empty trail, or nil when records
# exist without a head (a tampered or half-restored trail: never silently restarted). Shared by
# every script that appends to the chain (here and the receiver's enqueue script).
LUA_AUDIT_HEAD = """
local function audit_head(records_key, head_key, genesis)
  local head = redis.call('GET', head_key)
  if head then return head end
  if redis.call('LLEN', records_key) > 0 then return nil end
  return '0:' .. genesis
end
"""

_APPEND_LUA = f"""{LUA_AUDIT_HEAD}
local head = audit_head(KEYS[1], KEYS[2], ARGV[3])
if not head then return {{-1, '{HEAD_MISSING}'}} end
if head ~= ARGV[1] then return {{0, head}} end
for i = 4, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
redis.call('SET', KEYS[2], ARGV[2])
return {{1, ARGV[2]}}
"""


class AuditError(Exception):
    """The audit trail could not be appended to (its head is missing or the chain is contended)."""


@dataclass(frozen=True)
class AuditEntry:
    """What a caller appends: a kind (`job.accepted`, `step`, ...), the job and its details."""

    kind: str
    job_id: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Head:
    """The end of the chain: how many records there are and the hash of the last one."""

    count: int
    hash: str

    def render(self) -> str:
        """The `<count>:<hash>` form stored in Redis."""
        return f"{self.count}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """Parse `<count>:<hash>`."""
        count, _, digest = text.partition(":")
        return cls(int(count), digest)


EMPTY_HEAD = Head(0, GENESIS)


# One encoder for every record: `json.dumps` with options builds a new one per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, non-ASCII kept, no NaN."""
    return _CANONICAL.encode(value)


def record_hash(record: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of `record` without its `hash` field."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


_PLAIN = frozenset({str, int, bool, type(None)})


def _jsonable(value: Any) -> Any:
    # Records must survive a JSON round trip unchanged, or verification would flag them.
    # Exact types first: ABC isinstance checks cost the receiver's hot path more than the rest.
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def extend_chain(
    head: Head, entries: Sequence[AuditEntry], now: datetime
) -> tuple[list[str], Head]:
    """The serialized records that extend the chain at `head` with `entries`, in order, and the
    head after them."""
    records: list[str] = []
    prev = head.hash
    stamp = now.astimezone(UTC).isoformat(timespec="microseconds")
    for offset, entry in enumerate(entries):
        record: dict[str, Any] = {
            "seq": head.count + offset,
            "ts": stamp,
            "kind": entry.kind,
            "job_id": entry.job_id,
            "data": _jsonable(entry.data),
            "prev": prev,
        }
        # What `record_hash` computes; the record has no `hash` to leave out yet.
        record["hash"] = prev = hashlib.sha256(canonical_json(record).encode("utf-8")).hexdigest()
        records.append(canonical_json(record))
    return records, Head(head.count + len(records), prev)


def build_records(head: Head, entries: Sequence[AuditEntry], now: datetime) -> list[str]:
    """The serialized records that extend the chain at `head` with `entries`, in order."""
    return extend_chain(head, entries, now)[0]


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of a verification: intact, or the first bad record's index and why."""

    ok: bool
    count: int
    index: int | None = None
    reason: str = ""
    last_hash: str = GENESIS

    def render(self, source: str) -> str:
        """One line for the CLI."""
        if self.ok:
            return f"{source}: ok: {self.count} records, head {self.last_hash[:16]}"
        return f"{source}: record {self.index}: {self.reason}"


def verify_records(lines: Iterable[str]) -> VerifyResult:
    """Check the chain: each record's hash, its `seq` against its position, its `prev` link."""
    prev = GENESIS
    count = 0
    for index, line in enumerate(lines):
        count = index + 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            return VerifyResult(False, count, index, f"not valid JSON ({exc.msg})", prev)
        if not isinstance(record, dict) or set(record) != set(RECORD_FIELDS):
            return VerifyResult(
                False, count, index, f"not an audit record (fields {', '.join(RECORD_FIELDS)})"
            )
        if record_hash(record) != record["hash"]:
            return VerifyResult(
                False, count, index, "content does not match its hash: the record was edited", prev
            )
        if record["seq"] != index:
            return VerifyResult(
                False,
                count,
                index,
                f"carries seq {record['seq']} at position {index}: "
                "a record was removed, inserted or reordered",
                prev,
            )
        if record["prev"] != prev:
            return VerifyResult(
                False,
                count,
                index,
                f"prev does not match the hash of record {index - 1}: "
                "a record was edited, removed, inserted or reordered",
                prev,
            )
        prev = record["hash"]
    return VerifyResult(True, count, None, "", prev)


def verify_against_head(result: VerifyResult, head: Head | None) -> VerifyResult:
    """Also require the chain to end where the stored head says (catches a truncated tail)."""
    if not result.ok:
        return result
    expected = head or EMPTY_HEAD
    if expected.count != result.count or expected.hash != result.last_hash:
        return VerifyResult(
            False,
            result.count,
            min(result.count, expected.count),
            f"the chain ends at {result.count} records but the head says {expected.count} "
            f"({expected.hash[:16]}): records were removed from the end or the head was altered",
            result.last_hash,
        )
    return result


def verify_chain(lines: Sequence[str], raw_head: str | None) -> VerifyResult:
    """The stored chain (its records and head, read together) verified end to end."""
    head = Head.parse(raw_head) if raw_head else None
    return verify_against_head(verify_records(lines), head)


def compare_mirrors(primary: VerifyResult, mirror: VerifyResult, what: str) -> VerifyResult:
    """Both copies intact: require the mirror to hold the same chain (same length and head)."""
    if not (primary.ok and mirror.ok):
        return mirror if primary.ok else primary
    if primary.count != mirror.count or primary.last_hash != mirror.last_hash:
        return VerifyResult(
            False,
            mirror.count,
            min(primary.count, mirror.count),
            f"{what} holds {mirror.count} records, Redis {primary.count}: the copies diverge",
            mirror.last_hash,
        )
    return primary


def mirror_prefix_of(
    lines: Sequence[str], chain: VerifyResult, mirror: VerifyResult, what: str
) -> VerifyResult:
    """Both intact and the mirror a prefix of the chain: it may lag Redis by the records being
    appended right now (they reach the file just after Redis), but never differ."""
    if not (chain.ok and mirror.ok):
        return mirror if chain.ok else chain
    if mirror.count > chain.count or (
        mirror.count and json.loads(lines[mirror.count - 1])["hash"] != mirror.last_hash
    ):
        return VerifyResult(
            False,
            mirror.count,
            min(chain.count, mirror.count),
            f"{what} holds {mirror.count} records that are not the first of Redis' "
            f"{chain.count}: the copies diverge",
            mirror.last_hash,
        )
    return mirror


def verify_file(path: Path) -> VerifyResult:
    """Verify a JSONL mirror; one not written yet is an empty chain."""
    try:
        lines = read_file_records(path)
    except FileNotFoundError:
        lines = []
    return verify_records(lines)


def read_file_records(path: Path) -> list[str]:
    """The lines of a JSONL audit file (empty lines skipped)."""
    with path.open("r", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle if line.strip()]


def _last_seq(handle: Any) -> int:
    # Read backwards from the end to the last complete line; records can be long.
    handle.seek(0, os.SEEK_END)
    end = handle.tell()
    if end == 0:
        return -1
    chunk = 65536
    position = end
    tail = b""
    while position > 0:
        step = min(chunk, position)
        position -= step
        handle.seek(position)
        tail = handle.read(step) + tail
        stripped = tail.rstrip(b"\n")
        newline = stripped.rfind(b"\n")
        if newline >= 0 or position == 0:
            last = stripped[newline + 1 :]
            try:
                seq = json.loads(last)["seq"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise AuditError(f"audit file's last line is not a record: {exc}") from None
            return int(seq)
    return -1


def mirror_to_file(path: Path, records: Sequence[str], first_seq: int) -> int:
    """Append to `path` those of `records` (seq `first_seq`…) that follow its last line.

    Holds an exclusive flock while reading the last seq and appending, so concurrent writers
    (threads or processes) keep the file in chain order. Returns how many lines were written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            last = _last_seq(handle)
            skip = last + 1 - first_seq
            if skip < 0:
                return 0  # records before these are missing; whoever fetched them writes them
            todo = records[skip:]
            if todo:
                handle.seek(0, os.SEEK_END)
                handle.write("".join(f"{line}\n" for line in todo).encode("utf-8"))
                handle.flush()
            return len(todo)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def file_last_seq(path: Path) -> int:
    """The seq of the file's last record (-1 when missing or empty)."""
    if not path.exists():
        return -1
    with path.open("rb") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        try:
            return _last_seq(handle)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@dataclass(frozen=True)
class AuditKeys:
    """Redis keys of the trail (hash-tagged so they share a cluster slot)."""

    records: str
    head: str

    @classmethod
    def for_prefix(cls, prefix: str) -> AuditKeys:
        """Keys under `{prefix}`."""
        return cls(records=f"{{{prefix}}}:audit", head=f"{{{prefix}}}:audit:head")


def _parse_reply(reply: Any) -> tuple[int, str]:
    status, value = reply
    return int(status), str(value)


class AuditLog:
    """Synchronous appender and reader (workers, CLI).

    With `min_replicas_ack` (the spec's `redis.min_replicas_ack`) an append returns only once
    that many replicas hold its records (a fence write and WAIT, `wait_for_replicas`); fewer
    within `ack_timeout_ms` raise ReplicaAckError: the records are in the primary's chain (and
    the mirror) but not acknowledged, so the caller reports it instead of carrying on as if
    they were safe.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        file: Path | None = None,
        *,
        min_replicas_ack: int = 0,
        ack_timeout_ms: int = 500,
    ) -> None:
        self._client = client
        self.keys = AuditKeys.for_prefix(prefix)
        self.file = file
        self.min_replicas_ack = min_replicas_ack
        self.ack_timeout_ms = ack_timeout_ms
        # In the chain's slot (its hash tag): on a Cluster, WAIT must reach the chain's primary.
        self._fence = f"{{{prefix}}}:audit:fence"
        self._script = client.register_script(_APPEND_LUA)
        self._lock = threading.Lock()
        self._head = EMPTY_HEAD

    def append(self, kind: str, job_id: str | None = None, **data: Any) -> None:
        """Append one record."""
        self.append_many([AuditEntry(kind, job_id, data)])

    def append_many(self, entries: Sequence[AuditEntry]) -> None:
        """Append `entries` as consecutive records, then bring the JSONL mirror up to date."""
        if not entries:
            return
        with self._lock:
            for _ in range(1000):
                records, new_head = extend_chain(self._head, entries, datetime.now(UTC))
                status, value = _parse_reply(
                    self._script(
                        keys=[self.keys.records, self.keys.head],
                        args=[self._head.render(), new_head.render(), GENESIS, *records],
                    )
                )
                if status == 1:
                    self._head = new_head
                    break
                if status < 0:
                    raise AuditError(value)
                self._head = Head.parse(value)
            else:
                raise AuditError("audit append kept conflicting with other writers")
        unacked: ReplicaAckError | None = None
        try:
            wait_for_replicas(self._client, self.min_replicas_ack, self.ack_timeout_ms, self._fence)
        except ReplicaAckError as exc:
            unacked = exc
        # Mirrored either way: records the primary then loses on a failover stay in the file,
        # where verifying the trail shows them missing from Redis.
        self.sync_file()
        if unacked is not None:
            raise ReplicaAckError(f"audit records not acknowledged: {unacked}") from unacked

    def sync_file(self) -> None:
        """Append to the JSONL mirror every record it does not have yet."""
        if self.file is None:
            return
        try:
            start = file_last_seq(self.file) + 1
            lines = cast(list[str], self._client.lrange(self.keys.records, start, -1))
            if lines:
                mirror_to_file(self.file, lines, start)
        except (OSError, AuditError) as exc:
            # Redis holds the authoritative chain; a broken mirror must not stop remediation.
            log.error("audit mirror %s not updated: %s", self.file, exc)

    def head(self) -> Head | None:
        """The stored head, or None when the trail is empty."""
        raw = cast(str | None, self._client.get(self.keys.head))
        return Head.parse(raw) if raw else None

    def records(self) -> list[str]:
        """Every record, in chain order."""
        return cast(list[str], self._client.lrange(self.keys.records, 0, -1))

    def verify(self) -> VerifyResult:
        """Verify the Redis copy, including its head."""
        # One transaction: a record appended between two reads would look like a broken head.
        with self._client.pipeline(transaction=True) as pipe:
            pipe.lrange(self.keys.records, 0, -1)
            pipe.get(self.keys.head)
            lines, raw_head = pipe.execute()
        return verify_chain(lines, raw_head)


class AsyncAuditLog:
    """The receiver's appender: concurrent requests are committed together (group commit).

    The receiver's job store appends the records of new alerts in its own enqueue script (one
    round trip for the jobs and their records); it builds them on `known_head` and moves it on,
    like `append_many` does, and brings the mirror up to date with `sync_file`.
    """

    def __init__(self, client: aredis.Redis, prefix: str, file: Path | None = None) -> None:
        self._client = client
        self.keys = AuditKeys.for_prefix(prefix)
        self.file = file
        self._script = client.register_script(_APPEND_LUA)
        self._lock = asyncio.Lock()
        self._pending: list[tuple[Sequence[AuditEntry], asyncio.Future[None]]] = []
        self.known_head = EMPTY_HEAD

    async def append_many(self, entries: Sequence[AuditEntry]) -> None:
        """Append `entries` (with whatever else is waiting) and return once they are in Redis."""
        if not entries:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((entries, future))
        async with self._lock:
            if not future.done():
                batch, self._pending = self._pending, []
                try:
                    await self._commit([entry for group, _ in batch for entry in group])
                except (redis.RedisError, AuditError) as exc:
                    for _, waiting in batch:
                        waiting.set_exception(exc)
                except BaseException:
                    # Cancelled mid-commit: the others must not wait forever.
                    for _, waiting in batch:
                        if waiting is not future:
                            waiting.set_exception(AuditError("audit commit interrupted"))
                    raise
                else:
                    for _, waiting in batch:
                        waiting.set_result(None)
        await future

    async def verify(self) -> tuple[VerifyResult, VerifyResult | None]:
        """Verify the Redis chain against its head, and the JSONL mirror (None without one)
        as a prefix of it; the hashing runs in a thread, off the event loop."""
        # One transaction: a record appended between two reads would look like a broken head.
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.lrange(self.keys.records, 0, -1)
            pipe.get(self.keys.head)
            lines, raw_head = await pipe.execute()
        chain = await asyncio.to_thread(verify_chain, lines, raw_head)
        if self.file is None:
            return chain, None
        mirror = await asyncio.to_thread(verify_file, self.file)
        return chain, mirror_prefix_of(lines, chain, mirror, str(self.file))

    async def sync_file(self) -> None:
        """Append to the JSONL mirror every record it does not have yet (errors are logged)."""
        if self.file is None:
            return
        file = self.file
        try:
            start = await asyncio.to_thread(file_last_seq, file) + 1
            lines = cast(list[str], await self._client.lrange(self.keys.records, start, -1))
            if lines:
                await asyncio.to_thread(mirror_to_file, file, lines, start)
        except (OSError, AuditError) as exc:
            # Redis holds the authoritative chain; a broken mirror must not stop remediation.
            log.error("audit mirror %s not updated: %s", file, exc)

    async def _commit(self, entries: list[AuditEntry]) -> None:
        for _ in range(1000):
            records, new_head = extend_chain(self.known_head, entries, datetime.now(UTC))
            reply = await self._script(
                keys=[self.keys.records, self.keys.head],
                args=[self.known_head.render(), new_head.render(), GENESIS, *records],
            )
            status, value = _parse_reply(reply)
            if status == 1:
                self.known_head = new_head
                break
            if status < 0:
                raise AuditError(value)
            self.known_head = Head.parse(value)
        else:
            raise AuditError("audit append kept conflicting with other writers")
        await self.sync_file()
