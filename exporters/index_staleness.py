"""Vector-index staleness: a canary written on the primary, measured until the replica shows it.

Each run is short and never waits for replication: it checks the outstanding canary once. While
the replica does not show it, staleness is `now - written` (so it grows with wall time when
replication stops); once it shows, staleness is `seen - written` and a new canary is written.
The outstanding canary lives in Redis, so an exporter restart keeps measuring from the original
write instead of starting again at zero.

Two modes, from the pair's `replication` setting:
- `redline`: the canary goes through redline's write path (delta log, then primary) and the
  replicator copies it; the probe also publishes the delta log's backlog, freeze flag, replays,
  length and memory — a handful of Redis commands whatever the backlog (XINFO STREAM, XRANGE ...
  COUNT 1 from the checkpoint, MEMORY USAGE, which samples).
- `external`: something else copies primary to replica (Milvus CDC, a vendor's replication). The
  canary is upserted on the primary as a plain row and watched on the replica, where it counts as
  seen once the row read back there has the canary's checksum (vector and every field).

The canary is a row of the user's collection: its key is `__redline_canary__.<region>` (VARCHAR
keys) or a fixed negative number derived from the region (INT64 keys), its vector random, and its
required scalar fields zero values. The collection is described on the first run; one the write
path cannot use fails that run with the collection and field named.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import cast

import numpy as np

from redline.core.redisconn import open_redis
from redline.exporters.probe import MetricDef, Sample
from redline.platform.index import (
    ConflictMap,
    DeltaLog,
    IndexConfig,
    IndexWriter,
    MilvusTarget,
    PrimaryApplyError,
    RowSchema,
    encode_payload,
    parse_stream_id,
    row_checksum,
)
from redline.slo import catalog

CANARY_PREFIX = "__redline_canary__."
_INT_CANARY_BASE = -(2**62)

REDLINE_METRICS = (
    MetricDef.of(catalog.VECTORDB_INDEX_STALENESS_SECONDS),
    MetricDef.of(catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES),
    MetricDef.of(catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS),
    MetricDef.of(catalog.VECTORDB_WRITE_FROZEN),
    MetricDef.of(catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL),
    MetricDef.of(catalog.VECTORDB_DELTA_LOG_ENTRIES),
    MetricDef.of(catalog.VECTORDB_DELTA_LOG_MEMORY_BYTES),
    MetricDef.of(catalog.VECTORDB_ID_CONFLICTS_TOTAL),
)
EXTERNAL_METRICS = (MetricDef.of(catalog.VECTORDB_INDEX_STALENESS_SECONDS),)


def canary_id(schema: RowSchema, region: str) -> str:
    """The canary's key in a collection: a reserved string, or a reserved negative INT64."""
    if schema.pk_type == "int64":
        return str(_INT_CANARY_BASE - zlib.crc32(region.encode()))
    return f"{CANARY_PREFIX}{region}"


