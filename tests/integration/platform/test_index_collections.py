"""The index write path on user-shaped collections (any key name and type, any vector field,
scalar and dynamic fields) on a real Milvus Lite server and redis-server: writes, freeze, replay
onto a replica created like the primary, verification and the replicator, every field of every
row compared with what was written; and collections the write path cannot use refused at
start-up, named."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import redis
from pymilvus import DataType, MilvusClient

from redline.devstack.processes import Service
from redline.platform.index import (
    VERSION_COLUMNS,
    VERSION_KEYS,
    DeltaLog,
    DeltaLogError,
    IndexSchemaError,
    IndexWriter,
    MilvusTarget,
    Replicator,
    TargetSpec,
    connect_milvus,
    replay_delta_log,
    verify_range,
)

DIM = 8


def _f32(value: float) -> float:
    """What Milvus gives back for a FLOAT field."""
    return float(np.float32(value))


def _create(client: MilvusClient, name: str, pk_type: str, dynamic: bool = True) -> None:
    """A RAG-like collection: key `doc_id`, vector `embedding` and scalar fields."""
    schema = client.create_schema(auto_id=False, enable_dynamic_field=dynamic)
    if pk_type == "int64":
        schema.add_field("doc_id", DataType.INT64, is_primary=True)
    else:
        schema.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("text", DataType.VARCHAR, max_length=512)
    schema.add_field("score", DataType.FLOAT)
    schema.add_field("weight", DataType.DOUBLE)
    schema.add_field("rank", DataType.INT32)
    schema.add_field("published", DataType.BOOL)
    schema.add_field("tags", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=8,
                     max_length=32)  # fmt: skip
    schema.add_field("scores", DataType.ARRAY, element_type=DataType.FLOAT, max_capacity=4)
    schema.add_field("meta", DataType.JSON)
    schema.add_field("note", DataType.VARCHAR, max_length=64, nullable=True)
    schema.add_field("lang", DataType.VARCHAR, max_length=8, default_value="en")
    index = client.prepare_index_params()
    index.add_index("embedding", index_type="AUTOINDEX", metric_type="COSINE")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")


@dataclass
class Pair:
    """A user collection (primary) and its replica-to-be, with a delta log and a writer."""

    name: str
    pk_type: str
    client: MilvusClient
    redis: redis.Redis
    log: DeltaLog
    primary: MilvusTarget
    replica: MilvusTarget
    writer: IndexWriter

    def key(self, n: int) -> Any:
        """The n-th document's key as Milvus takes it."""
        return n * 7919 - 10**12 if self.pk_type == "int64" else f"doc:{n}"


@pytest.fixture(params=["int64", "varchar"])
def pair(request: pytest.FixtureRequest, redis_url: str, milvus_service: Service) -> Iterator[Pair]:
    """A fresh primary created by the user (the test); the replica does not exist yet."""
    uri = milvus_service.extra["uri"]
    name = f"rag{uuid.uuid4().hex[:10]}"
    client = connect_milvus(uri)
    _create(client, f"{name}_p", request.param)
    r = redis.Redis.from_url(redis_url)
    log = DeltaLog(r, name, DIM)
    primary = MilvusTarget(TargetSpec(uri, f"{name}_p", "primary"), DIM)
    replica = MilvusTarget(TargetSpec(uri, f"{name}_r", "replica"), DIM)
    primary.ensure_collection()
    yield Pair(name, request.param, client, r, log, primary, replica,
               IndexWriter(log, primary, "eu"))  # fmt: skip
    for target in (primary, replica):
        client.drop_collection(target.collection)
        target.close()
    client.close()
    r.close()


def _row(pair: Pair, n: int, rng: np.random.Generator, version: int = 0) -> dict[str, Any]:
    """A document as an application writes it (dynamic fields included on some)."""
    row: dict[str, Any] = {
        "doc_id": pair.key(n),
        "embedding": rng.standard_normal(DIM).astype(np.float32),
        "text": f"chunk {n} v{version} – ünïcode",
        "score": 0.1 * n + 0.01 * version,
        "weight": 1.0 / (n + 3),
        "rank": n - 50,
        "published": n % 2 == 0,
        "tags": [f"t{n % 3}", "rag"],
        "scores": [0.5, 1.0 / 3.0],
        "meta": {"source": f"s3://bucket/{n}.pdf", "page": n, "ratio": 0.1},
    }
    if n % 3 == 0:
        row["note"] = f"note {n}"
    if n % 4 == 0:
        row["lang"] = "de"
    if n % 5 == 0:
        row["author"] = {"name": "a", "ids": [1, 2.5]}  # a dynamic field
        row["year"] = 2020 + n % 5
    return row


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    """What Milvus should give back for a written row (computed here, not by redline)."""
    want = {k: v for k, v in row.items() if k != "embedding"}
    want["score"] = _f32(row["score"])
    want["scores"] = [_f32(v) for v in row["scores"]]
    want.setdefault("note", None)
    want.setdefault("lang", "en")
    return want


