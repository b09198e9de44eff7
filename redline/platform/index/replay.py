"""Replay of the delta log onto a target: batches from its checkpoint with the checkpoint
advanced after each, then flush, compaction and verification of the whole replayed range; a
re-run after a crash resumes and verifies the interrupted range."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from redline.platform.index.apply import BatchResult, DeltaApplier, wait_for_batch
from redline.platform.index.conflicts import DEFAULT_SALT
from redline.platform.index.deltalog import DeltaLog
from redline.platform.index.entries import Entry, parse_stream_id
from redline.platform.index.milvus import MilvusTarget
from redline.platform.index.verify import (
    LastWrite,
    VerifyReport,
    note_last_writes,
    verify_last_writes,
)


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did: entries applied, conflicts, flush/compaction and the verification."""

    collection: str
    target: str
    after: str
    until: str
    resumed: bool
    entries: int
    upserts: int
    deletes: int
    conflicts: int
    superseded: int
    batches: int
    flushed: bool
    compacted: bool
    verify: VerifyReport
    apply_seconds: float
    duration_seconds: float

    @property
    def ok(self) -> bool:
        """True when verification found every id as its last write left it."""
        return self.verify.ok

    def summary(self) -> dict[str, object]:
        """A JSON-ready summary (for the audit trail and the CLI)."""
        v = self.verify
        return {
            "collection": self.collection,
            "target": self.target,
            "range": [self.after, self.until],
            "resumed": self.resumed,
            "applied": self.entries,
            "upserts": self.upserts,
            "deletes": self.deletes,
            "conflicts": self.conflicts,
            "superseded": self.superseded,
            "batches": self.batches,
            "flushed": self.flushed,
            "compacted": self.compacted,
            "verified": v.verified,
            "verified_superseded": v.superseded,
            "verified_remapped": v.remapped,
            "mismatches": v.mismatches,
            "missing": v.missing,
            "unexpected": v.unexpected,
            "stale": v.stale,
            "checksum_mismatches": v.checksum_mismatches,
            "mismatched_ids": list(v.mismatched_ids),
            "apply_seconds": round(self.apply_seconds, 4),
            "duration_seconds": round(self.duration_seconds, 4),
            "ok": self.ok,
        }


def replay_delta_log(
    deltalog: DeltaLog,
    target: MilvusTarget,
    *,
    batch_size: int = 1000,
    until: str | None = None,
    lease_ttl_seconds: float = 15.0,
    lease_wait_seconds: float = 60.0,
    max_rows_per_second: float | None = None,
    compact: bool = True,
    on_batch: Callable[[BatchResult], None] | None = None,
    salt: str = DEFAULT_SALT,
    conflict_window_seconds: float | None = None,
) -> ReplayReport:
    """Apply the delta log to `target` from its checkpoint up to `until` (default: the last entry
    now), batch by batch with the checkpoint advanced after each, then flush, compact and verify
    every id in the replayed range. Re-running after a crash resumes and verifies the whole range
    of the interrupted replay; the range record is dropped once verification passes. `salt`
    and the conflict window: those of the collection's writers (two writing regions)."""
    started = time.monotonic()
    name = target.name
    after, end, resumed = _replay_range(deltalog, name, until)
    deltalog.register_target(name)  # before the range is recorded: a trim must see it
    deltalog.set_replay_range(name, after, end)
    applier = DeltaApplier(
        deltalog, target, lease_ttl_seconds, replay=True, salt=salt,
        conflict_window_seconds=conflict_window_seconds,
    )  # fmt: skip
    done = _Applied(covered=after)
    _apply_batches(
        deltalog, applier, done, end, batch_size, lease_wait_seconds, max_rows_per_second, on_batch
    )
    if parse_stream_id(done.covered) < parse_stream_id(end):
        done.gaps.append((done.covered, end))
    apply_seconds = time.monotonic() - started
    target.flush()
    compacted = target.compact() if compact else False
    # the range's last write per id: this run's batches plus whatever others applied in between
    in_range = done.entries
    for gap_after, gap_until in done.gaps:
        in_range += note_last_writes(done.expected, deltalog.iter_range(gap_after, gap_until))
    report = verify_last_writes(
        deltalog, target, done.expected, after, end, in_range, salt=salt,
        conflict_window_seconds=conflict_window_seconds,
    )  # fmt: skip
    if report.ok:
        deltalog.clear_replay_range(name)
    return ReplayReport(
        deltalog.collection, name, after, end, resumed, done.entries, done.upserts, done.deletes,
        done.conflicts, done.superseded, done.batches, True, compacted, report, apply_seconds,
        time.monotonic() - started,
    )  # fmt: skip


def _replay_range(deltalog: DeltaLog, name: str, until: str | None) -> tuple[str, str, bool]:
    """The range to replay, (after, end], and whether it resumes an interrupted replay (whose
    whole recorded range is replayed and verified again)."""
    checkpoint = deltalog.target_state(name).checkpoint
    end = until or deltalog.last_id()
    record = deltalog.replay_range(name)
    after = checkpoint
    if record is not None:
        after = record[0]
        if parse_stream_id(record[1]) > parse_stream_id(end):
            end = record[1]
    if parse_stream_id(end) < parse_stream_id(after):
        end = after
    return after, end, record is not None


@dataclass
class _Applied:
    """What the batches of a replay applied, and the last write per id they left."""

    covered: str  # (after, covered] is folded into `expected` or listed in `gaps`
    entries: int = 0
    upserts: int = 0
    deletes: int = 0
    conflicts: int = 0
    superseded: int = 0
    batches: int = 0
    expected: dict[str, LastWrite] = field(default_factory=dict)
    gaps: list[tuple[str, str]] = field(default_factory=list)

    def add(self, result: BatchResult) -> None:
        """Count one applied batch."""
        if result.start != self.covered:
            # The entries between were applied by an earlier or another applier.
            self.gaps.append((self.covered, result.start))
        self.covered = result.checkpoint
        note_last_writes(self.expected, result.batch)
        self.batches += 1
        self.entries += result.entries
        self.upserts += result.upserts
        self.deletes += result.deletes
        self.conflicts += result.conflicts
        self.superseded += result.superseded


def _apply_batches(
    deltalog: DeltaLog,
    applier: DeltaApplier,
    done: _Applied,
    end: str,
    batch_size: int,
    lease_wait_seconds: float,
    max_rows_per_second: float | None,
    on_batch: Callable[[BatchResult], None] | None,
) -> None:
    """Apply batches up to `end`, each read from Redis while the one before is written."""
    pending: tuple[str, Future[list[Entry]]] | None = None
    with ThreadPoolExecutor(max_workers=1) as reader:
        while True:
            batch_started = time.monotonic()
            prefetched = (pending[0], pending[1].result()) if pending is not None else None
            pending = None
            if prefetched is not None and prefetched[1]:
                # read the next batch from Redis while this one is written to Milvus
                nxt = prefetched[1][-1].stream_id
                pending = (nxt, reader.submit(deltalog.read_after, nxt, batch_size, end))
            result = wait_for_batch(applier, batch_size, end, lease_wait_seconds, prefetched)
            if result.entries == 0:
                break
            if pending is None or pending[0] != result.checkpoint:
                nxt = result.checkpoint
                pending = (nxt, reader.submit(deltalog.read_after, nxt, batch_size, end))
            done.add(result)
            if on_batch is not None:
                on_batch(result)
            if max_rows_per_second:
                pause = result.entries / max_rows_per_second - (time.monotonic() - batch_started)
                if pause > 0:
                    time.sleep(pause)
        if pending is not None:
            pending[1].cancel()
