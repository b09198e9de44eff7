"""Vector-index staleness: a canary written on the primary, measured until the replica shows it.

Each run is short and never waits for replication: it checks the outstanding canary once. While
the replica does not show it, staleness is `now - written` (so it grows with wall time when
replication stops); once it shows, staleness is `seen - written` and a new canary is written.
The outstanding canary lives in Redis, so an exporter restart keeps measuring from the original
write instead of starting again at zero. The delta-log gauges cost two Redis commands whatever
the backlog (XINFO STREAM, XRANGE ... COUNT 1 from the checkpoint).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import numpy as np
import redis

from redline.exporters.probe import MetricDef, Sample
from redline.platform.index import (
    DeltaLog,
    IndexConfig,
    IndexWriter,
    MilvusTarget,
    PrimaryApplyError,
    parse_stream_id,
)
from redline.slo import catalog

CANARY_PREFIX = "__redline_canary__."


class IndexStalenessProbe:
    """Publishes staleness, delta-log backlog, freeze state and replays of one replica."""

    metrics = (
        MetricDef.of(catalog.VECTORDB_INDEX_STALENESS_SECONDS),
        MetricDef.of(catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES),
        MetricDef.of(catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS),
        MetricDef.of(catalog.VECTORDB_WRITE_FROZEN),
        MetricDef.of(catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL),
    )

    def __init__(
        self,
        config: IndexConfig,
        redis_url: str,
        interval_seconds: float = 5.0,
        timeout_seconds: float = 2.0,
        name: str = "index_staleness",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.interval_seconds = interval_seconds
        self.config = config
        self.clock = clock
        self.redis = redis.Redis.from_url(
            redis_url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds
        )
        self.log = DeltaLog(self.redis, config.collection, config.dim)
        self.primary = MilvusTarget(config.primary, config.dim, timeout_seconds, config.metric_type)
        self.replica = MilvusTarget(config.replica, config.dim, timeout_seconds, config.metric_type)
        self.writer = IndexWriter(
            self.log, self.primary, config.region, on_primary_error="raise", clock=clock
        )
        self.canary_id = f"{CANARY_PREFIX}{config.region}"
        self._labels = {"collection": config.collection, "replica": config.replica.name}

    def close(self) -> None:
        """Close the Redis and Milvus connections."""
        self.primary.close()
        self.replica.close()
        self.redis.close()

    def run(self) -> list[Sample]:
        """Measure once; raises (so the probe reports failure) when Redis or Milvus fail."""
        name = self.config.replica.name
        state = self.log.target_state(name)
        pending, oldest_age = self.log.pending(name, state)
        frozen = self.log.freeze_state() is not None
        staleness = self._staleness(state.checkpoint, state.checkpoint_ms)
        labels = self._labels
        return [
            Sample(catalog.VECTORDB_INDEX_STALENESS_SECONDS.family, staleness, labels),
            Sample(catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES.family, float(pending), labels),
            Sample(
                catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.family,
                oldest_age or 0.0,
                labels,
            ),
            Sample(
                catalog.VECTORDB_WRITE_FROZEN.family,
                1.0 if frozen else 0.0,
                {"collection": labels["collection"]},
            ),
            Sample(catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL.family, float(state.replayed), labels),
        ]

    def _staleness(self, checkpoint: str, checkpoint_ms: int | None) -> float:
        key = self.log.canary_key(self.config.replica.name)
        raw = cast(dict[bytes, bytes], self.redis.hgetall(key))
        now = self.clock()
        if not raw:
            written = self._write_canary(key, previous_ts_ms=0)
            return max(0.0, self.clock() - written)
        ts_ms = int(raw[b"ts_ms"])
        stream_id = raw[b"stream_id"].decode()
        written = ts_ms / 1000.0
        row = self.replica.fetch([self.canary_id]).get(self.canary_id)
        if row is None or row.version.ts_ms < ts_ms:
            return max(0.0, now - written)
        seen = now
        # The replicator checkpoints right after applying; when its checkpoint covers the canary,
        # the canary was visible no later than that checkpoint's time, a tighter bound than now.
        if checkpoint_ms is not None and parse_stream_id(checkpoint) >= parse_stream_id(stream_id):
            seen = min(now, checkpoint_ms / 1000.0)
        self._write_canary(key, previous_ts_ms=ts_ms)
        return max(0.0, seen - written)

    def _write_canary(self, key: str, previous_ts_ms: int) -> float:
        """Write a new canary (newer than the last) through the writer; returns its write time."""
        ts_ms = max(int(self.clock() * 1000), previous_ts_ms + 1)
        rng = np.random.default_rng(ts_ms)
        vector = rng.standard_normal(self.config.dim).astype(np.float32)
        try:
            acks = self.writer.write([("upsert", self.canary_id, vector)], ts_ms=ts_ms)
        except PrimaryApplyError as exc:
            # The canary is in the delta log all the same: measure the replica against it.
            self._remember(key, exc.acks[0].stream_id, ts_ms)
            raise
        self._remember(key, acks[0].stream_id, ts_ms)
        return ts_ms / 1000.0

    def _remember(self, key: str, stream_id: str, ts_ms: int) -> None:
        self.redis.hset(key, mapping={"stream_id": stream_id, "ts_ms": str(ts_ms)})
