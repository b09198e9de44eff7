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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    """One trim: the point, entries removed, the log's length after, tombstones pruned."""

    point: str | None
    removed: int
    length: int
    tombstones_pruned: int
    chunks: int
    seconds: float

    def summary(self) -> dict[str, object]:
        """A JSON-ready summary."""
        return {
            "point": self.point,
            "removed": self.removed,
            "length": self.length,
            "tombstones_pruned": self.tombstones_pruned,
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
) -> TrimReport:
    """Trim the log at the point every copy allows (recomputed before each chunk) and prune the
    tombstones before it. `pause_seconds` between chunks keeps Redis responsive on a long
    backlog; `max_chunks` bounds one call (the replicator's periodic step)."""
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
    return TrimReport(point, removed, log.info().length, pruned, chunks, time.monotonic() - started)
