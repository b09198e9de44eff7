"""Verification of a range of the delta log against a target: every id's last write is on it
(upserts with a checksum recomputed from the row read back — vector, scalar and dynamic fields —
that matches the write's, deletes absent)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

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
) -> VerifyReport:
    """Check every id written in (after, until]: its last write by (ts_ms, region) is on the
    target (upsert: present with that version and a checksum recomputed from the row read back
    — every field — that matches; delete: absent). Ids the target holds in a newer version
    count as superseded, not wrong."""
    expected: dict[str, LastWrite] = {}
    entries = note_last_writes(expected, deltalog.iter_range(after, until))
    return verify_last_writes(
        deltalog, target, expected, after, until, entries, sample_limit, workers
    )


def verify_last_writes(
    deltalog: DeltaLog,
    target: MilvusTarget,
    expected: Mapping[str, LastWrite],
    after: str,
    until: str,
    entries: int,
    sample_limit: int = 20,
    workers: int = 2,
) -> VerifyReport:
    """Check the folded last writes of (after, until] (`entries` of them) against the target."""
    ids = list(expected)
    chunks = [ids[i : i + FETCH_CHUNK] for i in range(0, len(ids), FETCH_CHUNK)]
    rows: dict[str, RowState] = {}
    # Reading vectors back is most of a verification; overlap the round trips with decoding.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for found in pool.map(partial(target.fetch, with_vectors=True), chunks):
            rows.update(found)
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
