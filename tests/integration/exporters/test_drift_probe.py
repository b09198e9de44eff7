"""The drift probe against real Milvus Lite and real Redis, run through the real ProbeCache."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from pymilvus import DataType, MilvusClient

from redline.devstack.processes import Service, free_port, start_milvus_lite
from redline.exporters.drift import (
    DriftProbe,
    MilvusSnapshot,
    MilvusWindow,
    NpyReference,
    RedisStreamWindow,
    build_drift_probe,
    encode_vector,
)
from redline.exporters.drift_stats import DriftSettings
from redline.exporters.probe import ProbeCache
from redline.platform.index import connect_milvus
from redline.slo import catalog
from redline.slo.spec import Drift

pytestmark = pytest.mark.integration

DIM = 16
WINDOW = 200
SETTINGS = DriftSettings(calibration_draws=200, classifier_components=8)


def _centres() -> np.ndarray:
    rng = np.random.default_rng(11)
    return (rng.standard_normal((5, DIM)) * 0.6 + 1.0).astype(np.float32)


def _sample(rng: np.random.Generator, n: int, shifted: bool) -> np.ndarray:
    centres = _centres()
    chosen = rng.choice([4] if shifted else [0, 1, 2, 3], n)
    x = centres[chosen] + rng.standard_normal((n, DIM)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _create(client: MilvusClient, name: str) -> None:
    schema = MilvusClient.create_schema(auto_id=True)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("ts_ms", DataType.INT64)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=DIM)
    index = client.prepare_index_params()
    index.add_index("embedding", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index)


def _insert(client: MilvusClient, name: str, vectors: np.ndarray, end_ms: int) -> None:
    """Rows 1 ms apart, the last one at `end_ms`."""
    start = end_ms - len(vectors) + 1
    rows = [
        {"ts_ms": start + i, "embedding": [float(v) for v in vector]}
        for i, vector in enumerate(vectors)
    ]
    client.insert(name, rows)


def _series(cache: ProbeCache) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in cache.collect()
        for sample in family.samples
    }


def _value(
    series: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return series[(name, tuple(sorted(labels.items())))]


def _check_exposition(cache: ProbeCache) -> None:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(cache)
    text = generate_latest(registry)
    promtool = shutil.which("promtool")
    if promtool is not None:
        result = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
        )
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture()
def milvus(milvus_service: Service) -> Iterator[MilvusClient]:
    client = connect_milvus(milvus_service.extra["uri"])
    yield client
    client.close()


def test_milvus_probe_scores_the_newest_rows_against_a_collection_snapshot(
    milvus_service: Service, milvus: MilvusClient
) -> None:
    uri = milvus_service.extra["uri"]
    suffix = uuid.uuid4().hex[:8]
    reference_name, live_name = f"drift_ref_{suffix}", f"drift_live_{suffix}"
    rng = np.random.default_rng(5)
    _create(milvus, reference_name)
    _create(milvus, live_name)
    now = int(time.time() * 1000)
    _insert(milvus, reference_name, _sample(rng, 1200, shifted=False), now - 86_400_000)
    # An hour-old shifted batch, then a same-distribution batch (with 3 NaN vectors) a minute ago.
    _insert(milvus, live_name, _sample(rng, 400, shifted=True), now - 3_600_000)
    recent = _sample(rng, WINDOW + 50, shifted=False)
    recent[[-1, -5, -9], 3] = np.nan
    _insert(milvus, live_name, recent, now - 60_000)

    probe = DriftProbe(
        source=MilvusWindow(uri, live_name),
        reference=MilvusSnapshot(uri, reference_name),
        collection=live_name,
        methods=("mmd", "mean_cosine", "classifier_auc"),
        window_size=WINDOW,
        settings=SETTINGS,
    )
    cache = ProbeCache([probe])
    cache.run(probe.name)
    assert cache.status()[probe.name]["success"] is True, cache.status()
    series = _series(cache)
    assert (
        _value(series, catalog.EMBEDDING_DRIFT_WINDOW_SAMPLES.name, collection=live_name) == WINDOW
    )
    assert (
        _value(
            series,
            catalog.EMBEDDING_DRIFT_INVALID_VECTORS_TOTAL.name,
            collection=live_name,
            reason="non_finite",
        )
        == 3
    )
    for method in ("mmd", "mean_cosine", "classifier_auc"):
        score = _value(
            series, catalog.EMBEDDING_DRIFT_SCORE.name, collection=live_name, method=method
        )
        threshold = _value(
            series, catalog.EMBEDDING_DRIFT_THRESHOLD.name, collection=live_name, method=method
        )
        assert score < threshold, (method, score, threshold)

    # Now the newest rows come from the shifted topic: the same probe must see it.
    _insert(milvus, live_name, _sample(rng, WINDOW + 20, shifted=True), int(time.time() * 1000))
    cache.run(probe.name)
    series = _series(cache)
    for method in ("mmd", "mean_cosine", "classifier_auc"):
        score = _value(
            series, catalog.EMBEDDING_DRIFT_SCORE.name, collection=live_name, method=method
        )
        threshold = _value(
            series, catalog.EMBEDDING_DRIFT_THRESHOLD.name, collection=live_name, method=method
        )
        assert score > threshold, (method, score, threshold)
    # The NaN rows have left the window; the counter keeps its total.
    assert (
        _value(
            series,
            catalog.EMBEDDING_DRIFT_INVALID_VECTORS_TOTAL.name,
            collection=live_name,
            reason="non_finite",
        )
        == 3
    )
    _check_exposition(cache)
    milvus.drop_collection(reference_name)
    milvus.drop_collection(live_name)


def test_redis_stream_probe_skips_bad_vectors_and_detects_a_shift(
    redis_url: str, tmp_path: Path
) -> None:
    rng = np.random.default_rng(6)
    reference = tmp_path / "reference.npy"
    np.save(reference, _sample(rng, 1000, shifted=False))
    client = redis.Redis.from_url(redis_url)
    stream = "embeddings"
    try:
        for vector in _sample(rng, 300, shifted=True):
            client.xadd(stream, {"vector": encode_vector(vector)})
        for vector in _sample(rng, WINDOW, shifted=False):
            client.xadd(stream, {"vector": encode_vector(vector)})
        nan = np.ones(DIM, np.float32)
        nan[0] = np.nan
        client.xadd(stream, {"vector": encode_vector(nan)})
        client.xadd(stream, {"vector": encode_vector(np.ones(DIM + 1))})
        client.xadd(stream, {"vector": b"\x00\x01\x02"})
        client.xadd(stream, {"other": b"no vector field"})

        probe = DriftProbe(
            source=RedisStreamWindow(redis_url, stream),
            reference=NpyReference(reference),
            collection=stream,
            window_size=WINDOW,
            settings=SETTINGS,
        )
        cache = ProbeCache([probe])
        cache.run(probe.name)
        assert cache.status()[probe.name]["success"] is True, cache.status()
        series = _series(cache)
        labels = {"collection": stream}
        assert _value(series, catalog.EMBEDDING_DRIFT_WINDOW_SAMPLES.name, **labels) == WINDOW
        invalid = {
            reason: _value(
                series, catalog.EMBEDDING_DRIFT_INVALID_VECTORS_TOTAL.name, reason=reason, **labels
            )
            for reason in ("wrong_dimension", "non_finite", "undecodable")
        }
        assert invalid == {"wrong_dimension": 1, "non_finite": 1, "undecodable": 2}
        score = _value(series, catalog.EMBEDDING_DRIFT_SCORE.name, method="mmd", **labels)
        assert score < _value(
            series, catalog.EMBEDDING_DRIFT_THRESHOLD.name, method="mmd", **labels
        )

        for vector in _sample(rng, WINDOW, shifted=True):
            client.xadd(stream, {"vector": encode_vector(vector)})
        cache.run(probe.name)
        series = _series(cache)
        score = _value(series, catalog.EMBEDDING_DRIFT_SCORE.name, method="mmd", **labels)
        assert score > _value(
            series, catalog.EMBEDDING_DRIFT_THRESHOLD.name, method="mmd", **labels
        )
    finally:
        client.close()


def test_spec_probe_fails_while_milvus_is_down_and_recovers(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    reference = tmp_path / "reference.npy"
    np.save(reference, _sample(rng, 800, shifted=False))
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    drift = Drift(method="mmd", window=WINDOW, reference=str(reference), collection="documents")
    probe = build_drift_probe(drift, milvus_uri=uri)
    cache = ProbeCache([probe])
    cache.run(probe.name)
    status = cache.status()[probe.name]
    assert status["success"] is False and "MilvusException" in str(status["error"])
    series = _series(cache)
    assert _value(series, catalog.REDLINE_PROBE_SUCCESS.name, probe=probe.name) == 0
    assert not any(name == catalog.EMBEDDING_DRIFT_SCORE.name for name, _ in series)

    service = start_milvus_lite(tmp_path / "milvus", port=port)
    try:
        client = connect_milvus(uri)
        try:
            _create(client, "documents")
            _insert(
                client, "documents", _sample(rng, WINDOW, shifted=True), int(time.time() * 1000)
            )
        finally:
            client.close()
        cache.run(probe.name)
        assert cache.status()[probe.name]["success"] is True, cache.status()
        series = _series(cache)
        labels = {"collection": "documents", "method": "mmd"}
        assert _value(series, catalog.EMBEDDING_DRIFT_SCORE.name, **labels) > _value(
            series, catalog.EMBEDDING_DRIFT_THRESHOLD.name, **labels
        )
    finally:
        service.stop()
