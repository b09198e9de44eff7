"""Two regions writing one collection: per-id heads, deterministic conflict resolution by
re-mapping, and the conflict map (design notes §3.1).

Each region writes to its own delta log (`DeltaLog(..., origin=region)`), applies its writes to
its own copy and has its replicator apply the OTHER region's log to that copy. A copy's state
of an id is a pure function of the *heads* it has applied: per region, the last write of the id
that region made (ordered by that region's log). Of the heads, the highest (ts_ms, region)
wins: its write is the row under the id. A losing head that is an upsert with other content
(another checksum) than the winner's is a **conflict**: its content is kept under a re-mapped id,
`remap_id` — a salted hash of (original id, losing region), the same in both regions — with the
loser's version and checksum. Both copies converge on the same rows whatever the order in which
the writes arrived, because the outcome depends on the heads only. An upsert losing to a delete
is last-writer-wins (no re-map, no conflict): there is no second content to keep.

**Superseded writes.** A head also carries its region's *tombstone*: the ts_ms of the last delete
that region made of the id, up to and including the head (a region's log is applied in order, so
every copy computes the same). An upsert that another region deleted afterwards — a tombstone with
a higher (ts_ms, region) than the upsert — is *superseded*: it lost to that delete, its content
was never kept, and it is no conflict with anything written later. Without this, a region that
deletes an id and writes it again later would turn the other region's long-dead upsert into a
conflict whose content no copy that applied the delete on its own still holds; copies that saw
the writes in one batch would re-map it and the others could not (they stopped with
"the copy and its heads disagree").

**The conflict window.** Two writes of an id are concurrent only if neither region could have
seen the other's: with a window W (`window_ms`, the replication window: at least the longest
replication lag plus the clock skew between writers), writes more than W apart (ts_ms) are
sequential — the later simply wins, as an overwrite by the application — and only writes at most
W apart can be a conflict. Without a window (None) every pair of heads counts, however far apart:
an overwrite from the other region, days later, is re-mapped too. The window must be the same in
every region (like the salt): the rows a copy holds are a pure function of its heads and both.

**Pruning heads.** Heads grow with the ids ever written; `prune_settled` (run by the log's trim,
see `retention`) drops the heads no future entry can be compared with any more. Every entry a
copy may still apply — pending, replayed, or written from now on — carries a ts_ms at or after
`T` = min(now, the ts_ms of the first entry each region's log still holds) minus the clock skew:
replays only re-apply what a log holds, and the trim keeps everything after the slowest copy's
checkpoint. A head with ts_ms < `T - W` is *settled*: any later entry is more than W after it, so
it wins over it and cannot conflict with it. Dropping settled heads changes no future outcome when
(1) a settled head that lost is dropped only if it is not a conflict with the winner (a delete
always qualifies; without a window nothing else does, since any later upsert could conflict with
it), and (2) an id's heads are dropped all together only when all are settled and none is a
conflict (no re-mapped row exists), so the copy's rows are just the winner's row under the id;
the next write of the id, finding no heads, rewrites or deletes that row itself (`build_row_plan`
deletes the id of a delete that finds no heads). An id with a conflict keeps the heads its
re-mapped rows derive from (a later write more than W after them removes those rows and makes
them prunable).

Every conflict is recorded once in the conflict map (a Redis hash; field `id|checksum|checksum`,
the two checksums sorted, so both regions and every detection point write the same field; HSETNX
keeps the first record) and counted per resolution (`vectordb_id_conflicts_total`). Detection
points: the writer (against its copy's heads and the other regions' recent-writes cache, before
the write) and the applier (incoming entry against the copy's heads).

Redis keys (all hash-tagged `{collection}`, so a Redis Cluster keeps them in one slot):
- `redline:index:{<collection>}:conflicts` map field -> JSON record; `:conflicts:count`
  resolution -> records;
- `redline:index:{<collection>}:target:<copy>:heads` id -> JSON {region: [stream id, ts_ms, op,
  checksum]}; `:target:<copy>:lease`, shared by the copy's writer and its replicator;
- `redline:index:{<collection>}:recent:<region>` id -> "ts_ms|op|checksum|stream id": what a
  region's writer last wrote (set atomically with the append);
- `redline:index:{<collection>}:conflicts:settings` `window_ms` and `salt` (a digest): recorded
  by the first writer, applier or trim, checked by every later one (`ConflictMap.agree`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import redis

from redline.platform.index.deltalog import regions_key, shared_prefix
from redline.platform.index.entries import Entry, Op, Vector, parse_stream_id, row_checksum
from redline.platform.index.errors import DeltaLogError
from redline.platform.index.milvus import MilvusTarget

ConflictResolution = Literal["remapped"]
RESOLUTIONS: tuple[ConflictResolution, ...] = ("remapped",)
DEFAULT_SALT = "redline"


@dataclass(frozen=True)
class Head:
    """A region's last write of an id, as a copy applied it."""

    region: str
    stream_id: str
    ts_ms: int
    op: Op
    checksum: str
    tombstone_ms: int = field(default=-1, compare=False)
    """ts_ms of this region's last delete of the id up to this write (-1: none). Not compared:
    it follows from the region's log up to `stream_id`."""

    def key(self) -> tuple[int, str]:
        """Which head wins: the higher (ts_ms, region)."""
        return (self.ts_ms, self.region)

    def after(self, other: Head | None) -> bool:
        """True when this head is a later write of its region than `other`."""
        return other is None or parse_stream_id(self.stream_id) > parse_stream_id(other.stream_id)

    def supersedes(self, other: Head) -> bool:
        """True when this head's region deleted the id after `other` was written elsewhere."""
        return (
            self.region != other.region
            and self.tombstone_ms >= 0
            and (self.tombstone_ms, self.region) > other.key()
        )

    @classmethod
    def of(cls, entry: Entry, previous: Head | None = None) -> Head:
        """The head an entry makes (`previous`: its region's head before, for the tombstone)."""
        tombstone = -1 if previous is None else previous.tombstone_ms
        if entry.op == "delete":
            tombstone = max(tombstone, entry.ts_ms)
        return cls(entry.region, entry.stream_id, entry.ts_ms, entry.op, entry.checksum, tombstone)


