"""The index write path on real redis-server and a real Milvus Lite server: writer, freeze,
replay with verification, conflict resolution, and a replay killed with SIGKILL mid-way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from redline.devstack.processes import Service
from redline.platform.index import (
    DeltaLogError,
    Entry,
    IndexWriter,
    MilvusTarget,
    parse_entry,
    parse_stream_id,
    replay_delta_log,
    vector_checksum,
    verify_range,
)
from tests.support.index import OpenIndex, close_index, open_index

DIM = 16


def _open_index(redis_url: str, uri: str, region: str = "eu") -> OpenIndex:
    return open_index(redis_url, uri, f"t{uuid.uuid4().hex[:12]}", DIM, region)


@pytest.fixture()
def index(redis_url: str, milvus_service: Service) -> Iterator[OpenIndex]:
    """A fresh logical collection (primary + replica collections on the session Milvus)."""
    opened = _open_index(redis_url, milvus_service.extra["uri"])
    yield opened
    close_index(opened)


def _vectors(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _expect_state(target: MilvusTarget, expected: dict[str, np.ndarray | None]) -> None:
    """Every id is present with exactly the expected vector, or absent when deleted."""
    rows = target.fetch(list(expected), with_vectors=True)
    for row_id, vector in expected.items():
        if vector is None:
            assert row_id not in rows, f"{row_id} should be deleted on {target.name}"
            continue
        assert row_id in rows, f"{row_id} missing on {target.name}"
        got = rows[row_id].vector
        assert got is not None and np.array_equal(got, vector), f"{row_id} has the wrong vector"
        assert rows[row_id].checksum == vector_checksum(vector)


def test_writer_logs_every_write_then_applies_it_to_the_primary(index: OpenIndex) -> None:
    vectors = _vectors(10, 1)
    acks = index.writer.upsert_many([(f"doc-{i}", vectors[i]) for i in range(10)])
    gone = index.writer.delete("doc-3")
    assert all(a.applied for a in acks) and gone.applied
    raw = index.redis.xrange(index.log.stream_key)
    assert [sid.decode() for sid, _ in raw] == [a.stream_id for a in [*acks, gone]]
    first = raw[0][1]
    assert first[b"op"] == b"u" and first[b"id"] == b"doc-0" and first[b"region"] == b"eu"
    assert np.array_equal(np.frombuffer(first[b"vector"], "<f4"), vectors[0])
    assert first[b"checksum"].decode() == vector_checksum(vectors[0])
    assert raw[-1][1][b"op"] == b"d" and raw[-1][1][b"vector"] == b""
    # the packed server-side read decodes exactly what XRANGE holds
    assert _same_entries(
        index.log.read_after("0-0", 100), [parse_entry(sid, f, DIM) for sid, f in raw]
    )
    expected: dict[str, np.ndarray | None] = {f"doc-{i}": vectors[i] for i in range(10)}
    expected["doc-3"] = None
    _expect_state(index.primary, expected)
    assert index.replica.count() == 0  # nothing replicated yet: no replicator ran


def _same_entries(got: list[Entry], want: list[Entry]) -> bool:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a.stream_id, a.op, a.id, a.region, a.ts_ms, a.checksum) == (
            b.stream_id, b.op, b.id, b.region, b.ts_ms, b.checksum,
        )  # fmt: skip
        assert (a.vector is None and b.vector is None) or np.array_equal(a.vector, b.vector)
    return True


def test_a_malformed_entry_stops_the_replay_with_its_id(index: OpenIndex) -> None:
    index.writer.upsert("ok", _vectors(1, 10)[0])
    bad = index.redis.xadd(index.log.stream_key, {"op": "u", "id": "broken", "vector": b"xx"})
    with pytest.raises(DeltaLogError, match=rf"entry {bad.decode()}: malformed"):
        replay_delta_log(index.log, index.replica, batch_size=10)
    assert index.log.target_state("replica").checkpoint != bad.decode()  # nothing skipped


def test_freeze_1000_writes_replay_verifies_every_write_then_unfreeze(index: OpenIndex) -> None:
    before = _vectors(20, 2)
    index.writer.upsert_many([(f"pre-{i}", before[i]) for i in range(20)])
    state = index.writer.freeze("drill: index staleness over red line")
    assert index.writer.is_frozen() and state.reason.startswith("drill")

    fresh, rewritten = _vectors(900, 3), _vectors(50, 4)
    expected: dict[str, np.ndarray | None] = {f"pre-{i}": before[i] for i in range(20)}
    acks = []
    for start in range(0, 900, 100):
        rows = [(f"doc-{i}", fresh[i]) for i in range(start, start + 100)]
        acks += index.writer.upsert_many(rows)
        expected.update(rows)
    acks += index.writer.upsert_many([(f"doc-{i}", rewritten[i]) for i in range(50)])
    expected.update({f"doc-{i}": rewritten[i] for i in range(50)})
    acks += index.writer.write([("delete", f"doc-{i}", None) for i in range(850, 900)])
    expected.update({f"doc-{i}": None for i in range(850, 900)})
    assert len(acks) == 1000 and not any(a.applied for a in acks)
    assert index.primary.count() == 20  # frozen: the primary took none of them

    report = replay_delta_log(index.log, index.replica, batch_size=128)
    assert report.ok, report.summary()
    assert report.entries == 1020 and report.batches == 8
    assert report.verify.ids == len(expected) and report.verify.verified == len(expected)
    assert report.flushed
    _expect_state(index.replica, expected)
    assert index.replica.count() == 20 + 850
    assert index.log.replay_range("replica") is None  # verified: the range record is gone

    applied = index.writer.unfreeze()
    assert applied == 1000 and not index.writer.is_frozen()
    _expect_state(index.primary, expected)
    after = index.writer.upsert("late", _vectors(1, 5)[0])
    assert after.applied


def test_verification_detects_a_replica_that_does_not_match(index: OpenIndex) -> None:
    vectors = _vectors(30, 6)
    index.writer.upsert_many([(f"doc-{i}", vectors[i]) for i in range(30)])
    report = replay_delta_log(index.log, index.replica, batch_size=10, compact=False)
    assert report.ok
    client = index.replica.client()
    client.delete(index.replica.collection, ids=["doc-1"])  # lost behind our back
    tampered = {
        "id": "doc-2", "vector": vectors[3], "ts_ms": 0, "region": "eu",
        "checksum": vector_checksum(vectors[2]),
    }  # fmt: skip
    client.upsert(index.replica.collection, [tampered])
    row = index.replica.fetch(["doc-4"])["doc-4"]
    corrupt = {
        "id": "doc-4", "vector": vectors[5], "ts_ms": row.version.ts_ms, "region": "eu",
        "checksum": row.checksum,
    }  # fmt: skip
    client.upsert(index.replica.collection, [corrupt])
    result = verify_range(index.log, index.replica, report.after, report.until)
    assert (result.missing, result.stale, result.checksum_mismatches) == (1, 1, 1)
    assert set(result.mismatched_ids) == {"doc-1", "doc-2", "doc-4"}
    assert result.verified == 27 and not result.ok


def _conflict_run(redis_url: str, uri: str, order: str, batch_size: int) -> dict[str, object]:
    """Two regions write the same ids with different vectors, arriving in `order`."""
    ix = _open_index(redis_url, uri)
    try:
        eu = IndexWriter(ix.log, ix.primary, "eu")
        us = IndexWriter(ix.log, ix.primary, "us")
        a, b = _vectors(4, 7), _vectors(4, 8)
        writes = {
            # id: (eu write, us write); the expected winner is noted per id
            "x": (lambda: eu.write([("upsert", "x", a[0])], ts_ms=1000),
                  lambda: us.write([("upsert", "x", b[0])], ts_ms=2000)),  # us: later ts
            "y": (lambda: eu.write([("upsert", "y", a[1])], ts_ms=3000),
                  lambda: us.write([("upsert", "y", b[1])], ts_ms=3000)),  # us: tie -> region
            "z": (lambda: eu.write([("delete", "z", None)], ts_ms=5000),
                  lambda: us.write([("upsert", "z", b[2])], ts_ms=4000)),  # eu delete: later
            "w": (lambda: eu.write([("upsert", "w", a[3])], ts_ms=7000),
                  lambda: us.write([("delete", "w", None)], ts_ms=6000)),  # eu upsert: later
        }  # fmt: skip
        for first, second in writes.values():
            for write in (first, second) if order == "eu-first" else (second, first):
                write()
        report = replay_delta_log(ix.log, ix.replica, batch_size=batch_size, compact=False)
        assert report.ok, report.summary()
        rows = ix.replica.fetch(["x", "y", "z", "w"], with_vectors=True)
        return {
            "state": {
                k: (r.version.ts_ms, r.version.region, vector_checksum(r.vector))
                for k, r in rows.items()
                if r.vector is not None
            },
            "conflicts": report.conflicts,
            "expected": {
                "x": (2000, "us", vector_checksum(b[0])),
                "y": (3000, "us", vector_checksum(b[1])),
                "w": (7000, "eu", vector_checksum(a[3])),
            },
        }
    finally:
        close_index(ix)


def test_conflicts_resolve_to_the_last_writer_whatever_the_arrival_order(
    redis_url: str, milvus_service: Service
) -> None:
    uri = milvus_service.extra["uri"]
    runs = [
        _conflict_run(redis_url, uri, order, batch)
        for order in ("eu-first", "us-first")
        for batch in (1, 100)
    ]
    for run in runs:
        assert run["state"] == run["expected"]  # z deleted, the rest from the later writer
        assert run["conflicts"] == 4  # every id met a different write from the other region


def _replay_cmd(index: OpenIndex, redis_url: str) -> list[str]:
    return [
        sys.executable, "-m", "redline.cli", "index", "replay",
        "--redis-url", redis_url,
        "--collection", index.config.collection,
        "--dim", str(DIM),
        "--replica-uri", index.config.replica.uri,
        "--replica-collection", index.config.replica.collection,
        "--batch-size", "20",
        "--lease-ttl", "1",
        "--no-compact",
    ]  # fmt: skip


def test_replay_killed_with_sigkill_resumes_and_loses_nothing(
    index: OpenIndex, redis_url: str, tmp_path: Path
) -> None:
    vectors = _vectors(1500, 9)
    expected: dict[str, np.ndarray | None] = {}
    for start in range(0, 1500, 250):
        rows = [(f"doc-{i}", vectors[i]) for i in range(start, start + 250)]
        index.writer.upsert_many(rows)
        expected.update(rows)
    index.writer.write([("delete", f"doc-{i}", None) for i in range(0, 1500, 7)])
    expected.update({f"doc-{i}": None for i in range(0, 1500, 7)})
    last = index.log.last_id()
    total = index.log.info().length

    log_file = (tmp_path / "replay.log").open("wb")
    process = subprocess.Popen(
        [*_replay_cmd(index, redis_url), "--max-rows-per-second", "1000"],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        deadline = time.monotonic() + 30
        while index.log.target_state("replica").applied < total // 3:
            assert process.poll() is None, (tmp_path / "replay.log").read_text()
            assert time.monotonic() < deadline, "replay made no progress"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log_file.close()

    state = index.log.target_state("replica")
    assert parse_stream_id(state.checkpoint) < parse_stream_id(last), "killed too late"
    # the checkpoint never runs ahead: everything up to it is on the replica, as written
    upto = verify_range(index.log, index.replica, "0-0", state.checkpoint)
    assert upto.ok and upto.verified == upto.ids > 0, upto

    rerun = subprocess.run(
        _replay_cmd(index, redis_url), capture_output=True, text=True, timeout=60, check=False
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert '"resumed": true' in rerun.stdout and '"ok": true' in rerun.stdout
    final = index.log.target_state("replica")
    assert final.checkpoint == last and final.applied == total
    _expect_state(index.replica, expected)
    assert index.replica.count() == sum(v is not None for v in expected.values())
    full = verify_range(index.log, index.replica, "0-0", last)
    assert full.ok and full.verified == len(expected)
