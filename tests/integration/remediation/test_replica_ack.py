"""The worker's audit records and the receiver's 202 with `redis.min_replicas_ack`, against a
real Redis primary and replica: an acknowledged record is on the replica; without the replica the
append is reported as not acknowledged (ReplicaAckError, a 503 at the receiver), and a job whose
records were not acknowledged is never taken as done: it is reclaimed and finished once the
replica is back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
import yaml

from redline.core.redisconn import ReplicaAckError
from redline.remediation.audit import AuditLog, verify_file
from redline.remediation.jobs import GROUP
from redline.remediation.models import Alert, job_id_for
from redline.remediation.settings import RemediationSettings
from redline.remediation.worker import Worker
from tests.support.remediation import (
    alert,
    make_settings,
    open_registry,
    payload,
    post,
    receiver,
    store_for,
    wait_terminal,
)
from tests.support.replicas import Replicated, replicated_redis

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
# Long enough for a loaded CI machine's replica to answer WAIT; the refusals wait it out once.
TIMEOUT_MS = 2000


@pytest.fixture()
def pair(tmp_path: Path) -> Iterator[Replicated]:
    with replicated_redis(tmp_path) as running:
        yield running


def spec_with_ack(tmp_path: Path, replicas: int, timeout_ms: int) -> Path:
    """The default spec with `redis.min_replicas_ack` set."""
    spec = yaml.safe_load((ROOT / "slo/specs/default.yaml").read_text("utf-8"))
    spec["redis"] = {"min_replicas_ack": replicas, "ack_timeout_ms": timeout_ms}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec), "utf-8")
    return path


def _replica_records(pair: Replicated, key: str) -> list[str]:
    assert pair.replica is not None
    client = redis.Redis.from_url(pair.replica.extra["url"], decode_responses=True)
    try:
        return cast(list[str], client.lrange(key, 0, -1))
    finally:
        client.close()


def test_an_acknowledged_audit_record_is_already_on_the_replica(pair: Replicated) -> None:
    client = redis.Redis.from_url(pair.url, decode_responses=True)
    audit = AuditLog(client, "acked", min_replicas_ack=1, ack_timeout_ms=5000)
    for index in range(10):
        audit.append("step", f"job-{index}", n=index)
        # Right after the call returned, the replica holds the whole chain so far.
        assert _replica_records(pair, audit.keys.records) == audit.records()
    assert len(audit.records()) == 10
    client.close()


def test_without_the_replica_the_audit_append_is_not_acknowledged(
    pair: Replicated, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(pair.url, decode_responses=True)
    mirror = tmp_path / "audit.jsonl"
    audit = AuditLog(client, "unacked", mirror, min_replicas_ack=1, ack_timeout_ms=TIMEOUT_MS)
    audit.append("job.accepted", "job-1")
    pair.stop_replica()
    with pytest.raises(ReplicaAckError, match=r"audit records not acknowledged: only 0 of 1"):
        audit.append("step", "job-1", name="mark")
    # On the primary and in the mirror, chained: reported, not lost, not forked.
    records = [json.loads(line) for line in audit.records()]
    assert [r["kind"] for r in records] == ["job.accepted", "step"]
    assert audit.verify().ok and verify_file(mirror).ok
    assert [json.loads(line)["kind"] for line in mirror.read_text().splitlines()] == [
        "job.accepted",
        "step",
    ]
    client.close()


def _settings(pair: Replicated, tmp_path: Path, replicas: int) -> RemediationSettings:
    spec = spec_with_ack(tmp_path, replicas, TIMEOUT_MS)
    return make_settings(pair.url, spec=spec, audit_file=tmp_path / "audit.jsonl")


def test_the_worker_takes_the_specs_setting(pair: Replicated, tmp_path: Path) -> None:
    client = redis.Redis.from_url(pair.url, decode_responses=True)
    settings = _settings(pair, tmp_path, 1)
    worker = Worker(settings, open_registry(settings), client)
    assert (worker.audit.min_replicas_ack, worker.audit.ack_timeout_ms) == (1, TIMEOUT_MS)
    plain = make_settings(pair.url)
    assert Worker(plain, open_registry(plain), client).audit.min_replicas_ack == 0
    client.close()


def test_a_job_whose_records_are_not_acknowledged_is_reclaimed_not_done(
    pair: Replicated, tmp_path: Path
) -> None:
    settings = _settings(pair, tmp_path, 1)
    store, reader = store_for(settings)
    first = alert("a1b2c3d4e5f60001")
    with receiver(settings) as server:
        accepted = post(server.url, payload(first))
        assert accepted.status_code == 202, accepted.text
        job_id = job_id_for(Alert.model_validate(first), "firing")
        pair.stop_replica()
        # The receiver's 202 needs the replica too: without it, 503 + Retry-After.
        refused = post(server.url, payload(alert("a1b2c3d4e5f60002")))
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "min_replicas_ack" in refused.json()["message"]
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    worker = Worker(settings, open_registry(settings), client, name="unacked-worker")
    with pytest.raises(ReplicaAckError, match="not acknowledged"):
        worker.run_once(block_ms=100)
    job = store.get(job_id)
    assert job is not None and job.status == "running"  # not finished, not failed
    assert reader.get(f"rt:runs:{job_id}") is None  # its steps never ran unrecorded
    pending = reader.xpending(store.keys.stream, GROUP)
    assert pending["pending"] == 1  # the entry stays for a reclaim
    # The replica back: a worker reclaims the job (idle past claim_idle_seconds) and ends it.
    pair.start_replica()
    worker.audit.ack_timeout_ms = 5000
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        done = wait_terminal(store, job_id, timeout=20)
    finally:
        stop.set()
        thread.join(10)
    assert done.status == "succeeded"
    assert reader.get(f"rt:runs:{job_id}") == "1"
    records = [json.loads(line) for line in worker.audit.records()]
    kinds = [r["kind"] for r in records if r["job_id"] == job_id]
    # The attempt whose `job.started` was not acknowledged shows as started; one finish.
    assert kinds.count("job.finished") == 1 and kinds.count("job.started") == 2
    assert _replica_records(pair, worker.audit.keys.records)[-1] == worker.audit.records()[-1]
    client.close()
    reader.close()