Heads = dict[str, Head]
"""region -> head, for one id."""


def remap_id(original: str, loser_region: str, salt: str, pk_type: str) -> str:
    """The re-mapped id of `loser_region`'s content of `original`: a salted SHA-256, negative for
    INT64 keys (generated ids are positive), `r.` + 24 hex digits for VARCHAR keys."""
    digest = hashlib.sha256(f"{salt}\0{original}\0{loser_region}".encode()).hexdigest()
    if pk_type == "int64":
        return str(-(int(digest[:16], 16) >> 1) - 1)
    return f"r.{digest[:24]}"


@dataclass(frozen=True)
class Conflict:
    """Two regions' different contents of one id, and how it was resolved."""

    id: str
    winner: Head
    loser: Head
    remapped_id: str
    resolution: ConflictResolution = "remapped"

    @property
    def field(self) -> str:
        """The conflict map's field: the same from every detection point."""
        low, high = sorted((self.winner.checksum, self.loser.checksum))
        return f"{self.id}|{low}|{high}"

    def record(self, detected_by: str, at_ms: int) -> dict[str, Any]:
        """The JSON-ready record stored in the map."""

        def side(head: Head) -> dict[str, Any]:
            return {"region": head.region, "ts_ms": head.ts_ms, "checksum": head.checksum}

        return {
            "id": self.id,
            "resolution": self.resolution,
            "winner": side(self.winner),
            "loser": side(self.loser),
            "remapped_id": self.remapped_id,
            "regions": sorted({self.winner.region, self.loser.region}),
            "detected_by": detected_by,
            "at_ms": at_ms,
        }


