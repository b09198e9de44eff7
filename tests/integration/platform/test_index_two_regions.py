"""Two regions writing one collection, on a real redis-server and two real Milvus Lite servers:
the same ids written from both sides at once (threads), some with equal content and some not;
both replicators run until idle; both copies must hold identical rows, every differing pair
must have exactly one conflict-map record, and verification must honour the map."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from pymilvus import DataType

from redline.devstack.processes import Service, start_milvus_lite
from redline.platform.index import (
    ConflictMap,
    DeltaLog,
    IndexWriter,
    MilvusTarget,
    Replicator,
    TargetSpec,
    VectorIdGenerator,
    connect_milvus,
    decode_vector_id,
    remap_id,
    replay_delta_log,
    row_checksum,
    verify_range,
)

DIM = 8
IDS = 40  # doc-0..39: even ids get equal content in both regions, odd ids different content


@pytest.fixture()
def second_milvus(tmp_path: Path) -> Iterator[Service]:
    """A second Milvus Lite server: the other region's copy."""
    service = start_milvus_lite(tmp_path / "milvus-us")
    yield service
    service.stop()


def _create(uri: str, name: str) -> None:
    client = connect_milvus(uri)
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("text", DataType.VARCHAR, max_length=128)
    schema.add_field("ts_ms", DataType.INT64)
    schema.add_field("region", DataType.VARCHAR, max_length=64)
    schema.add_field("checksum", DataType.VARCHAR, max_length=64)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="AUTOINDEX", metric_type="COSINE")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
    client.close()


def _rows(target: MilvusTarget) -> dict[str, tuple[str, bytes, str, int, str]]:
    """Every row of a copy: id -> (checksum recomputed, vector bytes, text, ts_ms, region)."""
    rows = target.client().query(
        target.collection, filter='id != ""', output_fields=["*"], limit=10_000,
        consistency_level="Strong",
    )  # fmt: skip
    found: dict[str, tuple[str, bytes, str, int, str]] = {}
    for row in rows:
        vector = np.asarray(row["vector"], dtype=np.float32)
        payload = target.schema().payload_of(row)
        found[str(row["id"])] = (
            row_checksum(vector, payload),
            vector.tobytes(),
            str(row["text"]),
            int(row["ts_ms"]),
            str(row["region"]),
        )
    return found


