"""Keeping the delta log bounded on a real redis-server (and Milvus Lite for the replays): the
trim keeps what every copy, freeze and replay needs; a trim killed with SIGKILL half-way
through a large log leaves it consistent and the next one finishes; replicas replay after a trim
and converge; tombstones every copy is past are pruned; a copy the trim did not know about is
stopped instead of silently skipping entries."""

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
import redis

from redline.devstack.processes import Service
from redline.platform.index import (
    DeltaApplier,
    DeltaLog,
    DeltaLogError,
    MilvusTarget,
    TargetSpec,
    Version,
    new_token,
    parse_stream_id,
    parse_tombstone,
    replay_delta_log,
    trim_delta_log,
    verify_range,
)
from tests.support.index import OpenIndex, close_index, open_index

DIM = 4


@pytest.fixture()
def index(redis_url: str, milvus_service: Service) -> Iterator[OpenIndex]:
    """A fresh logical collection on the session's Milvus and Redis."""
    opened = open_index(redis_url, milvus_service.extra["uri"], f"r{uuid.uuid4().hex[:10]}",
                        DIM, "eu")  # fmt: skip
    yield opened
    close_index(opened)


def _advance(log: DeltaLog, target: str, checkpoint: str, entries: int = 1) -> None:
    """Put a target's checkpoint at `checkpoint` (after `entries` entries) the way an applier
    does (lease, script)."""
    token = new_token()
    assert log.acquire(target, token, 5.0)
    assert log.advance(target, token, checkpoint, entries, 0, False)
    log.release(target, token)


def _ids(log: DeltaLog) -> list[str]:
    return [sid.decode() for sid, _ in log.redis.xrange(log.stream_key)]


def _after(ids: list[str], point: str) -> list[str]:
    return [i for i in ids if parse_stream_id(i) > parse_stream_id(point)]