def build_conflict(
    original: str, a: Head, b: Head, salt: str, pk_type: str, window_ms: int | None = None
) -> Conflict | None:
    """The conflict between two regions' heads of one id, or None (same content, a delete, the
    same region, or writes more than `window_ms` apart: sequential, the later wins)."""
    if a.region == b.region or a.op != "upsert" or b.op != "upsert" or a.checksum == b.checksum:
        return None
    if window_ms is not None and abs(a.ts_ms - b.ts_ms) > window_ms:
        return None
    winner, loser = (a, b) if a.key() > b.key() else (b, a)
    return Conflict(original, winner, loser, remap_id(original, loser.region, salt, pk_type))


@dataclass(frozen=True)
class Desired:
    """What a copy holds for one id given its heads: the row under the id (the winner, None
    when it is deleted or never written) and the re-mapped rows of losing contents."""

    winner: Head | None
    remaps: Mapping[str, Head]
    """re-mapped id -> the losing head whose content it holds."""
    conflicts: tuple[Conflict, ...] = ()


def build_desired(
    original: str,
    heads: Mapping[str, Head],
    salt: str,
    pk_type: str,
    window_ms: int | None = None,
) -> Desired:
    """The rows an id's heads call for (pure; identical in every region)."""
    if not heads:
        return Desired(None, {})
    winner = max(heads.values(), key=Head.key)
    conflicts = tuple(
        c
        for h in heads.values()
        if not superseded(h, heads)
        and (c := build_conflict(original, winner, h, salt, pk_type, window_ms)) is not None
    )
    remaps = {c.remapped_id: c.loser for c in conflicts}
    return Desired(winner if winner.op == "upsert" else None, remaps, conflicts)


def superseded(head: Head, heads: Mapping[str, Head]) -> bool:
    """True when another region's head deleted the id after `head` (see *Superseded writes*)."""
    return any(other.supersedes(head) for other in heads.values())


def prune_settled(heads: Heads, settled_before_ms: int, window_ms: int | None) -> Heads:
    """The heads an id keeps once no entry with ts_ms < `settled_before_ms` + `window_ms` can
    still be applied (see the module's *Pruning heads*): the same heads when nothing can go, {}
    when the id's heads can all go. Pure; the rows the result calls for are the rows `heads` call
    for, and stay so whatever entries are folded in later."""
    settled = {r for r, h in heads.items() if h.ts_ms < settled_before_ms}
    if not settled:
        return heads
    winner = max(heads.values(), key=Head.key)

    def conflicts(head: Head) -> bool:
        # salt and key type only shape the re-mapped id, not whether there is a conflict
        return (
            not superseded(head, heads)
            and build_conflict("", winner, head, DEFAULT_SALT, "varchar", window_ms) is not None
        )

    if len(settled) == len(heads) and not any(conflicts(h) for h in heads.values()):
        if window_ms is not None or all(
            h.op == "delete" or superseded(h, heads) for h in heads.values()
        ):
            return {}

    def droppable(head: Head) -> bool:
        if head.region not in settled or head == winner or conflicts(head):
            return False
        # without a window a losing upsert can still conflict with a later write of the winner,
        # unless a delete superseded it. Dropping a head drops its tombstone too, but every head
        # that tombstone supersedes is older still, so settled, and goes in the same pass.
        return head.op == "delete" or window_ms is not None or superseded(head, heads)

    kept = {r: h for r, h in heads.items() if not droppable(h)}
    return kept if len(kept) < len(heads) else heads


def fold_heads(entries: Iterable[Entry], heads: Mapping[str, Heads]) -> dict[str, Heads]:
    """The heads after `entries` (each replaces its region's head when it comes later in that
    region's log); only the ids whose heads changed."""
    changed: dict[str, Heads] = {}
    for entry in entries:
        current = changed.get(entry.id)
        if current is None:
            current = dict(heads.get(entry.id, {}))
        head = Head.of(entry, current.get(entry.region))
        if head.after(current.get(entry.region)):
            current[entry.region] = head
            changed[entry.id] = current
    return changed