class IndexStalenessProbe:
    """Publishes staleness (and, for redline's replication, the delta log's state) of a replica."""

    writes_canaries = True
    """Writes the canary row: with exporter replicas, the canary lease holder's only."""

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
        self.external = config.replication == "external"
        self.metrics = EXTERNAL_METRICS if self.external else REDLINE_METRICS
        self.redis = open_redis(
            redis_url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds
        )
        self.log = DeltaLog(self.redis, config.collection, config.dim)
        self.conflicts = ConflictMap(self.redis, config.collection)
        self.primary = MilvusTarget(config.primary, config.dim, timeout_seconds, config.metric_type)
        self.replica = MilvusTarget(config.replica, config.dim, timeout_seconds, config.metric_type)
        self.writer = IndexWriter(
            self.log, self.primary, config.region, on_primary_error="raise", clock=clock
        )
        self._labels = {"collection": config.collection, "replica": config.replica.name}

    @property
    def canary_id(self) -> str:
        """The canary's key (the primary's schema is described on first use)."""
        return canary_id(self.primary.schema(), self.config.region)

    def close(self) -> None:
        """Close the Redis and Milvus connections."""
        self.primary.close()
        self.replica.close()
        self.redis.close()

    def run(self) -> list[Sample]:
        """Measure once; raises (so the probe reports failure) when Redis or Milvus fail, or
        when a collection cannot be used (named, with the field at fault)."""
        # Both collections are described before anything is written (once; then cached).
        self.primary.schema()
        self.replica.schema()
        labels = self._labels
        if self.external:
            staleness = self._staleness_external()
            return [Sample(catalog.VECTORDB_INDEX_STALENESS_SECONDS.family, staleness, labels)]
        name = self.config.replica.name
        state = self.log.target_state(name)
        info = self.log.info()
        pending, oldest_age = self.log.pending(name, state, info)
        frozen = self.log.freeze_state() is not None
        memory = self.log.memory_bytes()
        staleness = self._staleness(state.checkpoint, state.checkpoint_ms)
        collection = {"collection": labels["collection"]}
        return [
            Sample(catalog.VECTORDB_INDEX_STALENESS_SECONDS.family, staleness, labels),
            Sample(catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES.family, float(pending), labels),
            Sample(
                catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.family,
                oldest_age or 0.0,
                labels,
            ),
            Sample(catalog.VECTORDB_WRITE_FROZEN.family, 1.0 if frozen else 0.0, collection),
            Sample(catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL.family, float(state.replayed), labels),
            Sample(catalog.VECTORDB_DELTA_LOG_ENTRIES.family, float(info.length), collection),
            Sample(catalog.VECTORDB_DELTA_LOG_MEMORY_BYTES.family, float(memory), collection),
            # conflicts of two writing regions, read from the conflict map (zero with one writer)
            *(
                Sample(
                    catalog.VECTORDB_ID_CONFLICTS_TOTAL.family,
                    float(count),
                    {**collection, "resolution": resolution},
                )
                for resolution, count in self.conflicts.counts().items()
            ),
        ]

    # redline's replication -------------------------------------------------------------------

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
        canary = self.canary_id
        row = self.replica.fetch([canary]).get(canary)
        if row is None or row.version.ts_ms < ts_ms:
            return max(0.0, now - written)
        seen = now
        # The replicator checkpoints right after applying; when its checkpoint covers the canary,
        # the canary was visible no later than that checkpoint's time, a tighter bound than now.
        if checkpoint_ms is not None and parse_stream_id(checkpoint) >= parse_stream_id(stream_id):
            seen = min(now, checkpoint_ms / 1000.0)
        self._write_canary(key, previous_ts_ms=ts_ms)
        return max(0.0, seen - written)

    def _canary_row(self, ts_ms: int) -> tuple[np.ndarray, dict[str, object]]:
        rng = np.random.default_rng(ts_ms)
        vector = rng.standard_normal(self.config.dim).astype(np.float32)
        return vector, self.primary.schema().filler()

    def _write_canary(self, key: str, previous_ts_ms: int) -> float:
        """Write a new canary (newer than the last) through the writer; returns its write time."""
        ts_ms = max(int(self.clock() * 1000), previous_ts_ms + 1)
        vector, fields = self._canary_row(ts_ms)
        try:
            acks = self.writer.write([("upsert", self.canary_id, vector, fields)], ts_ms=ts_ms)
        except PrimaryApplyError as exc:
            # The canary is in the delta log all the same: measure the replica against it.
            self._remember(key, exc.acks[0].stream_id, ts_ms)
            raise
        self._remember(key, acks[0].stream_id, ts_ms)
        return ts_ms / 1000.0

    def _remember(self, key: str, stream_id: str, ts_ms: int, checksum: str = "") -> None:
        mapping = {"stream_id": stream_id, "ts_ms": str(ts_ms), "checksum": checksum}
        self.redis.hset(key, mapping=mapping)  # type: ignore[arg-type]

    # external replication --------------------------------------------------------------------

    def _external_key(self) -> str:
        return f"{self.log.canary_key(self.config.replica.name)}:external"

    def _staleness_external(self) -> float:
        key = self._external_key()
        raw = cast(dict[bytes, bytes], self.redis.hgetall(key))
        if not raw or not raw.get(b"checksum"):
            written = self._write_external_canary(key, previous_ts_ms=0)
            return max(0.0, self.clock() - written)
        ts_ms = int(raw[b"ts_ms"])
        now = self.clock()
        canary = self.canary_id
        row = self.replica.fetch([canary], with_vectors=True).get(canary)
        if row is None or row.vector is None:
            return max(0.0, now - ts_ms / 1000.0)
        if row_checksum(row.vector, row.payload) != raw[b"checksum"].decode():
            return max(0.0, now - ts_ms / 1000.0)  # an older canary, or not copied whole yet
        self._write_external_canary(key, previous_ts_ms=ts_ms)
        return max(0.0, now - ts_ms / 1000.0)

    def _write_external_canary(self, key: str, previous_ts_ms: int) -> float:
        """Upsert a new canary row on the primary; remembered only once the primary took it."""
        ts_ms = max(int(self.clock() * 1000), previous_ts_ms + 1)
        vector, fields = self._canary_row(ts_ms)
        schema = self.primary.schema()
        payload = schema.normalize(fields, self.canary_id)
        self.primary.upsert_plain([schema.plain_row(self.canary_id, vector, payload)])
        self._remember(key, "", ts_ms, row_checksum(vector, encode_payload(payload)))
        return ts_ms / 1000.0
