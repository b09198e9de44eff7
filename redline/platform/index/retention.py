"""Keeping the delta log and its tombstones bounded.

The log must keep every entry some copy still needs: those after each replica's checkpoint, after
the freeze point (the primary's catch-up) and after the start of an unfinished replay. The trim
point is the oldest of those, minus a retention window (history a copy restored from a backup can
still replay); `XTRIM MINID` removes what is older, in chunks of whole stream nodes so Redis
answers other clients in between. The point is recorded before each chunk, so an applier whose
checkpoint is behind it (a copy that was not registered) stops instead of skipping entries.

Killing the trim at any moment is safe: every chunk removes only entries older than a point
nobody needs, and the next trim goes on from what is left. Tombstones (the deletes a target
applied) older than the same point are pruned with it: every copy is past them.

For a log of one of two writing regions (`DeltaLog(..., origin=region)`) the same pass prunes
the conflict detector's state (see `conflicts`, *Pruning heads*): the per-id heads of every copy
the log is applied to, and the origin region's recent-writes cache. The bound: a head is dropped
only once it is *settled* — older, by the conflict window plus the clock skew, than the first
entry every region's log still holds and than now — so no entry any copy may still apply (pending,
replayed or yet to be written) can fall within the window of it, and only if dropping it leaves
the rows its id calls for unchanged. The window is the replication window (by default the log's
retention): writes of an id from two regions further apart than it are not a conflict, so a
head is needed to detect conflicts for at most the window after the last entry that could still
meet it. The recent-writes cache is pruned at the same point: what is older was applied, and its
conflicts recorded, by every copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redline.platform.index.conflicts import ConflictMap
from redline.platform.index.deltalog import DeltaLog
from redline.platform.index.entries import ZERO_ID, format_stream_id, parse_stream_id

MIN_CHUNK = 100
"""Smallest XTRIM LIMIT: a stream node holds up to 100 entries by default, and an approximate
trim only removes whole nodes."""


def build_trim_point(needed: Sequence[str], retention_ms: int) -> str | None:
    """The MINID to trim at: the oldest needed id, `retention_ms` earlier (None: no copy is
    registered, so nothing is known to be safe to remove)."""
    if not needed:
        return None
    oldest = min(parse_stream_id(i) for i in needed)
    if retention_ms <= 0:
        return format_stream_id(oldest)
    ms = oldest[0] - retention_ms
    return format_stream_id((ms, 0)) if ms > 0 else ZERO_ID


@dataclass(frozen=True)
class TrimReport:
    """One trim: the point, entries removed, the log's length after, tombstones pruned; for a
    log of two writing regions, the heads and recent writes pruned and the settled bound."""

    point: str | None
    removed: int
    length: int
    tombstones_pruned: int
    chunks: int
    seconds: float
    heads_pruned: int = 0
    """Ids whose heads were dropped or reduced (every copy the log is applied to)."""
    recent_pruned: int = 0
    settled_before_ms: int | None = None

    def summary(self) -> dict[str, object]:
        """A JSON-ready summary."""
        return {
            "point": self.point,
            "removed": self.removed,
            "length": self.length,
            "tombstones_pruned": self.tombstones_pruned,
            "heads_pruned": self.heads_pruned,
            "recent_pruned": self.recent_pruned,
            "settled_before_ms": self.settled_before_ms,
            "chunks": self.chunks,
            "seconds": round(self.seconds, 4),
        }


def trim_delta_log(
    log: DeltaLog,
    retention_seconds: float,
    chunk: int = 10_000,
    pause_seconds: float = 0.0,
    max_chunks: int | None = None,
    prune: bool = True,
    on_chunk: Callable[[str, int], None] | None = None,
    conflicts: ConflictMap | None = None,
) -> TrimReport:
    """Trim the log at the point every copy allows (recomputed before each chunk) and prune the
    tombstones before it. `pause_seconds` between chunks keeps Redis responsive on a long
    backlog; `max_chunks` bounds one call (the replicator's periodic step). A log of two
    writing regions also has its copies' settled heads and its region's settled recent writes
    pruned, with `conflicts` (salt and window of the collection; default: no window, so only
    deletes settle)."""
    started = time.monotonic()
    retention_ms = int(retention_seconds * 1000)
    limit = max(MIN_CHUNK, chunk)
    removed = chunks = 0
    point: str | None = None
    while max_chunks is None or chunks < max_chunks:
        point = build_trim_point(log.trim_needs().ids(), retention_ms)
        if point is None or point == ZERO_ID:
            break
        log.record_trim(point)
        gone = log.trim_chunk(point, limit)
        chunks += 1
        removed += gone
        if on_chunk is not None:
            on_chunk(point, gone)
        if gone == 0:
            break
        if pause_seconds > 0:
            time.sleep(pause_seconds)
    pruned = 0
    if prune and point is not None and point != ZERO_ID:
        for target in log.targets():
            pruned += log.prune_tombstones(target, point)
    heads = recent = 0
    settled: int | None = None
    if prune and log.origin is not None:
        conflicts = conflicts or ConflictMap(log.redis, log.collection)
        conflicts.agree()  # pruning with another window than the writers' would lose rows
        settled = conflicts.settled_before_ms()
        for target in log.targets():
            report = conflicts.prune_heads(target, settled)
            heads += report.dropped + report.reduced
        recent = conflicts.prune_recent(log.origin, settled)
    return TrimReport(
        point, removed, log.info().length, pruned, chunks, time.monotonic() - started, heads,
        recent, settled,
    )  # fmt: skip