@dataclass
class RowPlan:
    """The Milvus writes that take a copy from its old heads to the new ones."""

    upserts: list[Entry] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)


def build_row_plan(
    changed: Mapping[str, Heads],
    old: Mapping[str, Heads],
    contents: Mapping[str, tuple[Vector, bytes]],
    salt: str,
    pk_type: str,
    window_ms: int | None = None,
) -> RowPlan:
    """The upserts and deletes for the changed ids: rows whose desired content or version moved
    are (re)written from `contents` (checksum -> vector, payload), rows no longer desired are
    deleted; an id without old heads (never applied, or pruned) whose winner is a delete is
    deleted whatever the copy holds under it. DeltaLogError when a content is not in
    `contents` (see `rows_to_read`)."""
    plan = RowPlan()
    for original, heads in changed.items():
        before = build_desired(original, old.get(original, {}), salt, pk_type, window_ms)
        after = build_desired(original, heads, salt, pk_type, window_ms)
        plan.conflicts.extend(after.conflicts)
        wanted: dict[str, Head] = dict(after.remaps)
        if after.winner is not None:
            wanted[original] = after.winner
        had: dict[str, Head] = dict(before.remaps)
        if before.winner is not None:
            had[original] = before.winner
        for row_id, head in wanted.items():
            if had.get(row_id) == head:
                continue
            try:
                vector, payload = contents[head.checksum]
            except KeyError:
                raise DeltaLogError(
                    f"content {head.checksum} of {original!r} (region {head.region}) is neither "
                    "in the batch nor on the copy: the copy and its heads disagree"
                ) from None
            plan.upserts.append(
                Entry(head.stream_id, "upsert", row_id, head.region, head.ts_ms, head.checksum,
                      vector, payload)
            )  # fmt: skip
        plan.deletes.extend(row_id for row_id in had if row_id not in wanted)
        if not old.get(original) and original not in wanted:
            # pruned heads leave the winner's row behind them; deleting an absent row is a no-op
            plan.deletes.append(original)
    return plan


def rows_to_read(
    changed: Mapping[str, Heads],
    old: Mapping[str, Heads],
    salt: str,
    pk_type: str,
    window_ms: int | None = None,
) -> list[str]:
    """The ids (originals and their re-mapped ids) whose rows may hold a content the new state
    needs: everything the old state desired for the changed ids."""
    ids: list[str] = []
    for original in changed:
        before = build_desired(original, old.get(original, {}), salt, pk_type, window_ms)
        if before.winner is not None:
            ids.append(original)
        ids.extend(before.remaps)
    return ids


# ---------------------------------------------------------------------------------------------
# Redis side

# KEYS: map, counts. ARGV: per conflict: field, record JSON, resolution. New records only.
_RECORD = """
local n = 0
for i = 1, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('HINCRBY', KEYS[2], ARGV[i + 2], 1)
    n = n + 1
  end
end
return n
"""

# KEYS: a hash. ARGV: per field: field, the value read, the value to keep ('' = delete). Each
# field changes only if it still holds the value read: a head or recent write stored since is
# newer and stays.
_PRUNE = """
local n = 0
for i = 1, #ARGV, 3 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    if ARGV[i + 2] == '' then
      redis.call('HDEL', KEYS[1], ARGV[i])
    else
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    end
    n = n + 1
  end
end
return n
"""

CLOCK_SKEW_MS = 60_000
"""How far apart the clocks of two writers (and Redis) may be: an entry's ts_ms may be this much
below the first entry its log holds, and below now. Settled heads are older by this much more."""


@dataclass(frozen=True)
class HeadsPruneReport:
    """One pruning pass over a copy's heads: fields read, ids dropped, ids that kept fewer."""

    target: str
    settled_before_ms: int
    scanned: int
    dropped: int
    reduced: int


