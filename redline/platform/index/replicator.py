"""The replicator: applies the delta log to a replica continuously from its durable checkpoint,
retrying with backoff; pausable through a flag in Redis."""

from __future__ import annotations

import logging
import threading

import redis
from pymilvus import MilvusException

from redline.platform.index.apply import BatchResult, DeltaApplier
from redline.platform.index.deltalog import DeltaLog
from redline.platform.index.errors import DeltaLogError
from redline.platform.index.milvus import MilvusTarget

log = logging.getLogger(__name__)


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
    ) -> None:
        self.log = deltalog
        self.replica = replica
        self.batch_size = batch_size
        self.poll_interval_seconds = poll_interval_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.applier = DeltaApplier(deltalog, replica, lease_ttl_seconds)

    def step(self) -> BatchResult | None:
        """Apply one batch unless paused (None while paused)."""
        if self.log.is_paused(self.replica.name):
            return None
        return self.applier.apply_batch(self.batch_size)

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
