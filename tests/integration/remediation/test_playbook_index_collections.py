"""`freeze_and_replay` on a user's collection (a VARCHAR key named `uid`, a vector named
`dense`, scalar and dynamic fields) on a real Milvus Lite server and redis-server, driven by the
real receiver and worker: the replica is created like the primary, every row arrives field by
field; a collection the write path cannot use fails the job at its plan, named."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
import redis
from pymilvus import DataType, MilvusClient

from redline.devstack.processes import Service
from redline.platform.index import (
    VERSION_KEYS,
    DeltaLog,
    IndexWriter,
    MilvusTarget,
    TargetSpec,
    connect_milvus,
)
from tests.support.playbook import playbook_settings, run_jobs
from tests.support.remediation import alert

DIM = 8


def _create(client: MilvusClient, name: str, dynamic: bool = True) -> None:
    schema = client.create_schema(auto_id=False, enable_dynamic_field=dynamic)
    schema.add_field("uid", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("dense", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("chunk", DataType.VARCHAR, max_length=256)
    schema.add_field("position", DataType.INT64)
    schema.add_field("labels", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=4,
                     max_length=16)  # fmt: skip
    index = client.prepare_index_params()
    index.add_index("dense", index_type="AUTOINDEX", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")


@pytest.fixture()
def names(milvus_service: Service) -> Iterator[tuple[str, MilvusClient]]:
    """A logical collection name; its collections are dropped afterwards."""
    name = f"uc{uuid.uuid4().hex[:10]}"
    client = connect_milvus(milvus_service.extra["uri"])
    yield name, client
    for suffix in ("_p", "_r"):
        client.drop_collection(f"{name}{suffix}")
    client.close()


def _settings(redis_url: str, uri: str, name: str) -> Any:
    section = {
        "collections": {
            name: {
                "dim": DIM, "primary_uri": uri, "primary_collection": f"{name}_p",
                "replica_uri": uri, "replica_collection": f"{name}_r", "metric_type": "L2",
            }
        },
        "batch_size": 50,
        "lease_ttl_seconds": 1.0,
        "lease_wait_seconds": 20.0,
    }  # fmt: skip
    return playbook_settings(redis_url, vector_index=section)


def _rows(count: int, seed: int, version: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        row: dict[str, Any] = {
            "uid": f"chunk-{i}",
            "dense": rng.standard_normal(DIM).astype(np.float32),
            "chunk": f"text of chunk {i}, version {version}",
            "position": i * 1000 + version,
            "labels": ["doc", f"v{version}"],
        }
        if i % 3 == 0:
            row["source"] = {"url": f"https://example.com/{i}", "v": version}  # dynamic
        rows.append(row)
    return rows


def test_freeze_and_replay_copies_a_user_collection_field_by_field(
    names: tuple[str, MilvusClient], redis_url: str, milvus_service: Service
) -> None:
    name, client = names
    uri = milvus_service.extra["uri"]
    _create(client, f"{name}_p")
    r = redis.Redis.from_url(redis_url)
    log = DeltaLog(r, name, DIM)
    primary = MilvusTarget(TargetSpec(uri, f"{name}_p", "primary"), DIM, metric_type="L2")
    writer = IndexWriter(log, primary, "primary")
    try:
        writer.upsert_rows(_rows(60, 1, 0))
        writer.freeze("operator")  # the alert's job finds writes already frozen
        writer.upsert_rows(_rows(80, 2, 1))  # rewrites 0..59, new 60..79
        writer.write([("delete", f"chunk-{i}", None) for i in range(0, 80, 7)])
        started = datetime.now(UTC)
        labels = {"alertname": "IndexStaleness", "collection": name}
        [job] = run_jobs(
            _settings(redis_url, uri, name),
            alert("b0000000000000e1", playbook="freeze_and_replay", labels=labels,
                  starts_at=started),
        )  # fmt: skip
        assert job.status == "succeeded", job.error
        replay = [s for s in job.steps if s["phase"] == "execute" and s["name"] == "replay"][0]
        assert replay["data"]["replay_verified"] is True
        assert replay["data"]["verified"] == 80
        assert log.freeze_state() is None  # unfrozen after the verified replay

        # the replica was created like the primary, and holds every field of every row
        described = client.describe_collection(f"{name}_r")
        assert [f["name"] for f in described["fields"]] == [
            "uid", "dense", "chunk", "position", "labels",
        ]  # fmt: skip
        assert described["enable_dynamic_field"] is True
        ids = [f"chunk-{i}" for i in range(80)]

        def rows(collection: str) -> dict[str, dict[str, Any]]:
            got = client.get(collection, ids=ids, output_fields=["*"], strict_float32=True)
            return {
                g["uid"]: {k: v.tolist() if isinstance(v, np.ndarray) else v
                           for k, v in g.items() if k not in VERSION_KEYS}
                for g in got
            }  # fmt: skip

        expected = {r["uid"]: {**r, "dense": r["dense"].tolist()} for r in _rows(80, 2, 1)}
        for i in range(0, 80, 7):
            del expected[f"chunk-{i}"]
        assert rows(f"{name}_r") == expected
        assert rows(f"{name}_p") == expected  # the primary caught up on unfreeze
    finally:
        primary.close()
        r.close()


def test_a_collection_the_write_path_cannot_use_fails_the_job_named(
    names: tuple[str, MilvusClient], redis_url: str, milvus_service: Service
) -> None:
    name, client = names
    uri = milvus_service.extra["uri"]
    _create(client, f"{name}_p", dynamic=False)
    _create(client, f"{name}_r", dynamic=False)
    [job] = run_jobs(
        _settings(redis_url, uri, name),
        alert("b0000000000000e2", playbook="delta_log_replay",
              labels={"alertname": "IndexStaleness", "collection": name}),
    )  # fmt: skip
    assert job.status == "failed"
    assert f"collection {name}_r on replica has nowhere to keep row versions" in str(job.error)
    assert job.attempts == 1  # a schema error is not retried
