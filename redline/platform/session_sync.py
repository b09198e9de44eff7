"""CRDT session state in each region's Redis, and the sync that merges deltas between regions.

Each region writes locally (`CrdtSessionStore`): one Lua script stamps the operation with the
session's Lamport clock and applies it to the session's hash (`crdt:{<session>}:state`, the
layout of `redline.platform.crdt.to_fields`); the operation is then recorded in the region's
delta stream (`crdt:deltas:<region>`) and the session in its index (`crdt:sessions`, score =
last change in ms). Only the hash is touched by the script, and each session's keys share the
hash tag `{<session>}`, so Redis Cluster serves it; the stream and the index are single keys.

One `SessionSync` per direction reads the other region's stream after its checkpoint, and for
each session named there fetches the remote delta since the local version vector (a Lua script
on the remote filters the hash server-side) and merges it (a Lua script doing per element what
`crdt.merge` does). Only then is the checkpoint (kept in the local Redis) moved past the batch.
A sync killed mid-batch re-reads the batch and merges again: merging is idempotent and messages
are keyed by their id, so nothing is lost and nothing is duplicated. Because the delta comes
from the remote state, not from the stream entry, an operation whose stream entry was lost (a
writer killed between the two) still travels with the session's next change.

A sync pauses while its region's `crdt:sync:paused` key exists (the partition drill sets it in
both regions); `measure_sync_lag` is the RPO (age of the oldest delta the other region has not
merged) and `divergent_sessions` compares the sessions' digests in both regions.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from redline.core.redisconn import execute_scripted, queue_script
from redline.core.settings import ServiceSettings
from redline.platform import crdt
from redline.platform.sessions import (
    REDIS_CONNECTION_ERRORS,
    SessionStoreError,
    parse_stream_id,
    server_time_ms,
    stream_id_ms,
)

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "crdt"
DEFAULT_TTL_SECONDS = 86400.0


class SessionSyncError(SessionStoreError):
    """A CRDT session operation or the sync cannot do what was asked."""


@dataclass(frozen=True)
class CrdtLayout:
    """Where the CRDT session state lives in each region's Redis."""

    prefix: str = DEFAULT_PREFIX

    def state_key(self, session_id: str) -> str:
        """The session's hash (hash-tagged by the session id for Redis Cluster)."""
        return f"{self.prefix}:{{{crdt.check_id('session id', session_id)}}}:state"

    def stream(self, region: str) -> str:
        """The delta stream of a region (in that region's Redis)."""
        return f"{self.prefix}:deltas:{crdt.check_name('region', region)}"

    @property
    def sessions_key(self) -> str:
        """ZSET of sessions by last change (ms), local writes and merges alike."""
        return f"{self.prefix}:sessions"

    def checkpoint_key(self, source_region: str) -> str:
        """The last stream id of `source_region` merged here (in the target's Redis)."""
        return f"{self.prefix}:sync:{crdt.check_name('region', source_region)}:checkpoint"

    @property
    def paused_key(self) -> str:
        """While this key exists in a region's Redis, the sync into that region does nothing."""
        return f"{self.prefix}:sync:paused"


# KEYS: state. ARGV: region, op id, 'add'|'rem', element, value, ttl ms.
# The clock is the largest Lamport time the state holds, so clock + 1 beats every stamp in it.
_WRITE_SCRIPT = """
local clock = tonumber(redis.call('HGET', KEYS[1], 'clock') or '0') + 1
local stamp = string.format('%d', clock) .. '|' .. ARGV[1] .. '|' .. ARGV[2]
if ARGV[3] == 'add' then
  redis.call('HSET', KEYS[1], 'a:' .. ARGV[4], stamp .. '|' .. ARGV[5])
else
  redis.call('HSET', KEYS[1], 'r:' .. ARGV[4], stamp)
end
redis.call('HSET', KEYS[1], 'clock', string.format('%d', clock), 'vv:' .. ARGV[1],
  string.format('%d', clock))
if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
return clock
"""

