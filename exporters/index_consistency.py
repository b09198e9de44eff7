"""Consistency level of the vector index's collections: the §1 consistency check.

The staleness canary (`index_staleness`) reads the replica with Strong consistency, so it measures
replication only. A search that runs at its collection's default consistency level may read
staler data than that: Milvus lets each collection choose. This probe describes the primary's
and the replica's collection (`describe_collection`, through `connect_milvus`) on each run and
publishes, labelled by logical collection and copy (`target`):

- `vectordb_index_consistency_level{level}` = 1: the collection's default level;
- `vectordb_index_consistency_staleness_bound_seconds`: how stale a read at that level may be.

Bounds by level (Milvus' consistency documentation):

- `Strong`: 0 (reads wait for every write before them);
- `Bounded`: the servers' graceful time, `common.gracefulTime` of milvus.yaml (5000 ms by
  default). Milvus has no per-collection setting for it, so the probe cannot read it: it is the
  setting `bounded_staleness_seconds` (default `MILVUS_GRACEFUL_TIME_SECONDS`), to be set to the
  servers' value when they change it;
- `Session`: +Inf. A client reads its own writes, but the searchers are not the writer: another
  client's writes come with no bound;
- `Eventually`: +Inf (no bound at all);
- `Customized`, or a level this module does not know: +Inf (the server promises nothing).

`IndexConsistencyWeak` (`redline.rules.families.index_consistency`) fires while a bound is over
the spec's red line (`red_lines.index_consistency.max_staleness_seconds`, 12 s). A search may
still ask for its own level (`consistency_level=` of the request), which no probe can see.

The first run, at exporter start-up, logs each collection's level: a WARNING naming the
collection and its level when its bound is over the red line, INFO otherwise; later runs log
again only when a level changes. A collection that cannot be described (Milvus down, no such
collection) fails the run, naming it: `redline_probe_success{probe="index_consistency"}` 0 and no
gauges (unknown, not zero), as with every probe.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pymilvus import MilvusClient

from redline.exporters.probe import MetricDef, Sample
from redline.platform.index import IndexConfig, TargetSpec, connect_milvus
from redline.slo import catalog

log = logging.getLogger(__name__)

LEVELS = ("Strong", "Session", "Bounded", "Eventually", "Customized")
"""Milvus' consistency levels, indexed by their number (`ConsistencyLevel` of common.proto)."""
MILVUS_GRACEFUL_TIME_SECONDS = 5.0
"""Milvus' default `common.gracefulTime` (5000 ms, milvus.yaml): how stale a Bounded read is."""
UNKNOWN = "Unknown"
"""The level label of a level this module does not know."""

METRICS = (
    MetricDef.of(catalog.VECTORDB_INDEX_CONSISTENCY_LEVEL),
    MetricDef.of(catalog.VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS),
)

Connect = Callable[[TargetSpec, float], MilvusClient]


class IndexConsistencyError(Exception):
    """Some collection could not be described; the message names each and why."""


def level_name(raw: object) -> str:
    """The level's name from what `describe_collection` returns: its number or its name
    (any case); `UNKNOWN` for anything else."""
    if isinstance(raw, bool):
        return UNKNOWN
    if isinstance(raw, int):
        return LEVELS[raw] if 0 <= raw < len(LEVELS) else UNKNOWN
    if isinstance(raw, str):
        by_lower = {level.lower(): level for level in LEVELS}
        text = raw.strip()
        if text.isdigit():
            return level_name(int(text))
        return by_lower.get(text.lower(), UNKNOWN)
    return UNKNOWN


def staleness_bound(level: str, bounded_seconds: float = MILVUS_GRACEFUL_TIME_SECONDS) -> float:
    """How stale a read at `level` may be (seconds; +Inf without a bound)."""
    if level == "Strong":
        return 0.0
    if level == "Bounded":
        return bounded_seconds
    return math.inf


@dataclass(frozen=True)
class Reading:
    """One copy's collection: its default level and the staleness bound that gives."""

    target: str
    collection: str
    level: str
    bound_seconds: float


