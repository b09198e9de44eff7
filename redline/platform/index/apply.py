"""Applying the delta log to a target: resolve each id to its last writer by (ts_ms, region),
apply idempotent upserts and deletes in batches, and only then advance the target's checkpoint,
so a crash at any point is finished by running again."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from redline.platform.index.conflicts import DEFAULT_SALT, ConflictMap, apply_heads
from redline.platform.index.deltalog import DeltaLog, TargetState, new_token
from redline.platform.index.entries import ZERO_ID, Entry, Version, parse_stream_id
from redline.platform.index.errors import DeltaLogError, LeaseBusyError
from redline.platform.index.milvus import MilvusTarget, RowState

# ---------------------------------------------------------------------------------------------
# Conflict resolution (pure)


@dataclass(frozen=True)
class Resolution:
    """The writes a batch needs after resolving every id to its last writer."""

    upserts: tuple[Entry, ...]
    deletes: tuple[Entry, ...]
    conflicts: int
    superseded: int


def build_resolution(
    entries: Sequence[Entry],
    rows: Mapping[str, RowState],
    tombstones: Mapping[str, Version],
) -> Resolution:
    """Resolve a batch against what the target holds: per id, the highest (ts_ms, region) wins
    and equal versions go to the later arrival, so the outcome is the same in any arrival order.

    A conflict is an entry that meets a different write of the same id from another region;
    superseded entries lose to a newer version and change nothing.
    """
    # per id: ((ts_ms, region), op, checksum) of what the target or an earlier entry holds;
    # plain tuples, because this loop runs once per entry on the replay's hot path
    state: dict[str, tuple[tuple[int, str], str, str]] = {}
    for row_id, row in rows.items():
        if row.version.ts_ms < 0:
            continue  # a row redline never wrote (no version): any write replaces it
        state[row_id] = ((row.version.ts_ms, row.version.region), "upsert", row.checksum)
    for row_id, version in tombstones.items():
        held = state.get(row_id)
        key = (version.ts_ms, version.region)
        if held is None or key > held[0]:
            state[row_id] = (key, "delete", "")
    winners: dict[str, Entry] = {}
    conflicts = superseded = 0
    for entry in entries:
        key = (entry.ts_ms, entry.region)
        held = state.get(entry.id)
        if held is not None:
            if held[0][1] != entry.region and (held[1] != entry.op or held[2] != entry.checksum):
                conflicts += 1
            if key < held[0]:
                superseded += 1
                continue
        state[entry.id] = (key, entry.op, entry.checksum)
        winners[entry.id] = entry
    upserts = tuple(e for e in winners.values() if e.op == "upsert")
    deletes = tuple(e for e in winners.values() if e.op == "delete")
    return Resolution(upserts, deletes, conflicts, superseded)


# ---------------------------------------------------------------------------------------------
# Applying the log to a target


@dataclass(frozen=True)
class BatchResult:
    """What one batch did; `entries == 0` means nothing was pending (or the lease was busy)."""

    entries: int
    upserts: int
    deletes: int
    conflicts: int
    superseded: int
    checkpoint: str
    busy: bool = False
    start: str = ZERO_ID
    batch: tuple[Entry, ...] = ()


class DeltaApplier:
    """Applies the delta log to one target from its durable checkpoint, one batch at a time."""

    def __init__(
        self,
        deltalog: DeltaLog,
        target: MilvusTarget,
        lease_ttl_seconds: float = 15.0,
        replay: bool = False,
        trust_high_water: bool = True,
        salt: str = DEFAULT_SALT,
        conflict_window_seconds: float | None = None,
    ) -> None:
        self.log = deltalog
        self.target = target
        # A log of one of two writing regions goes through the copy's heads (`conflicts`).
        self.conflicts = (
            ConflictMap(deltalog.redis, deltalog.collection, salt, conflict_window_seconds)
            if deltalog.origin is not None
            else None
        )
        self.lease_ttl_seconds = lease_ttl_seconds
        self.replay = replay
        # Only appliers write to a replica, so its recorded high-water mark and regions are
        # complete; the primary also takes direct writes, so its catch-up always reads versions.
        self.trust_high_water = trust_high_water
        self.token = new_token()
        self._agreed = False

    def apply_batch(
        self,
        batch_size: int,
        until: str | None = None,
        prefetched: tuple[str, list[Entry]] | None = None,
    ) -> BatchResult:
        """Apply up to `batch_size` entries after the checkpoint (and ≤ `until`), then advance it.

        The checkpoint moves only after Milvus accepted the batch; deletes are recorded as
        tombstones before they are applied, so a crash anywhere is repaired by re-running.
        `prefetched` = (checkpoint they follow, entries) is used only if the checkpoint still is
        that one when the lease is held.
        """
        name = self.target.name
        if not self.log.acquire(name, self.token, self.lease_ttl_seconds):
            return BatchResult(0, 0, 0, 0, 0, self.log.target_state(name).checkpoint, busy=True)
        try:
            state = self.log.target_state(name)
            checkpoint = state.checkpoint
            trimmed = self.log.trimmed_point()
            if parse_stream_id(checkpoint) < parse_stream_id(trimmed):
                raise DeltaLogError(
                    f"target {name} of {self.log.collection} is at {checkpoint}, behind the "
                    f"log's trim point {trimmed}: entries it never applied were trimmed (it was "
                    "not registered); rebuild it from a copy, then set its checkpoint"
                )
            if prefetched is not None and prefetched[0] == checkpoint:
                entries = prefetched[1][:batch_size]
            else:
                entries = self.log.read_after(checkpoint, batch_size, until)
            if not entries:
                return BatchResult(0, 0, 0, 0, 0, checkpoint, start=checkpoint)
            ids = list(dict.fromkeys(e.id for e in entries))
            regions = {e.region for e in entries}
            newest = max(e.ts_ms for e in entries)
            if self.conflicts is not None:
                return self._apply_heads(entries, checkpoint, newest, regions)
            if self._newer_than_target(entries, regions, state):
                # Nothing the target holds can be newer or from another region: nothing to read.
                resolution = build_resolution(entries, {}, {})
                stale_tombstones = [e.id for e in resolution.upserts] if state.tombstones else []
            else:
                rows = self.target.fetch(ids)
                tombstones = self.log.tombstones(name, ids)
                resolution = build_resolution(entries, rows, tombstones)
                stale_tombstones = [e.id for e in resolution.upserts if e.id in tombstones]
            deletes = {e.id: e.version for e in resolution.deletes}
            self.log.set_tombstones(name, deletes, {e.id: e.stream_id for e in resolution.deletes})
            self.target.delete(list(deletes))
            self.target.upsert(resolution.upserts)
            self.log.clear_tombstones(name, stale_tombstones)
            last = entries[-1].stream_id
            self.log.advance(
                name, self.token, last, len(entries), resolution.conflicts, self.replay,
                newest, sorted(regions),
            )  # fmt: skip
            return BatchResult(
                len(entries),
                len(resolution.upserts),
                len(resolution.deletes),
                resolution.conflicts,
                resolution.superseded,
                last,
                start=checkpoint,
                batch=tuple(entries),
            )
        finally:
            self.log.release(name, self.token)

    def _apply_heads(
        self, entries: list[Entry], checkpoint: str, newest: int, regions: set[str]
    ) -> BatchResult:
        """A batch of a multi-region log: through the copy's heads, conflicts re-mapped."""
        assert self.conflicts is not None
        if not self._agreed:
            self.conflicts.agree()
            self._agreed = True
        plan, moved = apply_heads(
            self.conflicts, self.target, entries, f"replicator:{self.target.name}"
        )
        last = entries[-1].stream_id
        self.log.advance(
            self.target.name, self.token, last, len(entries), len(plan.conflicts), self.replay,
            newest, sorted(regions),
        )  # fmt: skip
        return BatchResult(
            len(entries),
            len(plan.upserts),
            len(plan.deletes),
            len(plan.conflicts),
            len(entries) - moved,
            last,
            start=checkpoint,
            batch=tuple(entries),
        )

    def _newer_than_target(
        self, entries: Sequence[Entry], regions: set[str], state: TargetState
    ) -> bool:
        if not self.trust_high_water or len(regions) != 1 or not regions >= state.regions:
            return False
        # Equal versions go to the later arrival, and every held row arrived earlier.
        return min(e.ts_ms for e in entries) >= state.high_ts_ms


def wait_for_batch(
    applier: DeltaApplier,
    batch_size: int,
    until: str | None,
    wait_seconds: float,
    prefetched: tuple[str, list[Entry]] | None = None,
) -> BatchResult:
    """A batch, waiting (bounded) while another applier holds the lease."""
    deadline = time.monotonic() + wait_seconds
    while True:
        result = applier.apply_batch(batch_size, until, prefetched)
        if not result.busy:
            return result
        if time.monotonic() > deadline:
            raise LeaseBusyError(
                f"target {applier.target.name} of {applier.log.collection} stayed leased by "
                f"another applier for {wait_seconds:g} s"
            )
        time.sleep(0.05)