# KEYS: state. ARGV: region, lamport, region, lamport, ... (the caller's version vector).
# Returns the adds/removes stamped after the vector, then the vector and clock of this state.
_DELTA_SCRIPT = """
local vv = {}
for i = 1, #ARGV, 2 do vv[ARGV[i]] = tonumber(ARGV[i + 1]) end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  local p = string.sub(f, 1, 2)
  if p == 'a:' or p == 'r:' then
    local l, r = string.match(v, '^(%d+)|([^|]*)|')
    if l and tonumber(l) > (vv[r] or 0) then
      out[#out + 1] = f
      out[#out + 1] = v
    end
  elseif string.sub(f, 1, 3) == 'vv:' or f == 'clock' then
    out[#out + 1] = f
    out[#out + 1] = v
  end
end
return out
"""

# Byte-wise comparison: Lua's own `<` uses strcoll, which follows the server's locale.
_LUA_HELPERS = """
local function lt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
"""

# KEYS: state. ARGV: ttl ms, then field, value pairs (a delta). Returns the fields changed.
_MERGE_SCRIPT = (
    _LUA_HELPERS
    + """
local function parse(v)
  local l, r, o = string.match(v, '^(%d+)|([^|]*)|([^|]*)')
  return tonumber(l), r, o
end
local function newer(a, b)
  local la, ra, oa = parse(a)
  local lb, rb, ob = parse(b)
  if la ~= lb then return la > lb end
  if ra ~= rb then return lt(rb, ra) end
  return lt(ob, oa)
end
local changed = 0
for i = 2, #ARGV, 2 do
  local f, v = ARGV[i], ARGV[i + 1]
  local p = string.sub(f, 1, 2)
  if p == 'a:' or p == 'r:' then
    local cur = redis.call('HGET', KEYS[1], f)
    if (not cur) or newer(v, cur) then
      redis.call('HSET', KEYS[1], f, v)
      changed = changed + 1
    end
  elseif string.sub(f, 1, 3) == 'vv:' or f == 'clock' then
    local cur = tonumber(redis.call('HGET', KEYS[1], f) or '0')
    if tonumber(v) > cur then redis.call('HSET', KEYS[1], f, v) end
  end
end
if changed > 0 and tonumber(ARGV[1]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return changed
"""
)

# KEYS: state. The digest of crdt.digest, computed where the data is.
_DIGEST_SCRIPT = (
    _LUA_HELPERS
    + """
local all = redis.call('HGETALL', KEYS[1])
local names, values = {}, {}
for i = 1, #all, 2 do
  local p = string.sub(all[i], 1, 2)
  if p == 'a:' or p == 'r:' then
    names[#names + 1] = all[i]
    values[all[i]] = all[i + 1]
  end
end
table.sort(names, lt)
local parts = {}
for _, f in ipairs(names) do
  local v = values[f]
  parts[#parts + 1] = #f .. ':' .. f .. #v .. ':' .. v
end
return redis.sha1hex(table.concat(parts))
"""
)


def _pairs(fields: Mapping[str, str]) -> list[str]:
    return [item for name, value in fields.items() for item in (name, value)]


