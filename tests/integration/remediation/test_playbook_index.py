"""`freeze_writes`, `delta_log_replay`, `freeze_and_replay` on a real redis-server and a real
Milvus Lite server, driven by the real receiver and workers (threads, and a worker process
killed with SIGKILL in the middle of a replay)."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import redis

from redline.devstack.processes import Service
from redline.platform.index import (
    DeltaLog,
    IndexWriter,
    MilvusTarget,
    build_fields,
    parse_stream_id,
    vector_checksum,
    verify_range,
)
from redline.remediation.jobs import Job
from redline.remediation.settings import RemediationSettings
from tests.support.index import OpenIndex, close_index, open_index
from tests.support.playbook import (
    deliver,
    playbook_settings,
    real_workers,
    records,
    run_jobs,
    worker_process,
)
from tests.support.remediation import alert, store_for, wait_for, wait_terminal

DIM = 8
Vectors = npt.NDArray[np.float32]


@dataclass
class Index(OpenIndex):
    """A logical collection (delta log, primary, replica) and remediation settings for it."""

    expected: dict[str, Vectors | None]
    base: dict[str, Any]
    redis_url: str

    @property
    def name(self) -> str:
        """The logical collection (the alerts' `collection` label)."""
        return self.config.collection

    def settings(self, **vector_index: Any) -> RemediationSettings:
        """Remediation settings whose `vector_index` section describes this collection."""
        section = {**self.base, **vector_index}
        return playbook_settings(self.redis_url, vector_index=section)

    def write(self, ops: list[tuple[str, str, Vectors | None]], writer: IndexWriter | None = None,
              ts_ms: int | None = None) -> list[Any]:  # fmt: skip
        """Write through the index writer; remember each id's last acknowledged write."""
        acks = (writer or self.writer).write(ops, ts_ms)  # type: ignore[arg-type]
        for op, row_id, vector in ops:
            self.expected[row_id] = vector if op == "upsert" else None
        return acks

    def frozen(self) -> bool:
        """True while writes are frozen."""
        return self.log.freeze_state() is not None

    def assert_replica_holds_every_acknowledged_write(self) -> None:
        """Each id is on the replica with exactly its last acknowledged vector, or absent."""
        rows = self.replica.fetch(list(self.expected), with_vectors=True)
        live = {k: v for k, v in self.expected.items() if v is not None}
        for row_id, vector in self.expected.items():
            if vector is None:
                assert row_id not in rows, f"{row_id} was deleted but is on the replica"
                continue
            assert row_id in rows, f"acknowledged write {row_id} is missing on the replica"
            got = rows[row_id].vector
            assert got is not None and np.array_equal(got, vector), f"{row_id}: wrong vector"
            assert rows[row_id].checksum == vector_checksum(vector)
        assert self.replica.count() == len(live)


def _vectors(count: int, seed: int) -> Vectors:
    return np.random.default_rng(seed).standard_normal((count, DIM)).astype(np.float32)


@pytest.fixture()
def index(redis_url: str, milvus_service: Service) -> Iterator[Index]:
    """A fresh collection pair on the session's Milvus Lite; the replica has no replicator."""
    uri = milvus_service.extra["uri"]
    name = f"pb{uuid.uuid4().hex[:10]}"
    ix = open_index(redis_url, uri, name, DIM, "primary")
    base = {
        "collections": {
            name: {
                "dim": DIM,
                "primary_uri": uri,
                "primary_collection": f"{name}_p",
                "replica_uri": uri,
                "replica_collection": f"{name}_r",
            }
        },
        "batch_size": 200,
        "lease_ttl_seconds": 1.0,
        "lease_wait_seconds": 20.0,
    }
    yield Index(ix.config, ix.redis, ix.log, ix.primary, ix.replica, ix.writer, {}, base, redis_url)
    close_index(ix)


def _alert(playbook: str, fingerprint: str, index: Index, **kwargs: Any) -> dict[str, Any]:
    labels = {"alertname": "IndexStaleness", "collection": index.name, **kwargs.pop("labels", {})}
    return alert(fingerprint, playbook=playbook, labels=labels, **kwargs)


def _step(job: Job, phase: str, name: str) -> dict[str, Any]:
    [step] = [s for s in job.steps if s["phase"] == phase and s["name"] == name]
    return step


def test_freeze_1000_writes_replay_verifies_every_write_then_unfreezes(index: Index) -> None:
    settings = index.settings()
    before = _vectors(50, 1)
    index.write([("upsert", f"pre-{i}", before[i]) for i in range(50)])
    assert index.primary.count() == 50 and index.replica.count() == 0  # the replica lags

    started = datetime.now(UTC)
    [frozen] = run_jobs(settings, _alert("freeze_writes", "b0000000000000b1", index,
                                         starts_at=started))  # fmt: skip
    assert frozen.status == "succeeded", frozen.error
    assert index.frozen()
    assert "remediation job" in _step(frozen, "execute", "freeze")["data"]["reason"]

    # 1000 writes while frozen: new rows, overwrites, deletes, and a second region's older
    # writes to the same ids (conflicts the replay must resolve to the last writer).
    fresh = _vectors(900, 2)
    acks = []
    for start in range(0, 900, 150):
        acks += index.write([("upsert", f"doc-{i}", fresh[i]) for i in range(start, start + 150)])
    again = _vectors(40, 3)
    acks += index.write([("upsert", f"pre-{i}", again[i]) for i in range(40)])
    acks += index.write([("delete", f"doc-{i}", None) for i in range(0, 400, 20)])
    secondary = IndexWriter(index.log, index.primary, "secondary")
    older = int(datetime.now(UTC).timestamp() * 1000) - 60_000
    stale = _vectors(40, 4)
    conflicting = [("upsert", f"doc-{i}", stale[k]) for k, i in enumerate(range(500, 540))]
    acks += secondary.write(conflicting, ts_ms=older)  # type: ignore[arg-type]
    for _, row_id, _ in conflicting:
        index.expected[row_id] = fresh[int(row_id.split("-")[1])]  # the later write wins
    assert len(acks) == 1000 and not any(a.applied for a in acks)
    assert index.primary.count() == 50  # the freeze held: nothing reached the primary

    # The freeze's resolution without a replay leaves writes frozen, and says why.
    [resolved] = run_jobs(settings, _alert("freeze_writes", "b0000000000000b1", index,
                                           status="resolved", starts_at=started))  # fmt: skip
    assert resolved.status == "succeeded", resolved.error
    kept = _step(resolved, "resolve", "unfreeze_if_verified")
    assert kept["data"]["left_frozen"] is True and "did not verify a replay" in kept["detail"]
    assert index.frozen()

    replay_start = datetime.now(UTC)
    [replay] = run_jobs(settings, _alert("delta_log_replay", "b0000000000000b2", index,
                                         starts_at=replay_start))  # fmt: skip
    assert replay.status == "succeeded", replay.error
    data = _step(replay, "execute", "replay")["data"]
    assert data["replay_verified"] is True and data["mismatches"] == 0
    assert data["applied"] == 1050 and data["conflicts"] >= 40
    batches = records(replay, "batch")
    assert len(batches) == data["batches"] == 6  # 1050 entries in batches of 200
    assert [b["data"]["start"] for b in batches[1:]] == [
        b["data"]["checkpoint"] for b in batches[:-1]
    ]
    assert not index.frozen()
    index.assert_replica_holds_every_acknowledged_write()
    report = verify_range(index.log, index.replica, "0-0", index.log.last_id())
    assert report.ok and report.ids == len(index.expected)
    # Unfrozen only after the verification, and the primary caught up with the frozen writes.
    unfreeze = _step(replay, "execute", "unfreeze")
    assert unfreeze["data"]["applied"] == 1000
    assert unfreeze["at"] > _step(replay, "execute", "replay")["at"]
    assert index.primary.count() == index.replica.count()

    [done] = run_jobs(settings, _alert("delta_log_replay", "b0000000000000b2", index,
                                       status="resolved", starts_at=replay_start))  # fmt: skip
    assert done.status == "succeeded", done.error
    assert "not frozen" in _step(done, "resolve", "unfreeze_if_verified")["detail"]
    assert not index.frozen()

    # Someone freezes again after the verified replay: a late resolution must not lift that.
    index.writer.freeze("operator: maintenance")
    again_start = datetime.now(UTC)
    [again] = run_jobs(settings, _alert("delta_log_replay", "b0000000000000b5", index,
                                        starts_at=again_start))  # fmt: skip
    assert again.status == "succeeded", again.error  # replayed (nothing new), verified, unfrozen
    assert not index.frozen()
    index.writer.freeze("operator: maintenance, again")
    [late] = run_jobs(settings, _alert("delta_log_replay", "b0000000000000b5", index,
                                       status="resolved", starts_at=again_start))  # fmt: skip
    kept = _step(late, "resolve", "unfreeze_if_verified")
    assert kept["data"]["left_frozen"] is True and "frozen again" in kept["detail"]
    assert index.frozen()


def test_a_replay_that_cannot_verify_leaves_writes_frozen(index: Index) -> None:
    settings = index.settings()
    vectors = _vectors(300, 5)
    index.write([("upsert", f"doc-{i}", vectors[i]) for i in range(300)])
    # A corrupted delta-log entry: its checksum does not describe its vector.
    fields = build_fields("upsert", "doc-7", "primary", 2**41, vectors[7])
    fields["checksum"] = vector_checksum(vectors[8]).encode()
    index.redis.xadd(index.log.stream_key, fields)  # type: ignore[arg-type]
    started = datetime.now(UTC)
    [job] = run_jobs(settings, _alert("freeze_and_replay", "b0000000000000b3", index,
                                      starts_at=started))  # fmt: skip
    assert job.status == "failed"
    assert job.error is not None and "did not verify" in job.error
    assert "1 checksum mismatches" in job.error and "doc-7" in job.error
    assert "writes stay frozen" in job.error
    assert index.frozen()
    assert [s["name"] for s in job.steps if s["phase"] == "execute"] == ["freeze", "replay"]
    # The range stays recorded, so a later run verifies all of it again.
    assert index.log.replay_range("replica") is not None

    [resolved] = run_jobs(settings, _alert("freeze_and_replay", "b0000000000000b3", index,
                                           status="resolved", starts_at=started))  # fmt: skip
    assert resolved.status == "succeeded", resolved.error
    kept = _step(resolved, "resolve", "unfreeze_if_verified")
    assert kept["data"]["left_frozen"] is True
    assert f"the firing job {job.id} ended failed" in kept["detail"]
    assert index.frozen()


def test_worker_killed_mid_replay_job_is_reclaimed_nothing_lost_or_applied_twice(
    index: Index, tmp_path: Path
) -> None:
    # Small, slowed batches so the kill lands in the middle of the replay.
    settings = index.settings(batch_size=40, max_rows_per_second=300.0, compact=False)
    vectors = _vectors(1000, 6)
    for start in range(0, 1000, 250):
        index.write([("upsert", f"doc-{i}", vectors[i]) for i in range(start, start + 250)])
    index.write([("delete", f"doc-{i}", None) for i in range(0, 1000, 50)])
    total = 1020
    # Watch the invariant through both attempts' batches: everything up to the replica's
    # checkpoint is on the replica. Only while batches are applied: a Milvus Lite flush (the
    # replay's, after its last batch) makes concurrent reads by id miss rows for a moment.
    stop = threading.Event()
    violations: list[str] = []
    checks = [0]

    def watch() -> None:
        client = redis.Redis.from_url(index.redis_url)
        log = DeltaLog(client, index.name, DIM)
        replica = MilvusTarget(index.config.replica, DIM)
        try:
            while not stop.is_set():
                state = log.target_state("replica")
                if state.applied >= total:
                    stop.wait(0.05)
                    continue
                report = verify_range(log, replica, "0-0", state.checkpoint)
                if log.target_state("replica").applied >= total:
                    continue  # the flush may have overlapped this check: inconclusive
                checks[0] += 1
                if not report.ok:
                    violations.append(f"checkpoint {state.checkpoint} ahead of data: {report}")
                stop.wait(0.05)
        finally:
            replica.close()
            client.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    [job_id] = deliver(settings, _alert("freeze_and_replay", "b0000000000000b4", index,
                                        starts_at=datetime.now(UTC)))  # fmt: skip
    victim = worker_process(settings, tmp_path, tmp_path / "victim.log")
    store, client = store_for(settings)
    try:
        wait_for(
            lambda: index.log.target_state("replica").applied >= 200,
            timeout=60,
            what="a few batches replayed by the worker process",
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        at_kill = index.log.target_state("replica")
        assert 200 <= at_kill.applied < total, "the kill must land in the middle of the replay"
        assert index.frozen()
        with real_workers(settings):
            job = wait_terminal(store, job_id, timeout=60)
    finally:
        stop.set()
        watcher.join(timeout=10)
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        client.close()
    assert job.status == "succeeded", job.error
    assert job.attempts == 2
    assert violations == [] and checks[0] > 5
    # The second attempt resumed from the checkpoint: the batches of both attempts tile the log.
    batches = records(job, "batch")
    assert {b["attempt"] for b in batches} == {1, 2}
    first_of_second = next(b for b in batches if b["attempt"] == 2)
    last_of_first = [b for b in batches if b["attempt"] == 1][-1]
    assert parse_stream_id(first_of_second["data"]["start"]) >= parse_stream_id(
        last_of_first["data"]["checkpoint"]
    )
    assert first_of_second["data"]["start"] == at_kill.checkpoint
    replay = next(s for s in job.steps if s["name"] == "replay" and s["phase"] == "execute")
    assert replay["attempt"] == 2 and replay["data"]["resumed"] is True
    assert replay["data"]["replay_verified"] is True and replay["data"]["range"][0] == "0-0"
    # Each entry advanced the checkpoint exactly once; every write is there, once.
    final = index.log.target_state("replica")
    assert final.applied == total and final.checkpoint == index.log.last_id()
    index.assert_replica_holds_every_acknowledged_write()
    assert not index.frozen()


def test_dry_run_of_each_index_playbook_changes_nothing(index: Index) -> None:
    settings = index.settings()
    vectors = _vectors(30, 7)
    index.write([("upsert", f"doc-{i}", vectors[i]) for i in range(30)])
    before = index.log.target_state("replica")
    dry = {"labels": {"dry_run": "true"}, "starts_at": datetime.now(UTC)}
    jobs = run_jobs(
        settings,
        _alert("freeze_writes", "b0000000000000c1", index, **dry),
        _alert("delta_log_replay", "b0000000000000c2", index, **dry),
        _alert("freeze_and_replay", "b0000000000000c3", index, **dry),
    )
    assert [j.status for j in jobs] == ["planned"] * 3
    assert [[s["name"] for s in j.plan or []] for j in jobs] == [
        ["freeze"],
        ["replay", "unfreeze"],
        ["freeze", "replay", "unfreeze"],
    ]
    replay_plan = (jobs[2].plan or [])[1]["params"]
    assert replay_plan["pending"] == 30 and replay_plan["from"] == "0-0"
    assert not index.frozen()
    assert index.log.target_state("replica") == before
    assert index.replica.count() == 0
    assert index.log.replay_range("replica") is None


def test_an_unconfigured_collection_fails_with_the_allowed_names(index: Index) -> None:
    [job] = run_jobs(
        index.settings(),
        _alert("delta_log_replay", "b0000000000000d1", index, labels={"collection": "nope"}),
    )
    assert job.status == "failed"
    assert job.error == (
        "collection 'nope' is not configured under vector_index.collections "
        f"(configured: {index.name})"
    )
