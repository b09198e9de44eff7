"""Staleness of a pair replicated by something else (`replication: external`): two Milvus Lite
files, a user collection without dynamic fields or version columns, and the test itself playing
the external replicator (it copies the primary's canary row to the replica after a delay). The
probe writes the canary on the primary only, sees staleness grow while the copy is late, and
reports about the delay once the copy lands; redline writes no delta log."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from pymilvus import DataType, MilvusClient

from redline.exporters.index_staleness import EXTERNAL_METRICS, IndexStalenessProbe
from redline.exporters.probe import ProbeCache
from redline.exporters.settings import IndexStalenessSection
from redline.platform.index import connect_milvus
from redline.slo import catalog

DIM = 8
DELAY = 2.0


def _create(client: MilvusClient, name: str) -> None:
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("chunk_id", DataType.INT64, is_primary=True)
    schema.add_field("dense", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("body", DataType.VARCHAR, max_length=256)
    schema.add_field("page", DataType.INT32)
    index = client.prepare_index_params()
    index.add_index("dense", index_type="AUTOINDEX", metric_type="COSINE")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")


class LateCopier:
    """The external replicator: copies every primary row to the replica `delay` s after it
    first sees that version of it."""

    def __init__(self, primary: MilvusClient, replica: MilvusClient, delay: float) -> None:
        self.primary, self.replica, self.delay = primary, replica, delay
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.copies = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seen: dict[Any, tuple[float, bytes]] = {}
        while not self.stop.wait(0.1):
            if self.paused.is_set():
                continue
            rows = self.primary.query("docs", filter="chunk_id < 0", output_fields=["*"])
            now = time.monotonic()
            for row in rows:
                stamp = np.asarray(row["dense"], dtype=np.float32).tobytes()
                first = seen.get(row["chunk_id"])
                if first is None or first[1] != stamp:
                    seen[row["chunk_id"]] = (now, stamp)
                elif now - first[0] >= self.delay and first[0] > 0:
                    self.replica.upsert("docs", [row])
                    seen[row["chunk_id"]] = (0.0, stamp)  # copied; wait for the next version
                    self.copies += 1


@pytest.fixture()
def pair(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two Milvus Lite files holding the same user collection."""
    uris = str(tmp_path / "primary.db"), str(tmp_path / "replica.db")
    for uri in uris:
        client = connect_milvus(uri)
        _create(client, "docs")
        client.close()
    yield uris


def test_external_mode_measures_the_copy_delay_without_a_delta_log(
    pair: tuple[str, str], redis_url: str
) -> None:
    primary_uri, replica_uri = pair
    section = IndexStalenessSection(
        collection="docs", dim=DIM, region="eu", primary_uri=primary_uri,
        replica_uri=replica_uri, replication="external",
    )  # fmt: skip
    config = section.index_config(section.collection, section.dim, "", section.region)
    probe = IndexStalenessProbe(config, redis_url, interval_seconds=0.3)
    assert probe.metrics == EXTERNAL_METRICS
    cache = ProbeCache([probe])
    primary, replica = connect_milvus(primary_uri), connect_milvus(replica_uri)
    copier = LateCopier(primary, replica, DELAY)
    copier.thread.start()
    name = catalog.VECTORDB_INDEX_STALENESS_SECONDS.name

    def measure() -> float:
        cache.run(probe.name)
        status = cache.status()[probe.name]
        assert status["success"], status
        values = [s.value for f in cache.collect() for s in f.samples if s.name == name]
        assert len(values) == 1
        return values[0]

    try:
        first = measure()  # writes the first canary on the primary
        assert first < 1.0
        canary = int(probe.canary_id)
        assert canary < 0  # a reserved negative INT64 key
        held = primary.get("docs", ids=[canary], output_fields=["*"])
        assert held and held[0]["body"] == "" and held[0]["page"] == 0  # required fields filled
        assert replica.get("docs", ids=[canary]) == []

        # while the copy is late, staleness grows with wall time; then the copy is seen
        series: list[float] = []
        deadline = time.monotonic() + 30
        while copier.copies == 0 or len(series) < 3 or series[-1] > 1.0:
            assert time.monotonic() < deadline, series
            series.append(measure())
            time.sleep(0.3)
        peak = max(series)
        assert DELAY - 0.5 <= peak <= DELAY + 2.0, series  # the copy delay, within a run or two
        assert replica.get("docs", ids=[canary], output_fields=["body"])[0]["body"] == ""

        # the external replicator stops: staleness keeps growing past the delay
        copier.paused.set()
        time.sleep(0.5)
        stalled = [measure()]
        while stalled[-1] < DELAY + 2.0:
            assert len(stalled) < 100, stalled
            time.sleep(0.3)
            stalled.append(measure())
        copier.paused.clear()
        deadline = time.monotonic() + 30
        while measure() > 1.0 or copier.copies < 2:
            assert time.monotonic() < deadline, "the probe never saw the copy again"
            time.sleep(0.3)

        client = redis.Redis.from_url(redis_url)
        assert client.exists(probe.log.stream_key) == 0  # no delta log: redline copies nothing
        client.close()
    finally:
        copier.stop.set()
        copier.thread.join(timeout=10)
        probe.close()
        primary.close()
        replica.close()