class ConflictMap:
    """A collection's conflict map, per-copy heads and per-region recent-writes cache in Redis.
    `window_seconds` is the conflict window (None: unbounded); `salt` and it must be the same at
    every detection point of the collection, in every region."""

    def __init__(
        self,
        client: redis.Redis,
        collection: str,
        salt: str = DEFAULT_SALT,
        window_seconds: float | None = None,
    ) -> None:
        self.redis = client
        self.collection = collection
        self.salt = salt
        self.window_ms = None if window_seconds is None else int(window_seconds * 1000)
        self.prefix = shared_prefix(collection)
        self.map_key = f"{self.prefix}:conflicts"
        self.count_key = f"{self.prefix}:conflicts:count"
        self.settings_key = f"{self.prefix}:conflicts:settings"
        self._record = client.register_script(_RECORD)
        self._prune = client.register_script(_PRUNE)

    def agree(self) -> None:
        """Record the collection's conflict window and salt if nobody did, else check that they
        are this map's: two detection points resolving with different ones would make the copies
        diverge. DeltaLogError naming both values when they differ."""
        mine = {
            "window_ms": "none" if self.window_ms is None else str(self.window_ms),
            "salt": hashlib.sha256(self.salt.encode()).hexdigest()[:16],
        }
        pipe = self.redis.pipeline(transaction=False)
        for name, value in mine.items():
            pipe.hsetnx(self.settings_key, name, value)
        pipe.hgetall(self.settings_key)
        held = {_text(k): _text(v) for k, v in cast(dict[bytes, bytes], pipe.execute()[-1]).items()}
        if held.get("window_ms") != mine["window_ms"]:
            raise DeltaLogError(
                f"{self.collection}: the conflict window is {_window_text(held.get('window_ms'))} "
                f"(recorded in Redis by the first writer or replicator), this process has "
                f"{_window_text(mine['window_ms'])}: use the same heads_retention_seconds in every "
                "region and process"
            )
        if held.get("salt") != mine["salt"]:
            raise DeltaLogError(
                f"{self.collection}: this process's id_salt differs from the one recorded in Redis "
                "by the first writer or replicator: use the same id_salt in every region"
            )

    def heads_key(self, target: str) -> str:
        """Hash id -> heads of a copy."""
        return f"{self.prefix}:target:{target}:heads"

    def recent_key(self, region: str) -> str:
        """Hash id -> the region writer's last write of it."""
        return f"{self.prefix}:recent:{region}"

    # conflicts -----------------------------------------------------------------------------

    def record(self, conflicts: Sequence[Conflict], detected_by: str) -> int:
        """Record conflicts not recorded yet (idempotent); returns how many were new."""
        if not conflicts:
            return 0
        now = int(time.time() * 1000)
        args: list[str] = []
        for c in {c.field: c for c in conflicts}.values():
            record = json.dumps(c.record(detected_by, now), sort_keys=True, separators=(",", ":"))
            args += [c.field, record, c.resolution]
        return int(self._record(keys=[self.map_key, self.count_key], args=args))

    def records(self) -> list[dict[str, Any]]:
        """Every record (HSCAN; for reports, tests and verification of a range)."""
        found: list[dict[str, Any]] = []
        for _, value in self.redis.hscan_iter(self.map_key, count=1000):
            found.append(json.loads(value))
        return found

    def by_loser(self, ids: Iterable[str]) -> dict[tuple[str, str, str], str]:
        """(original id, losing region, losing checksum) -> re-mapped id, for the given ids."""
        wanted = set(ids)
        found: dict[tuple[str, str, str], str] = {}
        for record in self.records():
            if record["id"] in wanted:
                loser = record["loser"]
                found[(record["id"], loser["region"], loser["checksum"])] = record["remapped_id"]
        return found

    def counts(self) -> dict[str, int]:
        """Records per resolution (every resolution present, zero when none)."""
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self.count_key))
        counts: dict[str, int] = dict.fromkeys(RESOLUTIONS, 0)
        counts.update({k.decode(): int(v) for k, v in raw.items()})
        return counts

    # heads ---------------------------------------------------------------------------------

    def heads(self, target: str, ids: Sequence[str]) -> dict[str, Heads]:
        """The copy's heads of `ids` (ids never written are absent)."""
        if not ids:
            return {}
        values = self.redis.hmget(self.heads_key(target), list(ids))
        found: dict[str, Heads] = {}
        for row_id, value in zip(ids, values, strict=True):
            if value is not None:
                found[row_id] = _parse_heads(value)
        return found

    def set_heads(self, target: str, heads: Mapping[str, Heads]) -> None:
        """Store the copy's new heads (after the rows they call for were written)."""
        if heads:
            mapping = {k: _format_heads(v) for k, v in heads.items()}
            self.redis.hset(self.heads_key(target), mapping=mapping)  # type: ignore[arg-type]

    def all_heads(self, target: str) -> dict[str, Heads]:
        """Every head of a copy (HSCAN; verification and tests)."""
        return {
            _text(k): _parse_heads(v)
            for k, v in self.redis.hscan_iter(self.heads_key(target), count=1000)
        }

    # recent writes -------------------------------------------------------------------------

    def recent(self, region: str, ids: Sequence[str]) -> dict[str, Head]:
        """What `region`'s writer last wrote of `ids`."""
        if not ids:
            return {}
        values = self.redis.hmget(self.recent_key(region), list(ids))
        found: dict[str, Head] = {}
        for row_id, value in zip(ids, values, strict=True):
            if value is not None:
                ts, op, checksum, sid = _text(value).split("|")
                found[row_id] = Head(
                    region, sid, int(ts), "upsert" if op == "u" else "delete", checksum
                )
        return found

    def regions(self) -> list[str]:
        """Regions that write the collection (each append adds its region to the set)."""
        members = cast(set[bytes], self.redis.smembers(regions_key(self.collection)))
        return sorted(_text(m) for m in members)

    # pruning -------------------------------------------------------------------------------

    def log_regions(self) -> list[str]:
        """Regions that have a delta log of the collection: those that wrote it (a region's
        log is created by its writer's first append, which also adds it to the set)."""
        return self.regions()

    def oldest_applicable_ms(self, regions: Iterable[str], now_ms: int) -> int:
        """The lowest ts_ms an entry a copy applies from now on may carry: the first entry each
        region's log holds (replays re-apply no older one), and now for writes to come, less
        the clock skew between writers."""
        oldest = now_ms
        for region in regions:
            first = self.redis.xrange(f"{self.prefix}:{region}:log", "-", "+", count=1)
            if first:
                fields = cast(dict[bytes, bytes], first[0][1])
                oldest = min(oldest, int(fields.get(b"ts_ms", b"0") or 0))
        return oldest - CLOCK_SKEW_MS

    def settled_before_ms(self, now_ms: int | None = None) -> int:
        """Heads with a ts_ms below this are settled (no entry still to apply is within the
        window of them): the oldest applicable ts_ms, less the window."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return self.oldest_applicable_ms(self.log_regions(), now_ms) - (self.window_ms or 0)

    def prune_heads(
        self, target: str, settled_before_ms: int, count: int = 1000
    ) -> HeadsPruneReport:
        """Drop the copy's settled heads (`prune_settled`): HSCAN in chunks, each field changed
        only if it still holds what was read, so a write or replicator storing a newer head in
        between keeps it. No lease needed: a removed head and the rows it called for agree."""
        key = self.heads_key(target)
        cursor, scanned, dropped, reduced = 0, 0, 0, 0
        while True:
            cursor, chunk = cast(
                tuple[int, dict[bytes, bytes]], self.redis.hscan(key, cursor, count=count)
            )
            args: list[bytes | str] = []
            for name, raw in chunk.items():
                scanned += 1
                heads = _parse_heads(raw)
                kept = prune_settled(heads, settled_before_ms, self.window_ms)
                if kept is heads:
                    continue
                args += [name, raw, _format_heads(kept) if kept else ""]
                if kept:
                    reduced += 1
                else:
                    dropped += 1
            if args:
                self._prune(keys=[key], args=args)
            if cursor == 0:
                return HeadsPruneReport(target, settled_before_ms, scanned, dropped, reduced)

    def prune_recent(self, region: str, settled_before_ms: int, count: int = 1000) -> int:
        """Forget the region writer's recent writes older than `settled_before_ms`: their
        entries are behind every log's first entry, so every copy applied them (and recorded
        their conflicts) or they are out of any later write's window. Returns how many went."""
        key = self.recent_key(region)
        cursor, pruned = 0, 0
        while True:
            cursor, chunk = cast(
                tuple[int, dict[bytes, bytes]], self.redis.hscan(key, cursor, count=count)
            )
            args: list[bytes | str] = []
            for name, raw in chunk.items():
                if int(_text(raw).split("|", 1)[0]) < settled_before_ms:
                    args += [name, raw, ""]
            if args:
                pruned += int(self._prune(keys=[key], args=args))
            if cursor == 0:
                return pruned


