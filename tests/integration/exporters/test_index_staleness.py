"""The index staleness probe on real redis-server, Milvus Lite and a real replicator: a paused
replicator shows staleness growing past the red line, the delta-log gauges follow freeze and
replay, and a stopped Redis or Milvus is a fast probe failure that heals when they return."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from redline.devstack.processes import Service, start_milvus_lite, start_redis
from redline.exporters.index_staleness import IndexStalenessProbe
from redline.exporters.probe import ProbeCache
from redline.platform.index import (
    DeltaLog,
    IndexConfig,
    IndexWriter,
    MilvusTarget,
    Replicator,
    TargetSpec,
    replay_delta_log,
    trim_delta_log,
    unfreeze_writes,
)
from redline.slo import catalog

pytestmark = pytest.mark.integration

DIM = 8


def _config(uri: str) -> IndexConfig:
    name = f"s{uuid.uuid4().hex[:12]}"
    return IndexConfig(
        collection=name,
        dim=DIM,
        primary=TargetSpec(uri, f"{name}_p", "primary"),
        replica=TargetSpec(uri, f"{name}_r", "replica"),
        region="eu",
    )


def _targets(config: IndexConfig) -> tuple[MilvusTarget, MilvusTarget]:
    primary = MilvusTarget(config.primary, DIM)
    replica = MilvusTarget(config.replica, DIM)
    primary.ensure_collection()
    replica.ensure_collection()
    return primary, replica


def _drop(*targets: MilvusTarget) -> None:
    for target in targets:
        target.client().drop_collection(target.collection)
        target.close()


def _samples(cache: ProbeCache) -> dict[str, float]:
    """The cached values of the probe's series, keyed by sample name."""
    values: dict[str, float] = {}
    for family in cache.collect():
        for sample in family.samples:
            if sample.name.startswith("vectordb_"):
                values[sample.name] = sample.value
    return values


def _run(cache: ProbeCache, name: str) -> tuple[bool, dict[str, float], float]:
    started = time.monotonic()
    cache.run(name)
    elapsed = time.monotonic() - started
    return bool(cache.status()[name]["success"]), _samples(cache), elapsed


def _canary_ts(probe: IndexStalenessProbe) -> bytes | None:
    value = probe.redis.hget(probe.log.canary_key(probe.config.replica.name), "ts_ms")
    return value if isinstance(value, bytes) else None


def _until_fresh(
    cache: ProbeCache, probe: IndexStalenessProbe, within: float, below: float = 1.5
) -> float:
    """Run the probe until it sees a canary on the replica with staleness below `below`.

    A sighting replaces the canary, so a run that changed an existing canary saw the old one.
    """
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        before = _canary_ts(probe)
        ok, values, _ = _run(cache, probe.name)
        seen = before is not None and _canary_ts(probe) != before
        last = (ok, seen, values, cache.status()[probe.name]["error"])
        staleness = values.get(catalog.VECTORDB_INDEX_STALENESS_SECONDS.name)
        if ok and seen and staleness is not None and staleness < below:
            return staleness
        time.sleep(0.2)
    raise AssertionError(f"probe never saw a fresh canary; last run: {last}")


@pytest.fixture()
def replicator_process(
    redis_url: str, milvus_service: Service, tmp_path: Path
) -> Iterator[tuple[IndexConfig, subprocess.Popen[bytes]]]:
    """`redline index replicate` running as its own process on a fresh collection."""
    config = _config(milvus_service.extra["uri"])
    primary, replica = _targets(config)
    log_path = tmp_path / "replicator.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "redline.cli",
                "index",
                "replicate",
                "--redis-url",
                redis_url,
                "--collection",
                config.collection,
                "--dim",
                str(DIM),
                "--primary-uri",
                config.primary.uri,
                "--primary-collection",
                config.primary.collection,
                "--replica-uri",
                config.replica.uri,
                "--replica-collection",
                config.replica.collection,
                "--lease-ttl",
                "2",
            ],  # fmt: skip
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    yield config, process
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _drop(primary, replica)


def test_paused_replicator_shows_growing_staleness_then_recovers(
    replicator_process: tuple[IndexConfig, subprocess.Popen[bytes]], redis_url: str
) -> None:
    config, process = replicator_process
    probe = IndexStalenessProbe(config, redis_url, interval_seconds=0.5, timeout_seconds=2.0)
    cache = ProbeCache([probe])
    client = redis.Redis.from_url(redis_url)
    log = DeltaLog(client, config.collection, DIM)
    writer = IndexWriter(log, MilvusTarget(config.primary, DIM), "eu")
    try:
        assert _until_fresh(cache, probe, within=30) < 1.5, "replicator did not start"
        assert process.poll() is None

        log.set_paused("replica", True)
        paused_at = time.monotonic()
        rng = np.random.default_rng(0)
        writer.upsert("doc-during-pause", rng.standard_normal(DIM))
        series: list[tuple[float, float]] = []
        while time.monotonic() - paused_at < 15.0:
            ok, values, elapsed = _run(cache, probe.name)
            assert ok, cache.status()  # within its 2 s timeout
            series.append(
                (
                    time.monotonic() - paused_at,
                    values[catalog.VECTORDB_INDEX_STALENESS_SECONDS.name],
                )
            )
            time.sleep(0.5)
        final = _samples(cache)
        assert series[-1][1] >= 12.0, series
        # staleness tracks wall time while the replica is stuck (within a probe interval)
        for at, staleness in series[2:]:
            assert staleness >= at - 1.0, series
        assert final[catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES.name] >= 2  # the canary and the row
        assert final[catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.name] >= 12.0

        log.set_paused("replica", False)
        resumed_at = time.monotonic()
        staleness = _until_fresh(cache, probe, within=20)
        assert staleness < 1.5 and time.monotonic() - resumed_at < 20
        replica_rows = MilvusTarget(config.replica, DIM).fetch(["doc-during-pause"])
        assert "doc-during-pause" in replica_rows
    finally:
        writer.primary.close()
        probe.close()
        client.close()