def _read_all(pair: Pair, target: MilvusTarget, keys: list[Any]) -> dict[Any, dict[str, Any]]:
    """Every field of the rows, read with the raw client, version fields left out."""
    rows = pair.client.get(target.collection, ids=keys, output_fields=["*"], strict_float32=True)
    hidden = {*VERSION_KEYS, *VERSION_COLUMNS}
    return {r["doc_id"]: {k: v for k, v in r.items() if k not in hidden} for r in rows}


def _assert_rows(
    pair: Pair, target: MilvusTarget, written: dict[Any, dict[str, Any] | None]
) -> None:
    """Each key holds exactly its last write, field by field, or is absent when deleted."""
    got = _read_all(pair, target, list(written))
    for key, row in written.items():
        if row is None:
            assert key not in got, f"{key} should be deleted on {target.name}"
            continue
        assert key in got, f"{key} missing on {target.name}"
        held = dict(got[key])
        vector = held.pop("embedding")
        assert np.array_equal(np.asarray(vector, dtype=np.float32), row["embedding"]), key
        assert held == _expected(row), f"{key} on {target.name}: {held} != {_expected(row)}"


def test_user_collection_write_freeze_replay_verify_field_by_field(pair: Pair) -> None:
    rng = np.random.default_rng(1)
    written: dict[Any, dict[str, Any] | None] = {}
    rows = [_row(pair, n, rng) for n in range(40)]
    acks = pair.writer.upsert_rows(rows)
    assert all(a.applied for a in acks)
    written.update({r["doc_id"]: r for r in rows})
    _assert_rows(pair, pair.primary, written)  # the primary holds them as written

    pair.writer.freeze("drill")
    rewritten = [_row(pair, n, rng, version=1) for n in range(0, 40, 2)]
    pair.writer.upsert_rows(rewritten)
    written.update({r["doc_id"]: r for r in rewritten})
    fresh = [_row(pair, n, rng) for n in range(40, 60)]
    pair.writer.upsert_rows(fresh)
    written.update({r["doc_id"]: r for r in fresh})
    pair.writer.write([("delete", pair.key(n), None) for n in range(1, 60, 9)])
    written.update({pair.key(n): None for n in range(1, 60, 9)})
    # the replica does not exist: the replay creates it like the primary
    created = pair.replica.ensure_collection(like=pair.primary)
    assert created == replace(pair.primary.schema(), collection=pair.replica.collection)
    report = replay_delta_log(pair.log, pair.replica, batch_size=16)
    assert report.ok, report.summary()
    assert report.verify.verified == len(written)
    _assert_rows(pair, pair.replica, written)

    assert pair.writer.unfreeze() > 0
    _assert_rows(pair, pair.primary, written)
    # verification sees a changed scalar field, not only a changed vector
    tampered = dict(_read_all(pair, pair.replica, [pair.key(2)])[pair.key(2)])
    tampered["text"] = "changed behind redline's back"
    schema = pair.replica.schema()
    held = pair.client.get(pair.replica.collection, ids=[pair.key(2)], output_fields=[
        *schema.version_fields()])[0]  # fmt: skip
    pair.client.upsert(pair.replica.collection, [{**tampered, **held}])
    check = verify_range(pair.log, pair.replica, "0-0", pair.log.last_id())
    assert check.checksum_mismatches == 1 and list(check.mismatched_ids) == [str(pair.key(2))]