def _vector(seed: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


@dataclass
class Regions:
    """eu and us: each a delta log, a copy on its own Milvus Lite server and a writer."""

    client: redis.Redis
    collection: str
    logs: dict[str, DeltaLog]
    copies: dict[str, MilvusTarget]
    writers: dict[str, IndexWriter]

    def replicate(self) -> None:
        """Each region's replicator applies the OTHER region's log to its copy until idle."""
        replicators = [
            Replicator(self.logs["us"], self.copies["eu"], batch_size=7),
            Replicator(self.logs["eu"], self.copies["us"], batch_size=7),
        ]
        idle = 0
        for _ in range(200):
            applied = sum((r.step() or _idle()).entries for r in replicators)
            idle = idle + 1 if applied == 0 else 0
            if idle >= 2:
                return
        raise AssertionError("replicators did not become idle")


@pytest.fixture()
def regions(redis_url: str, milvus_service: Service, second_milvus: Service) -> Iterator[Regions]:
    collection = f"t{uuid.uuid4().hex[:10]}"
    uris = {"eu": milvus_service.extra["uri"], "us": second_milvus.extra["uri"]}
    client = redis.Redis.from_url(redis_url)
    found = Regions(client, collection, {}, {}, {})
    for code, (region, uri) in enumerate(uris.items()):
        _create(uri, collection)
        found.logs[region] = DeltaLog(client, collection, DIM, origin=region)
        found.copies[region] = MilvusTarget(TargetSpec(uri, collection, f"{region}-copy"), DIM)
        found.writers[region] = IndexWriter(
            found.logs[region], found.copies[region], region, ids=VectorIdGenerator(code + 1, 1)
        )
    yield found
    for target in found.copies.values():
        target.client().drop_collection(target.collection)
        target.close()
    client.close()


def test_two_regions_writing_the_same_ids_converge_with_every_conflict_recorded(
    regions: Regions,
) -> None:
    client, collection = regions.client, regions.collection
    logs, copies, writers = regions.logs, regions.copies, regions.writers
    barrier = threading.Barrier(2)
    generated: dict[str, list[str]] = {"eu": [], "us": []}
    errors: list[BaseException] = []

    def write(region: str, salt: int) -> None:
        try:
            barrier.wait()
            for start in range(0, IDS, 4):
                ops: list[Any] = []
                for i in range(start, start + 4):
                    same = i % 2 == 0
                    seed = i if same else 1000 * salt + i
                    text = f"doc {i}" if same else f"doc {i} from {region}"
                    ops.append(("upsert", f"doc-{i}", _vector(seed), {"text": text}))
                writers[region].write(ops)
            for k in range(3):  # rows without an id: generated, region-aware
                ack = writers[region].insert(_vector(5000 * salt + k), {"text": "new"})
                generated[region].append(ack.id)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [
        threading.Thread(target=write, args=("eu", 1)),
        threading.Thread(target=write, args=("us", 2)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    regions.replicate()

    eu, us = _rows(copies["eu"]), _rows(copies["us"])
    assert eu == us, "the two copies differ"
    conflicts = ConflictMap(client, collection)
    records = conflicts.records()
    differing = {f"doc-{i}" for i in range(1, IDS, 2)}
    assert sorted(r["id"] for r in records) == sorted(differing)  # one each, equal: none
    assert conflicts.counts() == {"remapped": len(differing)}
    pk_type = copies["eu"].schema().pk_type
    for record in records:
        winner, loser = record["winner"], record["loser"]
        assert (winner["ts_ms"], winner["region"]) > (loser["ts_ms"], loser["region"])
        assert record["remapped_id"] == remap_id(record["id"], loser["region"], "redline",
                                                 pk_type)  # fmt: skip
        # both contents kept: the winner under the id, the loser under the new id
        assert eu[record["id"]][0] == winner["checksum"]
        assert eu[record["remapped_id"]][0] == loser["checksum"]
        assert (
            eu[record["remapped_id"]][2]
            == f"{record['id'].replace('-', ' ')} from " + (loser["region"])
        )
    expected_ids = {f"doc-{i}" for i in range(IDS)} | {r["remapped_id"] for r in records}
    expected_ids |= set(generated["eu"]) | set(generated["us"])
    assert set(eu) == expected_ids
    for region, code in (("eu", 1), ("us", 2)):
        parts = [decode_vector_id(i) for i in generated[region]]
        assert {(p.region, p.node) for p in parts} == {(code, 1)}
        assert generated[region] == sorted(generated[region])

    # verification and replay honour the map: re-mapped writes are found under their new id
    remapped = 0
    for origin in ("eu", "us"):
        for region in ("eu", "us"):
            report = verify_range(logs[origin], copies[region], "0-0", logs[origin].last_id())
            assert report.ok, (origin, region, report)
            remapped += report.remapped
    assert remapped == 2 * len(differing)  # each losing write, on both copies
    logs["us"].redis.delete(logs["us"].target_key("eu-copy"))  # replay eu's copy from 0
    replay = replay_delta_log(logs["us"], copies["eu"], compact=False)
    assert replay.ok, replay.summary()
    assert _rows(copies["eu"]) == us


def test_an_upsert_the_other_region_deleted_stays_dead_when_that_region_writes_again(
    regions: Regions,
) -> None:
    """eu writes doc-x, us deletes it after (both replicated), and a minute later us writes it
    again: no conflict at either writer or replicator, no re-mapped row, both copies alike."""
    eu, us = regions.writers["eu"], regions.writers["us"]
    eu.write([("upsert", "doc-x", _vector(1), {"text": "from eu"})], ts_ms=1_000_000)
    us.write([("delete", "doc-x", None)], ts_ms=1_000_001)
    regions.replicate()
    us.write([("upsert", "doc-x", _vector(2), {"text": "from us"})], ts_ms=1_060_000)
    regions.replicate()
    rows = {region: _rows(copy) for region, copy in regions.copies.items()}
    assert rows["eu"] == rows["us"]
    assert {i: row[2:] for i, row in rows["eu"].items()} == {"doc-x": ("from us", 1_060_000, "us")}
    assert ConflictMap(regions.client, regions.collection).records() == []


class _idle:
    entries = 0
