"""The replicator: applies the delta log to a replica continuously from its durable checkpoint,
retrying with backoff; pausable through a flag in Redis. It registers its replica (so no trim
removes what the replica has not applied) and, given a retention, trims the log periodically
(for a log of two writing regions, pruning its copy's settled conflict heads with it)."""

from __future__ import annotations

import logging
import threading
import time

import redis
from pymilvus import MilvusException

from redline.platform.index.apply import BatchResult, DeltaApplier
from redline.platform.index.conflicts import DEFAULT_SALT
from redline.platform.index.deltalog import DeltaLog
from redline.platform.index.errors import DeltaLogError
from redline.platform.index.milvus import MilvusTarget
from redline.platform.index.retention import TrimReport, trim_delta_log

log = logging.getLogger(__name__)

TRIM_MAX_CHUNKS = 100
"""Chunks one trim step removes at most before replication goes on (the rest: next step)."""


class Replicator:
    """Applies the delta log to a replica continuously; pausable through a flag in Redis."""

    def __init__(
        self,
        deltalog: DeltaLog,
        replica: MilvusTarget,
        batch_size: int = 500,
        poll_interval_seconds: float = 0.1,
        lease_ttl_seconds: float = 15.0,
        max_backoff_seconds: float = 5.0,
        retention_seconds: float | None = None,
        trim_interval_seconds: float = 60.0,
        trim_chunk: int = 10_000,
        salt: str = DEFAULT_SALT,
        conflict_window_seconds: float | None = None,
    ) -> None:
        self.log = deltalog
        self.replica = replica
        self.batch_size = batch_size
        self.poll_interval_seconds = poll_interval_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.retention_seconds = retention_seconds
        self.trim_interval_seconds = trim_interval_seconds
        self.trim_chunk = trim_chunk
        self.applier = DeltaApplier(
            deltalog, replica, lease_ttl_seconds, salt=salt,
            conflict_window_seconds=conflict_window_seconds,
        )  # fmt: skip
        self.last_trim: TrimReport | None = None
        self._registered = False
        self._next_trim = 0.0

    def step(self) -> BatchResult | None:
        """Apply one batch unless paused (None while paused); trim when the time has come."""
        if not self._registered:
            self.log.register_target(self.replica.name)
            self._registered = True
        self.maybe_trim()
        if self.log.is_paused(self.replica.name):
            return None
        return self.applier.apply_batch(self.batch_size)

    def maybe_trim(self, now: float | None = None) -> TrimReport | None:
        """Trim the log if a retention is set and the interval passed (or the last trim was cut
        short by its chunk bound)."""
        if self.retention_seconds is None:
            return None
        now = time.monotonic() if now is None else now
        if now < self._next_trim:
            return None
        report = trim_delta_log(
            self.log, self.retention_seconds, self.trim_chunk, max_chunks=TRIM_MAX_CHUNKS,
            conflicts=self.applier.conflicts,
        )  # fmt: skip
        self.last_trim = report
        unfinished = report.chunks >= TRIM_MAX_CHUNKS
        self._next_trim = now + (0.0 if unfinished else self.trim_interval_seconds)
        if report.removed or report.tombstones_pruned or report.heads_pruned:
            log.info(
                "trimmed %s at %s: %d entries (%d left), %d tombstones, %d ids' heads",
                self.log.collection,
                report.point,
                report.removed,
                report.length,
                report.tombstones_pruned,
                report.heads_pruned,
            )
        return report

    def run(self, stop: threading.Event) -> None:
        """Replicate until `stop` is set; failures are logged and retried with backoff."""
        backoff = self.poll_interval_seconds
        while not stop.is_set():
            try:
                result = self.step()
            except (redis.RedisError, MilvusException, OSError, DeltaLogError) as exc:
                log.warning(
                    "replicator %s/%s: %s: %s",
                    self.log.collection,
                    self.replica.name,
                    type(exc).__name__,
                    exc,
                )
                stop.wait(backoff)
                backoff = min(self.max_backoff_seconds, backoff * 2)
                continue
            backoff = self.poll_interval_seconds
            if result is None or result.entries == 0:
                stop.wait(self.poll_interval_seconds)
