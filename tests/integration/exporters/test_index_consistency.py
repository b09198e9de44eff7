"""The consistency-level probe against a real Milvus Lite server: a Strong primary and an
Eventually replica created with `connect_milvus`, the probe run through the `ProbeCache` as the
exporter runs it, its series read back from the cache's collector, the start-up warning from the
log; a collection that does not exist fails the run (probe success 0, no gauges).

Milvus Lite (2.5) keeps no consistency level: `describe_collection` answers 0 (Strong) whatever
the collection was created with. The probe is checked against what the server describes, and,
for the Eventually and Bounded paths, through a client that answers the level the collection was
created with, as Milvus standalone, distributed and Zilliz Cloud do (every other call is the
real server's)."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymilvus import DataType, MilvusClient

from redline.devstack.processes import Service
from redline.exporters.index_consistency import IndexConsistencyProbe, read_level
from redline.exporters.probe import ProbeCache
from redline.exporters.settings import IndexStalenessSection
from redline.platform.index import IndexConfig, TargetSpec, connect_milvus
from redline.slo import catalog

pytestmark = pytest.mark.integration

DIM = 8
LEVEL = catalog.VECTORDB_INDEX_CONSISTENCY_LEVEL.name
BOUND = catalog.VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS.name


def _create(client: MilvusClient, name: str, level: str) -> None:
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="AUTOINDEX", metric_type="COSINE")
    client.create_collection(name, schema=schema, index_params=index, consistency_level=level)


@pytest.fixture()
def collections(milvus_service: Service) -> Iterator[tuple[str, str, str]]:
    """(uri, a Strong collection, an Eventually collection), dropped afterwards."""
    uri = milvus_service.extra["uri"]
    suffix = uuid.uuid4().hex[:8]
    strong, eventual = f"cl_strong_{suffix}", f"cl_eventual_{suffix}"
    client = connect_milvus(uri)
    try:
        _create(client, strong, "Strong")
        _create(client, eventual, "Eventually")
        yield uri, strong, eventual
    finally:
        for name in (strong, eventual):
            client.drop_collection(name)
        client.close()


class AsCreated:
    """A real client whose `describe_collection` reports the level each collection was created
    with (what Milvus Lite drops)."""

    def __init__(self, client: MilvusClient, levels: dict[str, str]) -> None:
        self.client, self.levels = client, levels

    def describe_collection(self, name: str, **kwargs: Any) -> dict[str, Any]:
        described = dict(self.client.describe_collection(name, **kwargs))
        if name in self.levels:
            described["consistency_level"] = self.levels[name]
        return described

    def close(self) -> None:
        self.client.close()


def _as_created(levels: dict[str, str]) -> Any:
    def connect(target: TargetSpec, timeout_seconds: float) -> Any:
        client = connect_milvus(target.uri, target.token, timeout_seconds)
        return AsCreated(client, levels)

    return connect


def _config(uri: str, primary: str, replica: str) -> IndexConfig:
    section = IndexStalenessSection(
        collection="docs", dim=DIM, primary_uri=uri, primary_collection=primary,
        replica_uri=uri, replica_collection=replica, replication="external",
    )  # fmt: skip
    return section.index_config(section.collection, section.dim)


def _series(cache: ProbeCache) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The cached consistency series, keyed by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in cache.collect()
        for sample in family.samples
        if sample.name in (LEVEL, BOUND)
    }


def _key(
    name: str, target: str, level: str | None = None
) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {catalog.LABEL_COLLECTION: "docs", catalog.LABEL_TARGET: target}
    if level is not None:
        labels[catalog.LABEL_LEVEL] = level
    return name, tuple(sorted(labels.items()))


def test_the_probe_publishes_each_level_and_warns_about_the_weak_one(
    collections: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    uri, strong, eventual = collections
    levels = {strong: "Strong", eventual: "Eventually"}
    probe = IndexConsistencyProbe(
        _config(uri, strong, eventual), red_line_seconds=12.0, connect=_as_created(levels)
    )
    cache = ProbeCache([probe])
    caplog.set_level(logging.INFO, logger="redline.exporters.index_consistency")
    try:
        cache.run(probe.name)  # the exporter's first run, at start-up
        assert cache.status()[probe.name]["success"], cache.status()
        assert _series(cache) == {
            _key(LEVEL, "primary", "Strong"): 1.0,
            _key(BOUND, "primary"): 0.0,
            _key(LEVEL, "replica", "Eventually"): 1.0,
            _key(BOUND, "replica"): math.inf,
        }
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert eventual in warnings[0] and "Eventually" in warnings[0]
        assert strong not in warnings[0]
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert any(strong in m and "Strong" in m for m in infos), infos

        # later runs publish the same series without logging again
        caplog.clear()
        cache.run(probe.name)
        assert cache.status()[probe.name]["success"]
        assert _series(cache)[_key(BOUND, "replica")] == math.inf
        assert not [r for r in caplog.records if r.levelno >= logging.INFO]
    finally:
        probe.close()


def test_a_bounded_collection_reports_the_configured_graceful_time(
    collections: tuple[str, str, str],
) -> None:
    uri, strong, _ = collections
    bounded = f"cl_bounded_{uuid.uuid4().hex[:8]}"
    client = connect_milvus(uri)
    _create(client, bounded, "Bounded")
    probe = IndexConsistencyProbe(
        _config(uri, strong, bounded),
        red_line_seconds=12.0,
        bounded_staleness_seconds=20.0,
        connect=_as_created({bounded: "Bounded"}),
    )
    try:
        samples = {(s.name, s.labels.get(catalog.LABEL_TARGET)): s for s in probe.run()}
        assert samples[(BOUND, "replica")].value == 20.0
        assert samples[(LEVEL, "replica")].labels[catalog.LABEL_LEVEL] == "Bounded"
    finally:
        probe.close()
        client.drop_collection(bounded)
        client.close()


def test_the_probe_publishes_what_the_server_describes(
    collections: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """No stand-in: the levels Milvus Lite itself describes, through `connect_milvus`."""
    uri, strong, eventual = collections
    client = connect_milvus(uri)
    described = {name: read_level(client.describe_collection(name)) for name in (strong, eventual)}
    client.close()
    assert described[strong] == "Strong"
    probe = IndexConsistencyProbe(_config(uri, strong, eventual), red_line_seconds=12.0)
    caplog.set_level(logging.INFO, logger="redline.exporters.index_consistency")
    try:
        samples = probe.run()
        levels = {
            s.labels[catalog.LABEL_TARGET]: s.labels[catalog.LABEL_LEVEL]
            for s in samples
            if s.name == LEVEL
        }
        assert levels == {"primary": described[strong], "replica": described[eventual]}
        weak = described[eventual] not in ("Strong", "Bounded")
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == (1 if weak else 0), warned
    finally:
        probe.close()


def test_a_missing_collection_fails_the_run_and_drops_the_gauges(
    collections: tuple[str, str, str],
) -> None:
    uri, strong, _ = collections
    probe = IndexConsistencyProbe(_config(uri, strong, "cl_no_such_collection"), 12.0)
    cache = ProbeCache([probe])
    try:
        cache.run(probe.name)
        status = cache.status()[probe.name]
        assert not status["success"]
        assert "replica (collection cl_no_such_collection)" in str(status["error"])
        assert _series(cache) == {}
        success = {
            s.labels[catalog.LABEL_PROBE]: s.value
            for f in cache.collect()
            for s in f.samples
            if s.name == catalog.REDLINE_PROBE_SUCCESS.name
        }
        assert success == {probe.name: 0.0}
    finally:
        probe.close()