def _as_fields(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


@dataclass(frozen=True)
class WriteReceipt:
    """What a local write did: the operation and the delta-stream entry recording it."""

    session_id: str
    op: crdt.Op
    entry_id: str


class CrdtSessionStore:
    """One region's CRDT session store: local writes, reads, deltas, merges, digests."""

    def __init__(
        self,
        client: redis.Redis,
        region: str,
        layout: CrdtLayout | None = None,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
    ) -> None:
        self.client = client
        self.region = crdt.check_name("region", region)
        self.layout = layout or CrdtLayout()
        self.ttl_ms = max(0, round(ttl_seconds * 1000))
        self._write = client.register_script(_WRITE_SCRIPT)
        self._delta = client.register_script(_DELTA_SCRIPT)
        self._merge = client.register_script(_MERGE_SCRIPT)
        self._digest = client.register_script(_DIGEST_SCRIPT)

    def _op(
        self, session_id: str, element_key: str, value: str | None, op_id: str | None
    ) -> WriteReceipt:
        op_id = crdt.check_name("op id", op_id or uuid.uuid4().hex)
        action = "add" if value is not None else "rem"
        lamport = int(
            self._write(
                keys=[self.layout.state_key(session_id)],
                args=[self.region, op_id, action, element_key, value or "", self.ttl_ms],
            )
        )
        op = crdt.Op(element_key, crdt.Stamp(lamport, self.region, op_id), value)
        # Not in the script: the stream and the index live in other Cluster slots. A writer
        # killed right here leaves the op out of the stream only; the session's next change
        # carries it, since the sync ships state deltas, not stream entries.
        with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(
                self.layout.stream(self.region),
                {"session": session_id, "lamport": str(lamport), "element": element_key,
                 "op": action, "op_id": op_id},
            )  # fmt: skip
            pipe.zadd(self.layout.sessions_key, {session_id: time.time() * 1000})
            entry_id, _ = pipe.execute()
        return WriteReceipt(session_id, op, str(entry_id))

    def add_message(
        self, session_id: str, message_id: str, content: str, op_id: str | None = None
    ) -> WriteReceipt:
        """Add a message (its id is the same in every region)."""
        return self._op(session_id, crdt.element(crdt.Kind.MESSAGE, message_id), content, op_id)

    def remove_message(
        self, session_id: str, message_id: str, op_id: str | None = None
    ) -> WriteReceipt:
        """Remove a message (last writer wins against a concurrent add)."""
        return self._op(session_id, crdt.element(crdt.Kind.MESSAGE, message_id), None, op_id)

    def set_variable(
        self, session_id: str, name: str, value: str, op_id: str | None = None
    ) -> WriteReceipt:
        """Set a context variable (last writer wins)."""
        return self._op(session_id, crdt.element(crdt.Kind.VARIABLE, name), value, op_id)

    def unset_variable(self, session_id: str, name: str, op_id: str | None = None) -> WriteReceipt:
        """Unset a context variable."""
        return self._op(session_id, crdt.element(crdt.Kind.VARIABLE, name), None, op_id)

    def state(self, session_id: str) -> crdt.SessionState:
        """The session's full CRDT state (empty when it has none)."""
        raw = self.client.hgetall(self.layout.state_key(session_id))
        return crdt.from_fields({str(k): str(v) for k, v in raw.items()})

    def version_vector(self, session_id: str) -> dict[str, int]:
        """The session's version vector."""
        raw = self.client.hgetall(self.layout.state_key(session_id))
        return {
            str(k).removeprefix(crdt.VV_PREFIX): int(v)
            for k, v in raw.items()
            if str(k).startswith(crdt.VV_PREFIX)
        }

    def delta_since(self, session_id: str, vv: Mapping[str, int]) -> dict[str, str]:
        """The session's fields stamped after `vv`, with its vector and clock (server-side)."""
        args = [item for region, lamport in vv.items() for item in (region, str(lamport))]
        flat = self._delta(keys=[self.layout.state_key(session_id)], args=args)
        return _as_fields(flat)

    def merge_fields(self, session_id: str, fields: Mapping[str, str]) -> int:
        """Merge a delta (hash fields) into the session; returns how many elements changed."""
        if not fields:
            return 0
        changed = int(
            self._merge(
                keys=[self.layout.state_key(session_id)], args=[self.ttl_ms, *_pairs(fields)]
            )
        )
        if changed:
            self.client.zadd(self.layout.sessions_key, {session_id: time.time() * 1000})
        return changed

    def digest(self, session_id: str) -> str:
        """The digest of the session's adds and removes (`crdt.digest`)."""
        return str(self._digest(keys=[self.layout.state_key(session_id)]))

    def digests(self, session_ids: Sequence[str]) -> list[str]:
        """Digests of many sessions in one round trip (one per node on a Cluster)."""

        def fill(pipe: Any) -> None:
            for session_id in session_ids:
                queue_script(pipe, self._digest, [self.layout.state_key(session_id)], [])

        return [str(d) for d in execute_scripted(self.client, fill, [self._digest])]

    def recent_sessions(self, since_ms: float, limit: int) -> dict[str, float]:
        """Sessions changed since `since_ms` (newest first, at most `limit`): id -> ms."""
        rows: Any = self.client.zrevrangebyscore(
            self.layout.sessions_key, "+inf", since_ms, start=0, num=limit, withscores=True
        )
        return {str(row[0]): float(row[1]) for row in rows}

    def prune_index(self, before_ms: float) -> int:
        """Drop index entries older than `before_ms` (sessions not changed since)."""
        return int(self.client.zremrangebyscore(self.layout.sessions_key, "-inf", f"({before_ms}"))


# --- the sync --------------------------------------------------------------------------------


@dataclass
class SyncStats:
    """Counts since the sync started."""

    batches: int = 0
    entries: int = 0
    sessions: int = 0
    changed: int = 0
    errors: int = 0
    paused_rounds: int = 0
    last_error: str | None = None


def _next_id(entry_id: str) -> str:
    ms, seq = parse_stream_id(entry_id)
    return f"{ms}-{seq + 1}"


class SessionSync:
    """Merges one remote region's deltas into the local region, from a durable checkpoint."""

    def __init__(
        self,
        source: CrdtSessionStore,
        target: CrdtSessionStore,
        batch_size: int = 200,
        block_ms: int = 200,
        trim: bool = True,
        session_delay_seconds: float = 0.0,
    ) -> None:
        if source.region == target.region:
            raise SessionSyncError(f"source and target are both region {source.region!r}")
        if batch_size < 1 or block_ms < 1:
            raise SessionSyncError("batch_size and block_ms must be >= 1")
        self.source = source
        self.target = target
        self.layout = target.layout
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.trim = trim
        self.session_delay_seconds = session_delay_seconds
        self.stats = SyncStats()

    @property
    def name(self) -> str:
        """`<source>-><target>`."""
        return f"{self.source.region}->{self.target.region}"

    def checkpoint(self) -> str:
        """The last source stream id merged here (`0-0` before the first)."""
        value = self.target.client.get(self.layout.checkpoint_key(self.source.region))
        return str(value) if value else "0-0"

    def paused(self) -> bool:
        """True while the target region's pause flag is set."""
        return bool(self.target.client.exists(self.layout.paused_key))

    def _read(self, after: str, block: int | None) -> list[tuple[str, Mapping[str, str]]]:
        stream = self.layout.stream(self.source.region)
        reply: Any = self.source.client.xread({stream: after}, count=self.batch_size, block=block)
        if not reply:
            return []
        if isinstance(reply, dict):
            batches = [items[0] for items in reply.values() if items]
        else:
            batches = [items for _name, items in reply]
        return [(str(entry_id), fields) for batch in batches for entry_id, fields in batch]

    def sync_session(self, session_id: str) -> int:
        """Merge the remote session's delta since the local vector; returns elements changed."""
        vv = self.target.version_vector(session_id)
        delta = self.source.delta_since(session_id, vv)
        return self.target.merge_fields(session_id, delta)

    def step(self, block: int | None = None) -> int:
        """One batch: read after the checkpoint, merge each session, then checkpoint; returns
        the entries handled (0 while paused or idle)."""
        if self.paused():
            self.stats.paused_rounds += 1
            time.sleep(self.block_ms / 1000.0)
            return 0
        entries = self._read(self.checkpoint(), self.block_ms if block is None else block)
        if not entries:
            return 0
        sessions = list(dict.fromkeys(str(f.get("session") or "") for _, f in entries))
        for session_id in sessions:
            if not session_id:
                continue  # a malformed entry names no session: nothing to fetch for it
            try:
                self.stats.changed += self.sync_session(session_id)
            except crdt.CrdtError as exc:
                log.error("sync %s: skipping session %r: %s", self.name, session_id, exc)
            self.stats.sessions += 1
            if self.session_delay_seconds:
                time.sleep(self.session_delay_seconds)
        last = entries[-1][0]
        # The checkpoint moves only after every session of the batch was merged.
        self.target.client.set(self.layout.checkpoint_key(self.source.region), last)
        if self.trim:
            # Nothing else reads this stream: what the checkpoint passed is no longer needed.
            self.source.client.xtrim(
                self.layout.stream(self.source.region), minid=_next_id(last), approximate=True
            )
        self.stats.batches += 1
        self.stats.entries += len(entries)
        return len(entries)

    def run(self, stop: threading.Event) -> None:
        """Loop until `stop`; connection errors are logged and retried with backoff."""
        backoff = 0.1
        while not stop.is_set():
            try:
                self.step()
                backoff = 0.1
            except (*REDIS_CONNECTION_ERRORS, redis.ResponseError) as exc:
                self.stats.errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("session sync %s: %s", self.name, self.stats.last_error)
                stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)