def test_replicator_keeps_a_user_collection_in_step_and_trims(pair: Pair) -> None:
    pair.replica.ensure_collection(like=pair.primary)
    stop = threading.Event()
    replicator = Replicator(pair.log, pair.replica, batch_size=50, poll_interval_seconds=0.05,
                            retention_seconds=0.0, trim_interval_seconds=0.2)  # fmt: skip
    thread = threading.Thread(target=replicator.run, args=(stop,), daemon=True)
    thread.start()
    rng = np.random.default_rng(2)
    written: dict[Any, dict[str, Any] | None] = {}
    try:
        for start in range(0, 200, 20):
            rows = [_row(pair, n, rng, version=start) for n in range(start, start + 20)]
            pair.writer.upsert_rows(rows)
            written.update({r["doc_id"]: r for r in rows})
        pair.writer.write([("delete", pair.key(n), None) for n in range(0, 200, 10)])
        written.update({pair.key(n): None for n in range(0, 200, 10)})
        last = pair.log.last_id()
        deadline = time.monotonic() + 60
        while pair.log.target_state("replica").checkpoint != last:
            assert time.monotonic() < deadline, "replicator did not catch up"
            time.sleep(0.1)
        deadline = time.monotonic() + 30
        while pair.log.info().length > 1:  # retention 0: all but the checkpoint's own entry
            assert time.monotonic() < deadline, f"not trimmed: {pair.log.info()}"
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(timeout=10)
    _assert_rows(pair, pair.replica, written)
    assert pair.log.info().entries_added == 220


def test_writes_the_collection_cannot_hold_are_refused_before_the_log(pair: Pair) -> None:
    rng = np.random.default_rng(3)
    good = _row(pair, 1, rng)
    cases = [
        ({k: v for k, v in good.items() if k != "text"}, "required field 'text' is missing"),
        ({**good, "rank": 2**40}, "field 'rank' .* out of range"),
        ({**good, "text": "x" * 600}, "field 'text' is longer than 512 bytes"),
        ({**good, "tags": ["a"] * 9}, "field 'tags' holds at most 8 elements"),
        ({**good, "score": "high"}, "field 'score' .* cannot hold 'high'"),
        ({**good, "_redline_ts_ms": 1}, r"fields \['_redline_ts_ms'\] are not part of the payload"),
    ]
    if pair.pk_type == "int64":
        cases.append(({**good, "doc_id": "doc:1"}, "doc_id is an INT64 key"))
    for row, message in cases:
        with pytest.raises(DeltaLogError, match=message):
            pair.writer.upsert_rows([row])
    assert pair.log.info().length == 0  # nothing refused reached the delta log


def test_collections_the_write_path_cannot_use_are_named_at_start(
    redis_url: str, milvus_service: Service
) -> None:
    uri = milvus_service.extra["uri"]
    client = connect_milvus(uri)
    name = f"bad{uuid.uuid4().hex[:8]}"
    made: list[str] = []

    def create(suffix: str, vector: DataType, auto_id: bool = False, dynamic: bool = True) -> str:
        schema = client.create_schema(auto_id=auto_id, enable_dynamic_field=dynamic)
        schema.add_field("pk", DataType.INT64, is_primary=True, auto_id=auto_id)
        params = {"dim": 16} if vector != DataType.SPARSE_FLOAT_VECTOR else {}
        schema.add_field("v", vector, **params)
        index = client.prepare_index_params()
        if vector == DataType.SPARSE_FLOAT_VECTOR:
            index.add_index("v", index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
        else:
            index.add_index("v", index_type="AUTOINDEX", metric_type="COSINE")
        client.create_collection(f"{name}_{suffix}", schema=schema, index_params=index)
        made.append(f"{name}_{suffix}")
        return f"{name}_{suffix}"

    try:
        sparse = r"has no FLOAT_VECTOR field \(fields: pk INT64, v SPARSE_FLOAT_VECTOR\)"
        cases = {
            create("sparse", DataType.SPARSE_FLOAT_VECTOR): sparse,
            create("auto", DataType.FLOAT_VECTOR, auto_id=True): "key field 'pk' has auto_id on",
            create("nodyn", DataType.FLOAT_VECTOR, dynamic=False): "nowhere to keep row versions",
        }  # fmt: skip
        for collection, message in cases.items():
            target = MilvusTarget(TargetSpec(uri, collection, "primary"), 16)
            with pytest.raises(
                IndexSchemaError, match=f"collection {collection} on primary.*{message}"
            ):
                target.ensure_collection()
            target.close()
        # the replicator process stops at start-up with the collection and field named
        process = subprocess.run(
            [sys.executable, "-m", "redline.cli", "index", "replicate", "--redis-url", redis_url,
             "--collection", name, "--dim", "16", "--primary-uri", uri, "--replica-uri", uri,
             "--primary-collection", f"{name}_p", "--replica-collection", f"{name}_sparse"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
        assert process.returncode == 2, process.stdout + process.stderr
        assert f"collection {name}_sparse on replica has no FLOAT_VECTOR field" in process.stderr
        assert redis.Redis.from_url(redis_url).exists(f"redline:index:{{{name}}}:log") == 0
    finally:
        for collection in made:
            client.drop_collection(collection)
        client.close()