def test_probe_follows_freeze_backlog_and_replay(redis_url: str, milvus_service: Service) -> None:
    config = _config(milvus_service.extra["uri"])
    primary, replica = _targets(config)
    probe = IndexStalenessProbe(config, redis_url, interval_seconds=1.0)
    cache = ProbeCache([probe])
    client = redis.Redis.from_url(redis_url)
    log = DeltaLog(client, config.collection, DIM)
    writer = IndexWriter(log, primary, "eu")
    try:
        ok, values, _ = _run(cache, probe.name)  # writes the first canary
        assert ok and values[catalog.VECTORDB_WRITE_FROZEN.name] == 0.0
        writer.freeze("drill")
        vectors = np.random.default_rng(1).standard_normal((50, DIM))
        writer.upsert_many([(f"doc-{i}", vectors[i]) for i in range(50)])
        time.sleep(0.3)
        ok, values, _ = _run(cache, probe.name)
        assert ok and values[catalog.VECTORDB_WRITE_FROZEN.name] == 1.0
        assert values[catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES.name] == 51.0  # canary + 50 rows
        assert values[catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.name] >= 0.3
        assert (
            values[catalog.VECTORDB_INDEX_STALENESS_SECONDS.name] >= 0.3
        )  # canary not on the replica
        assert values[catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL.name] == 0.0

        report = replay_delta_log(log, replica, batch_size=16)
        assert report.ok and report.entries == 51
        ok, values, _ = _run(cache, probe.name)
        assert ok and values[catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL.name] == 51.0
        assert values[catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES.name] == 0.0
        assert values[catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.name] == 0.0

        assert unfreeze_writes(log, primary) == 51  # the rows and the canary written since
        ok, values, _ = _run(cache, probe.name)
        assert ok and values[catalog.VECTORDB_WRITE_FROZEN.name] == 0.0
        assert values[catalog.VECTORDB_DELTA_LOG_ENTRIES.name] == 52.0  # 2 canaries + 50 rows
        full = values[catalog.VECTORDB_DELTA_LOG_MEMORY_BYTES.name]
        assert full > 50 * DIM * 4

        # the replica is past everything: a trim leaves the entry at its checkpoint (and any
        # canary written since), and the gauges follow
        assert trim_delta_log(log, 0).removed >= 50
        ok, values, _ = _run(cache, probe.name)
        assert ok and values[catalog.VECTORDB_DELTA_LOG_ENTRIES.name] <= 3.0
        assert 0 < values[catalog.VECTORDB_DELTA_LOG_MEMORY_BYTES.name] < full

        registry = CollectorRegistry()
        registry.register(cache)
        exposition = generate_latest(registry)
        assert f"{catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL}{{".encode() in exposition
        lint = subprocess.run(
            ["promtool", "check", "metrics"], input=exposition, capture_output=True, check=False
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
    finally:
        probe.close()
        client.close()
        _drop(primary, replica)


def test_probe_fails_fast_when_redis_or_milvus_stop_and_recovers(tmp_path: Path) -> None:
    redis_dir, milvus_dir = tmp_path / "redis", tmp_path / "milvus"
    redis_dir.mkdir()
    redis_service = start_redis(redis_dir)
    milvus_service = start_milvus_lite(milvus_dir)
    url = redis_service.extra["url"]
    config = _config(milvus_service.extra["uri"])
    primary, replica = _targets(config)
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    stop = threading.Event()
    replicator = Replicator(
        DeltaLog(client, config.collection, DIM),
        MilvusTarget(config.replica, DIM, timeout_seconds=1.0),
        poll_interval_seconds=0.05,
        lease_ttl_seconds=2.0,
        max_backoff_seconds=0.3,
    )
    thread = threading.Thread(target=replicator.run, args=(stop,), daemon=True)
    thread.start()
    probe = IndexStalenessProbe(config, url, interval_seconds=0.5, timeout_seconds=1.0)
    cache = ProbeCache([probe])
    try:
        _until_fresh(cache, probe, within=30)

        redis_service.stop()
        ok, values, elapsed = _run(cache, probe.name)
        assert not ok and elapsed < 5.0, cache.status()
        assert catalog.VECTORDB_INDEX_STALENESS_SECONDS.name not in values  # unknown, not zero
        redis_service = start_redis(redis_dir, port=redis_service.port)
        _until_fresh(cache, probe, within=30)

        milvus_service.stop()
        ok, _, elapsed = _run(cache, probe.name)
        assert not ok and elapsed < 5.0, cache.status()
        assert "Milvus" in str(cache.status()[probe.name]["error"])
        milvus_service = start_milvus_lite(milvus_dir, port=milvus_service.port)
        _until_fresh(cache, probe, within=30)
    finally:
        stop.set()
        thread.join(timeout=10)
        probe.close()
        replicator.replica.close()
        primary.close()
        replica.close()
        client.close()
        redis_service.stop()
        milvus_service.stop()