def test_trim_keeps_what_each_replica_freeze_and_replay_needs(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    log = DeltaLog(client, "needs", DIM)
    vector = np.ones(DIM, dtype=np.float32)
    ids = [sid for sid, _ in log.append([("upsert", f"d{i}", vector) for i in range(100)], "eu", 1)]
    assert trim_delta_log(log, 0).point is None  # no copy registered: nothing is safe to remove
    assert log.info().length == 100

    _advance(log, "fast", ids[90])
    _advance(log, "slow", ids[60])
    log.set_replay_range("fast", ids[40], ids[95])  # an unfinished replay of fast from 40
    report = trim_delta_log(log, 0)
    assert report.point == ids[40] and report.removed == 40
    assert _ids(log) == ids[40:] and log.trimmed_point() == ids[40]
    log.clear_replay_range("fast")
    log.freeze("drill", "primary", since=ids[50])  # the primary's catch-up needs after 50
    assert log.targets() == {"fast": "replica", "slow": "replica", "primary": "primary"}
    assert trim_delta_log(log, 0).point == ids[50] and _ids(log) == ids[50:]
    log.redis.delete(log.frozen_key)  # unfrozen: the primary no longer holds the log back
    assert trim_delta_log(log, 0).point == ids[60] and _ids(log) == ids[60:]
    # the retention keeps history behind the slowest copy (ids here share one millisecond or so)
    assert trim_delta_log(log, 3600).removed == 0
    assert log.forget_target("slow") and not log.forget_target("slow")
    assert trim_delta_log(log, 0).point == ids[90] and _ids(log) == ids[90:]
    client.close()


def _fill(log: DeltaLog, entries: int, chunk: int = 5000) -> None:
    """Append `entries` small upserts (through the log's own append)."""
    vectors = np.random.default_rng(0).standard_normal((chunk, DIM)).astype(np.float32)
    for start in range(0, entries, chunk):
        ops = [("upsert", f"doc-{(start + i) % 1000}", vectors[i]) for i in range(chunk)]
        log.append(ops, "eu", int(time.time() * 1000))  # type: ignore[arg-type]


def test_trim_killed_with_sigkill_mid_way_leaves_the_log_consistent(
    redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    collection = f"big{uuid.uuid4().hex[:8]}"
    log = DeltaLog(client, collection, DIM)
    total = 200_000
    _fill(log, total)
    keep_from = log.redis.xrevrange(log.stream_key, count=20_000)[-1][0].decode()
    # the replica applied all but the last 19 999 entries
    _advance(log, "replica", keep_from, total - 19_999)
    needed = log.redis.xrange(log.stream_key, f"({keep_from}", "+")
    assert len(needed) == 19_999 and log.info().length == total

    argv = [sys.executable, "-m", "redline.cli", "index", "trim", "--redis-url", redis_url,
            "--collection", collection, "--retention-seconds", "0", "--chunk", "100",
            "--pause-seconds", "0.002"]  # fmt: skip
    with (tmp_path / "trim.log").open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while log.info().length >= total - 20_000:  # well into the trim, far from its end
            assert process.poll() is None, (tmp_path / "trim.log").read_text()
            assert time.monotonic() < deadline, "the trim made no progress"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    length = log.info().length
    assert 20_000 < length < total - 20_000, "killed too late or too early"
    # what remains is a suffix of the log holding every entry the replica needs, unchanged
    assert log.redis.xrange(log.stream_key, f"({keep_from}", "+") == needed
    first = log.info().first_id
    assert first is not None and parse_stream_id(first) <= parse_stream_id(keep_from)
    assert log.trimmed_point() == keep_from

    rerun = subprocess.run(argv[:-2], capture_output=True, text=True, timeout=60, check=False)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert _ids(log) == [keep_from] + [sid.decode() for sid, _ in needed]
    assert log.info().entries_added == total  # pending counts stay right after trims
    assert log.pending("replica")[0] == 19_999
    client.close()


def test_replicas_replay_after_a_trim_and_tombstones_are_pruned(index: OpenIndex) -> None:
    rng = np.random.default_rng(1)
    expected: dict[str, np.ndarray | None] = {}
    lagging = MilvusTarget(
        TargetSpec(index.config.replica.uri, f"{index.config.collection}_l", "lagging"), DIM
    )
    lagging.ensure_collection()
    try:
        for round_ in range(3):
            vectors = rng.standard_normal((300, DIM)).astype(np.float32)
            index.writer.upsert_many([(f"doc-{i}", vectors[i]) for i in range(300)])
            expected.update({f"doc-{i}": vectors[i] for i in range(300)})
            gone = [f"doc-{i}" for i in range(round_, 300, 11)]
            index.writer.write([("delete", row_id, None) for row_id in gone])
            expected.update(dict.fromkeys(gone))
            if round_ == 0:  # the lagging replica applies the first round only
                assert replay_delta_log(index.log, lagging, batch_size=64, compact=False).ok
        assert replay_delta_log(index.log, index.replica, batch_size=64, compact=False).ok
        tombstones = index.redis.hlen(index.log.tombstone_key("replica"))
        assert tombstones > 0
        assert all(parse_tombstone(v)[2] for v in
                   index.redis.hvals(index.log.tombstone_key("replica")))  # fmt: skip

        lagging_tombstones = index.redis.hlen(index.log.tombstone_key("lagging"))
        assert lagging_tombstones == 28

        report = trim_delta_log(index.log, 0)
        lag_point = index.log.target_state("lagging").checkpoint
        assert report.point == lag_point and report.removed == 300 + 28 - 1
        # deletes every copy is past are pruned (the lagging one's but its last, at the point);
        # the up-to-date replica's are all after the point and stay
        assert report.tombstones_pruned == 27
        assert index.redis.hlen(index.log.tombstone_key("replica")) == tombstones
        for target in ("replica", "lagging"):
            for value in index.redis.hvals(index.log.tombstone_key(target)):
                sid = parse_tombstone(value)[2]
                assert parse_stream_id(sid) >= parse_stream_id(lag_point)

        # the lagging replica replays from its checkpoint after the trim and converges
        late = replay_delta_log(index.log, lagging, batch_size=64, compact=False)
        assert late.ok and late.entries == 2 * 328, late.summary()
        for target in (index.replica, lagging):
            rows = target.fetch(list(expected), with_vectors=True)
            for row_id, vector in expected.items():
                if vector is None:
                    assert row_id not in rows, f"{row_id} resurrected on {target.name}"
                else:
                    got = rows[row_id].vector
                    assert got is not None and np.array_equal(got, vector), row_id
        assert verify_range(index.log, lagging, lag_point, index.log.last_id()).ok
    finally:
        lagging.client().drop_collection(lagging.collection)
        lagging.close()


def test_a_copy_the_trim_did_not_know_about_stops_instead_of_skipping(index: OpenIndex) -> None:
    vectors = np.random.default_rng(2).standard_normal((50, DIM)).astype(np.float32)
    index.writer.upsert_many([(f"doc-{i}", vectors[i]) for i in range(50)])
    assert replay_delta_log(index.log, index.replica, batch_size=10, compact=False).ok
    assert trim_delta_log(index.log, 0).removed == 49
    stranger = MilvusTarget(
        TargetSpec(index.config.replica.uri, f"{index.config.collection}_x", "stranger"), DIM
    )
    stranger.ensure_collection()
    try:
        with pytest.raises(DeltaLogError, match="stranger .* behind the log's trim point"):
            DeltaApplier(index.log, stranger).apply_batch(10)
        assert stranger.count() == 0 and "stranger" not in index.log.targets()
    finally:
        stranger.client().drop_collection(stranger.collection)
        stranger.close()


def test_pruning_keeps_a_tombstone_recorded_again_meanwhile(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    log = DeltaLog(client, "prune", DIM)
    log.set_tombstones("r", {"a": Version(1, "eu"), "b": Version(2, "eu")},
                       {"a": "100-0", "b": "300-0"})  # fmt: skip
    client.hset(log.tombstone_key("r"), "old", "50|eu")  # a record of the previous release
    assert log.prune_tombstones("r", "200-0") == 2
    assert set(log.tombstones("r", ["a", "b", "old"])) == {"b"}
    # a field is deleted only if it still holds the value read: a delete recorded again between
    # the scan and the prune is newer and stays
    assert log._prune(keys=[log.tombstone_key("r")], args=["b", "2|eu|100-0"]) == 0
    assert log.tombstones("r", ["b"]) == {"b": Version(2, "eu")}
    client.close()