def read_level(described: Mapping[str, object]) -> str:
    """The level of a `describe_collection` answer (its number, else its name)."""
    raw = described.get("consistency_level", described.get("consistency_level_name"))
    return level_name(raw)


def _connect(target: TargetSpec, timeout_seconds: float) -> MilvusClient:
    return connect_milvus(
        target.uri, target.token, timeout_seconds, target.keepalive_seconds, target.idle_pings
    )


class IndexConsistencyProbe:
    """Publishes the consistency level (and its staleness bound) of an index's two copies."""

    metrics = METRICS
    writes_canaries = False
    """Only reads: every exporter replica runs it."""

    def __init__(
        self,
        config: IndexConfig,
        red_line_seconds: float,
        bounded_staleness_seconds: float = MILVUS_GRACEFUL_TIME_SECONDS,
        interval_seconds: float = 60.0,
        timeout_seconds: float = 2.0,
        name: str = "index_consistency",
        connect: Connect = _connect,
    ) -> None:
        self.name = name
        self.interval_seconds = interval_seconds
        self.config = config
        self.red_line_seconds = red_line_seconds
        self.bounded_staleness_seconds = bounded_staleness_seconds
        self.timeout_seconds = timeout_seconds
        self.targets = (config.primary, config.replica)
        self._connect = connect
        self._clients: dict[str, MilvusClient] = {}
        self._logged: dict[str, str] = {}

    def close(self) -> None:
        """Release the Milvus connections."""
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()

    def read(self, target: TargetSpec) -> Reading:
        """Describe one copy's collection now (raises what pymilvus raises)."""
        client = self._clients.get(target.name)
        if client is None:
            client = self._connect(target, self.timeout_seconds)
            self._clients[target.name] = client
        described = client.describe_collection(target.collection, timeout=self.timeout_seconds)
        level = read_level(described)
        bound = staleness_bound(level, self.bounded_staleness_seconds)
        return Reading(target.name, target.collection, level, bound)

    def run(self) -> list[Sample]:
        """Read every copy's level; IndexConsistencyError naming each copy that failed."""
        readings: list[Reading] = []
        errors: list[str] = []
        for target in self.targets:
            try:
                readings.append(self.read(target))
            except Exception as exc:  # each copy is reported, the others still logged
                errors.append(
                    f"{target.name} (collection {target.collection}): {type(exc).__name__}: {exc}"
                )
        for reading in readings:
            self._log(reading)
        if errors:
            raise IndexConsistencyError("cannot describe " + "; ".join(errors))
        return [sample for reading in readings for sample in self.samples(reading)]

    def samples(self, reading: Reading) -> list[Sample]:
        """The level and bound series of one reading."""
        labels = {
            catalog.LABEL_COLLECTION: self.config.collection,
            catalog.LABEL_TARGET: reading.target,
        }
        return [
            Sample(
                catalog.VECTORDB_INDEX_CONSISTENCY_LEVEL.family,
                1.0,
                {**labels, catalog.LABEL_LEVEL: reading.level},
            ),
            Sample(
                catalog.VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS.family,
                reading.bound_seconds,
                labels,
            ),
        ]

    def weak(self, reading: Reading) -> bool:
        """True when reads at the collection's level may be staler than the red line."""
        return reading.bound_seconds > self.red_line_seconds

    def _log(self, reading: Reading) -> None:
        """Log a copy's level the first time it is read and whenever it changes."""
        if self._logged.get(reading.target) == reading.level:
            return
        self._logged[reading.target] = reading.level
        bound = "no bound" if math.isinf(reading.bound_seconds) else f"{reading.bound_seconds:g} s"
        if self.weak(reading):
            log.warning(
                "index consistency: collection %s (%s of %s) is %s: its reads may be staler "
                "than the %g s red line (staleness bound: %s); make it Strong, or Bounded with a "
                "graceful time within the red line",
                reading.collection,
                reading.target,
                self.config.collection,
                reading.level,
                self.red_line_seconds,
                bound,
            )
        else:
            log.info(
                "index consistency: collection %s (%s of %s) is %s (staleness bound: %s)",
                reading.collection,
                reading.target,
                self.config.collection,
                reading.level,
                bound,
            )