def _window_text(value: str | None) -> str:
    if value is None or value == "none":
        return "unbounded"
    return f"{int(value) / 1000:g} s"


def _format_heads(heads: Heads) -> str:
    return json.dumps(
        {
            r: [h.stream_id, h.ts_ms, h.op, h.checksum, *([h.tombstone_ms] * (h.tombstone_ms >= 0))]
            for r, h in sorted(heads.items())
        },
        separators=(",", ":"),
    )


def _parse_heads(raw: bytes | str) -> Heads:
    data = json.loads(raw)
    # [stream id, ts_ms, op, checksum] and, once the region deleted the id, its tombstone
    return {
        region: Head(region, str(sid), int(ts), cast(Op, op), str(checksum), int(rest[0]))
        if rest
        else Head(region, str(sid), int(ts), cast(Op, op), str(checksum))
        for region, (sid, ts, op, checksum, *rest) in data.items()
    }


def apply_heads(
    conflicts: ConflictMap, target: MilvusTarget, entries: Sequence[Entry], detected_by: str
) -> tuple[RowPlan, int]:
    """Apply entries to a copy through its heads (the caller holds the copy's lease): read the
    heads, fold the entries in, read back the rows whose content the new state moves, write
    re-mapped rows first (their content may come from the row they replace), then the ids' own
    rows, then the deletes; record the conflicts; store the heads last, so a crash anywhere is
    repaired by applying again. Returns the plan and how many entries changed a head."""
    ids = list(dict.fromkeys(e.id for e in entries))
    old = conflicts.heads(target.name, ids)
    changed = fold_heads(entries, old)
    if not changed:
        return RowPlan(), 0
    pk_type = target.schema().pk_type
    window = conflicts.window_ms
    contents: dict[str, tuple[Vector, bytes]] = {}
    read = rows_to_read(changed, old, conflicts.salt, pk_type, window)
    if read:
        for row in target.fetch(read, with_vectors=True).values():
            if row.vector is not None:
                contents[row_checksum(row.vector, row.payload)] = (row.vector, row.payload)
    for entry in entries:
        if entry.op == "upsert" and entry.vector is not None:
            contents[entry.checksum] = (entry.vector, entry.payload)
    plan = build_row_plan(changed, old, contents, conflicts.salt, pk_type, window)
    originals = set(changed)
    target.upsert([e for e in plan.upserts if e.id not in originals])
    target.upsert([e for e in plan.upserts if e.id in originals])
    target.delete(plan.deletes)
    conflicts.record(plan.conflicts, detected_by)
    conflicts.set_heads(target.name, changed)
    moved = sum(1 for e in entries if e.id in changed and changed[e.id].get(e.region) == Head.of(e))
    return plan, moved


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