def set_paused(client: redis.Redis, paused: bool, layout: CrdtLayout | None = None) -> None:
    """Set or clear the pause flag of the sync into the region this client writes to."""
    key = (layout or CrdtLayout()).paused_key
    if paused:
        client.set(key, "1")
    else:
        client.delete(key)


@dataclass(frozen=True)
class SyncLag:
    """How far the target is behind the source's delta stream."""

    source_region: str
    target_region: str
    checkpoint: str
    oldest_unsynced_id: str | None
    lag_seconds: float


def measure_sync_lag(
    source: CrdtSessionStore, target: CrdtSessionStore, layout: CrdtLayout | None = None
) -> SyncLag:
    """Age of the oldest source delta after the target's checkpoint (0 when none): the RPO of
    CRDT session sync. Ages use the source Redis's clock, the one its stream ids carry."""
    layout = layout or target.layout
    raw = target.client.get(layout.checkpoint_key(source.region))
    checkpoint = str(raw) if raw else "0-0"
    stream = layout.stream(source.region)
    after = source.client.xrange(stream, min=f"({checkpoint}", max="+", count=1)
    if not after:
        return SyncLag(source.region, target.region, checkpoint, None, 0.0)
    first = str(after[0][0])
    age = max(0.0, (server_time_ms(source.client) - stream_id_ms(first)) / 1000.0)
    return SyncLag(source.region, target.region, checkpoint, first, age)


