"""Verification of a range of the delta log against a target: every id's last write is on it
(upserts with a checksum recomputed from the row read back — vector, scalar and dynamic fields —
that matches the write's, deletes absent).

For a log of one of two writing regions, the conflict map is honoured: a write that lost a
conflict is expected under its re-mapped id (with its own version and checksum), not under the
original one, and counts as `remapped` once found there."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from redline.platform.index.conflicts import DEFAULT_SALT, ConflictMap, build_desired
from redline.platform.index.deltalog import DeltaLog
from redline.platform.index.entries import Entry, row_checksum
from redline.platform.index.milvus import FETCH_CHUNK, MilvusTarget, RowState


@dataclass(frozen=True)
class VerifyReport:
    """Verification of every id written in a range of the log against a target."""

    after: str
    until: str
    entries: int
    ids: int
    verified: int
    superseded: int
    missing: int
    unexpected: int
    stale: int
    checksum_mismatches: int
    mismatched_ids: tuple[str, ...]
    remapped: int = 0
    """Writes that lost a conflict, found under their re-mapped id (two writing regions)."""

    @property
    def mismatches(self) -> int:
        """Ids whose target state does not match their last write."""
        return self.missing + self.unexpected + self.stale + self.checksum_mismatches

    @property
    def ok(self) -> bool:
        """True when every id matched."""
        return self.mismatches == 0


LastWrite = tuple[tuple[int, str], str, str]
"""The last write of an id in a range: ((ts_ms, region), op, checksum). A plain tuple, as it is
built once per replayed entry."""


def note_last_writes(expected: dict[str, LastWrite], entries: Iterable[Entry]) -> int:
    """Fold entries into the last write per id (ties: the later arrival); returns the count."""
    count = 0
    for entry in entries:
        count += 1
        key = (entry.ts_ms, entry.region)
        held = expected.get(entry.id)
        if held is None or key >= held[0]:
            expected[entry.id] = (key, entry.op, entry.checksum)
    return count


def verify_range(
    deltalog: DeltaLog,
    target: MilvusTarget,
    after: str,
    until: str,
    sample_limit: int = 20,
    workers: int = 2,
    salt: str = DEFAULT_SALT,
    conflict_window_seconds: float | None = None,
) -> VerifyReport:
    """Check every id written in (after, until]: its last write by (ts_ms, region) is on the
    target (upsert: present with that version and a checksum recomputed from the row read back
    — every field — that matches; delete: absent). Ids the target holds in a newer version
    count as superseded, not wrong. `salt` and the conflict window: those of the collection's
    writers (two writing regions)."""
    expected: dict[str, LastWrite] = {}
    entries = note_last_writes(expected, deltalog.iter_range(after, until))
    return verify_last_writes(
        deltalog, target, expected, after, until, entries, sample_limit, workers, salt,
        conflict_window_seconds,
    )  # fmt: skip


def verify_last_writes(
    deltalog: DeltaLog,
    target: MilvusTarget,
    expected: Mapping[str, LastWrite],
    after: str,
    until: str,
    entries: int,
    sample_limit: int = 20,
    workers: int = 2,
    salt: str = DEFAULT_SALT,
    conflict_window_seconds: float | None = None,
) -> VerifyReport:
    """Check the folded last writes of (after, until] (`entries` of them) against the target."""
    ids = list(expected)
    if deltalog.origin is not None:
        conflicts = ConflictMap(deltalog.redis, deltalog.collection, salt, conflict_window_seconds)
        return _verify_heads(
            conflicts, target, expected, after, until, entries, sample_limit, workers
        )
    rows = _read(target, ids, workers)
    tombstones = deltalog.tombstones(target.name, ids)
    verified = superseded = missing = unexpected = stale = bad_sum = 0
    wrong: list[str] = []
    for row_id, (want_key, want_op, want_checksum) in expected.items():
        row = rows.get(row_id)
        newer = [v for v in (row.version if row else None, tombstones.get(row_id)) if v]
        if any(v.key() > want_key for v in newer):
            superseded += 1
            continue
        if want_op == "delete":
            if row is None:
                verified += 1
                continue
            unexpected += 1
        elif row is None:
            missing += 1
        elif row.version.key() != want_key:
            stale += 1
        elif row.vector is None or row_checksum(row.vector, row.payload) != want_checksum:
            bad_sum += 1
        else:
            verified += 1
            continue
        if len(wrong) < sample_limit:
            wrong.append(row_id)
    return VerifyReport(
        after, until, entries, len(ids), verified, superseded, missing, unexpected, stale,
        bad_sum, tuple(wrong),
    )  # fmt: skip


def _read(target: MilvusTarget, ids: list[str], workers: int) -> dict[str, RowState]:
    chunks = [ids[i : i + FETCH_CHUNK] for i in range(0, len(ids), FETCH_CHUNK)]
    rows: dict[str, RowState] = {}
    # Reading vectors back is most of a verification; overlap the round trips with decoding.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for found in pool.map(partial(target.fetch, with_vectors=True), chunks):
            rows.update(found)
    return rows


def _verify_heads(
    conflicts: ConflictMap,
    target: MilvusTarget,
    expected: Mapping[str, LastWrite],
    after: str,
    until: str,
    entries: int,
    sample_limit: int,
    workers: int,
) -> VerifyReport:
    """Verification of a multi-region log's writes on a copy: each write is the row under its
    id (it won), or lost a conflict and is under the re-mapped id the conflict map names, or
    lost with the same content as the winner, or was superseded by a later write."""
    ids = list(expected)
    heads = conflicts.heads(target.name, ids)
    losers = conflicts.by_loser(ids)
    pk_type = target.schema().pk_type
    window = conflicts.window_ms
    # where each write should be: (row id, whether it is a re-map), or None: superseded
    places: dict[str, tuple[str, bool] | None] = {}
    verified = superseded = missing = unexpected = stale = bad_sum = remapped = 0
    wrong: list[str] = []
    for row_id, ((ts_ms, region), op, checksum) in expected.items():
        mine = heads.get(row_id, {}).get(region)
        if mine is None or (mine.ts_ms, mine.checksum, mine.op) != (ts_ms, checksum, op):
            if mine is not None and mine.ts_ms >= ts_ms:
                places[row_id] = None  # the region wrote it again later
            else:
                places[row_id] = (row_id, False)  # never applied: the row check reports it
            continue
        desired = build_desired(row_id, heads[row_id], conflicts.salt, pk_type, window)
        if desired.winner == mine or op == "delete":
            places[row_id] = (row_id, False)
        elif (row_id, region, checksum) in losers:
            places[row_id] = (losers[(row_id, region, checksum)], True)
        elif any(head == mine for head in desired.remaps.values()):
            places[row_id] = None  # a re-map the map does not know: reported below
            missing += 1
            if len(wrong) < sample_limit:
                wrong.append(row_id)
        else:
            places[row_id] = None  # lost to a later write (same content, or a delete)
    rows = _read(target, sorted({p[0] for p in places.values() if p is not None}), workers)
    for row_id, place in places.items():
        ((ts_ms, region), op, checksum) = expected[row_id]
        if place is None:
            superseded += 1
            continue
        where, is_remap = place
        row = rows.get(where)
        if op == "delete" and not is_remap:
            winner = build_desired(
                row_id, heads.get(row_id, {}), conflicts.salt, pk_type, window
            ).winner
            if row is None:
                verified += 1
                continue
            if winner is not None and winner.key() > (ts_ms, region):
                superseded += 1
                continue
            unexpected += 1
        elif row is None:
            missing += 1
        elif row.version.key() != (ts_ms, region):
            stale += 1
        elif row.vector is None or row_checksum(row.vector, row.payload) != checksum:
            bad_sum += 1
        else:
            if is_remap:
                remapped += 1
            else:
                verified += 1
            continue
        if len(wrong) < sample_limit:
            wrong.append(row_id)
    return VerifyReport(
        after, until, entries, len(ids), verified, superseded, missing, unexpected, stale,
        bad_sum, tuple(wrong), remapped,
    )  # fmt: skip