def divergent_sessions(
    stores: Sequence[CrdtSessionStore],
    window_seconds: float,
    settle_seconds: float,
    limit: int = 1000,
) -> tuple[list[str], int]:
    """Sessions changed within `window_seconds` (none within the last `settle_seconds`, so the
    normal sync delay is not counted) whose digests differ between the regions; returns them and
    how many sessions were compared."""
    now_ms = time.time() * 1000
    last: dict[str, float] = {}
    for store in stores:
        for session_id, ms in store.recent_sessions(now_ms - window_seconds * 1000, limit).items():
            last[session_id] = max(ms, last.get(session_id, 0.0))
    settled = sorted(s for s, ms in last.items() if ms <= now_ms - settle_seconds * 1000)
    if not settled:
        return [], 0
    digests = [store.digests(settled) for store in stores]
    divergent = [s for i, s in enumerate(settled) if len({d[i] for d in digests}) > 1]
    return divergent, len(settled)


def wait_converged(
    stores: Sequence[CrdtSessionStore],
    session_ids: Iterable[str],
    timeout: float,
    interval: float = 0.05,
) -> float | None:
    """Seconds until every session's digest is the same in every store, or None on timeout."""
    ids = sorted(set(session_ids))
    started = time.monotonic()
    while True:
        digests = [store.digests(ids) for store in stores]
        if all(len({d[i] for d in digests}) == 1 for i in range(len(ids))):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            return None
        time.sleep(interval)


class SessionSyncSettings(ServiceSettings):
    """Settings of `redline sessions sync` and the CRDT writer (`REDLINE_*` or `--config`)."""

    region: str = Field("local", description="This region (the sync's target, the writer's).")
    source_region: str = Field("remote", description="The region the sync merges from.")
    source_url: str = Field(
        "redis://127.0.0.1:6379/2", description="The source region's session Redis."
    )
    crdt_prefix: str = Field(DEFAULT_PREFIX, min_length=1, description="Key prefix.")
    crdt_ttl_seconds: NonNegativeFloat = Field(
        DEFAULT_TTL_SECONDS, description="TTL of a session's state after its last change (0: none)."
    )
    sync_batch_size: PositiveInt = Field(200, description="Stream entries per batch.")
    sync_block_ms: PositiveInt = Field(200, description="How long a read waits for entries.")
    sync_trim: bool = Field(True, description="Trim the source stream behind the checkpoint.")
    sync_session_delay_seconds: NonNegativeFloat = Field(
        0.0, description="Pause after each session merged (tests: a batch that takes a while)."
    )
    sync_timeout_seconds: PositiveFloat = Field(5.0, description="Redis socket timeout.")

    @property
    def layout(self) -> CrdtLayout:
        """Where the CRDT state lives."""
        return CrdtLayout(self.crdt_prefix)


__all__ = [
    "CrdtLayout",
    "CrdtSessionStore",
    "SessionSync",
    "SessionSyncError",
    "SessionSyncSettings",
    "SyncLag",
    "SyncStats",
    "WriteReceipt",
    "divergent_sessions",
    "measure_sync_lag",
    "set_paused",
    "wait_converged",
]
