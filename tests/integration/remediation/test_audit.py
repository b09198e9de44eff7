"""The hash-chained audit trail on a real redis-server: concurrent appenders across processes
never fork the chain, the JSONL mirror matches Redis, and `redline audit verify` catches edits,
removals, reorders and truncation."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
import redis
import redis.asyncio as aredis
from typer.testing import CliRunner

from redline.cli.remediation import audit_app
from redline.remediation.audit import (
    AsyncAuditLog,
    AuditEntry,
    AuditKeys,
    AuditLog,
    read_file_records,
    record_hash,
    verify_records,
)
from redline.slo import catalog
from tests.support.remediation import (
    REPO,
    alert,
    make_settings,
    payload,
    post,
    receiver,
    store_for,
    wait_terminal,
    workers,
)

PREFIX = "redline:remediation"
KEYS = AuditKeys.for_prefix(PREFIX)

_APPENDER = """
import sys
import redis
from pathlib import Path
from redline.remediation.audit import AuditEntry, AuditLog

url, file, name, count = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
client = redis.Redis.from_url(url, decode_responses=True)
log = AuditLog(client, "redline:remediation", file)
for i in range(0, count, 3):
    log.append_many([AuditEntry("test", name, {"i": j}) for j in range(i, min(i + 3, count))])
client.close()
"""


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on the flushed test database."""
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    yield connection
    connection.close()


def test_concurrent_appenders_in_processes_threads_and_asyncio_never_fork_the_chain(
    redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    file = tmp_path / "audit.jsonl"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _APPENDER, redis_url, str(file), f"proc{n}", "150"],
            cwd=REPO,
        )
        for n in range(3)
    ]
    log = AuditLog(client, PREFIX, file)

    def thread_appender(name: str) -> None:
        for i in range(100):
            log.append("test", name, i=i)

    async def async_appenders() -> None:
        async_client = aredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            async_log = AsyncAuditLog(async_client, PREFIX, file)
            await asyncio.gather(
                *(
                    async_log.append_many([AuditEntry("test", "async", {"i": i, "k": k})])
                    for i in range(50)
                    for k in range(2)
                )
            )
        finally:
            await async_client.aclose()

    threads = [threading.Thread(target=thread_appender, args=(f"thread{n}",)) for n in range(2)]
    threads.append(threading.Thread(target=asyncio.run, args=(async_appenders(),)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.wait(timeout=60) for p in processes] == [0, 0, 0]
    log.sync_file()

    total = 3 * 150 + 2 * 100 + 100
    result = log.verify()
    assert result.ok, result
    assert result.count == total
    lines = log.records()
    assert read_file_records(file) == lines, "the JSONL mirror differs from Redis"
    records = [json.loads(line) for line in lines]
    for name, count in [("proc0", 150), ("proc1", 150), ("thread0", 100), ("async", 100)]:
        mine = [r["data"]["i"] for r in records if r["job_id"] == name]
        assert len(mine) == count
    assert [r["data"]["i"] for r in records if r["job_id"] == "proc2"] == list(range(150))


def _build_trail(redis_url: str, file: Path) -> list[str]:
    """A real trail: jobs received, run and resolved through the receiver and a worker."""
    settings = make_settings(redis_url, audit_file=file)
    job_store, client = store_for(settings)
    try:
        with receiver(settings) as server:
            body = payload(
                alert("0000000000000aa1"),
                alert("0000000000000aa2", region="secondary"),
                alert("0000000000000aa3", playbook=None),
            )
            ids = [a["job_id"] for a in post(server.url, body).json()["alerts"][:2]]
            with workers(settings):
                for job_id in ids:
                    wait_terminal(job_store, job_id)
        return AuditLog(client, PREFIX).records()
    finally:
        client.close()


def _verify(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(audit_app, ["verify", *args])
    return result.exit_code, result.output


def _write(file: Path, lines: list[str]) -> None:
    file.write_text("".join(f"{line}\n" for line in lines))


def test_verify_detects_edited_removed_reordered_and_truncated_records(
    redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    file = tmp_path / "audit.jsonl"
    lines = _build_trail(redis_url, file)
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[:3] == ["job.accepted", "job.accepted", "alert.acknowledged"]
    assert {"job.started", "step", "job.finished"} <= set(kinds)
    assert read_file_records(file) == lines
    assert len(lines) >= 12

    code, output = _verify("--redis-url", redis_url, "--file", str(file))
    assert code == 0, output
    assert f"redis: ok: {len(lines)} records" in output
    assert _verify("--file", str(file))[0] == 0
    assert _verify("--redis-url", redis_url)[0] == 0

    k = 5
    # An edited record no longer matches its hash.
    edited = json.loads(lines[k])
    edited["data"]["name"] = "something else"
    _write(file, [*lines[:k], json.dumps(edited, sort_keys=True), *lines[k + 1 :]])
    code, output = _verify("--file", str(file))
    assert code == 1
    assert f"record {k}: content does not match its hash: the record was edited" in output

    # Edited and re-hashed: the next record's link breaks.
    edited["hash"] = record_hash(edited)
    _write(file, [*lines[:k], json.dumps(edited), *lines[k + 1 :]])
    code, output = _verify("--file", str(file))
    assert code == 1
    assert f"record {k + 1}: prev does not match the hash of record {k}" in output

    # A removed record.
    _write(file, [*lines[:k], *lines[k + 1 :]])
    code, output = _verify("--file", str(file))
    assert code == 1
    assert f"record {k}: carries seq {k + 1} at position {k}" in output

    # Two records swapped.
    _write(file, [*lines[:k], lines[k + 1], lines[k], *lines[k + 2 :]])
    code, output = _verify("--file", str(file))
    assert code == 1
    assert f"record {k}: carries seq {k + 1} at position {k}: " in output
    assert "removed, inserted or reordered" in output

    # The last record dropped: the file alone is a valid prefix, Redis shows the divergence.
    _write(file, lines[:-1])
    assert _verify("--file", str(file))[0] == 0
    code, output = _verify("--redis-url", redis_url, "--file", str(file))
    assert code == 1
    assert f"holds {len(lines) - 1} records, Redis {len(lines)}" in output

    # Redis itself: an edit, then a truncated tail (caught by the stored head).
    _write(file, lines)
    original = lines[3]
    tampered = original.replace("0000000000000aa", "0000000000000ff", 1)
    client.lset(KEYS.records, 3, tampered)
    code, output = _verify("--redis-url", redis_url)
    assert code == 1 and "redis: record 3: content does not match its hash" in output
    client.lset(KEYS.records, 3, original)
    assert _verify("--redis-url", redis_url)[0] == 0
    client.rpop(KEYS.records)
    code, output = _verify("--redis-url", redis_url)
    assert code == 1
    assert f"the chain ends at {len(lines) - 1} records but the head says {len(lines)}" in output


def test_verify_command_process_exit_codes(redis_url: str, tmp_path: Path) -> None:
    file = tmp_path / "audit.jsonl"
    lines = _build_trail(redis_url, file)
    _write(file, [lines[1], lines[0], *lines[2:]])
    command = [sys.executable, "-m", "redline.cli", "audit", "verify", "--file", str(file)]
    broken = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1, broken.stderr
    assert f"{file}: record 0: carries seq 1 at position 0" in broken.stderr
    code, output = _verify("--file", str(tmp_path / "nope.jsonl"))
    assert code == 2 and "cannot read" in output


def test_verify_records_reports_non_records() -> None:
    assert verify_records([]).ok
    bad = verify_records(["not json"])
    assert (bad.ok, bad.index) == (False, 0) and "not valid JSON" in bad.reason
    other = verify_records(['{"a": 1}'])
    assert (other.ok, other.index) == (False, 0) and "not an audit record" in other.reason


INTACT = catalog.REDLINE_AUDIT_CHAIN_INTACT
RECORDS = catalog.REDLINE_AUDIT_RECORDS
VERIFIED = catalog.REDLINE_AUDIT_VERIFIED_TIMESTAMP_SECONDS
# Long enough that two scrapes in a row fall in one interval on a loaded CI machine (0.2 s did not).
INTERVAL = 1.0


def _audit_metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=5).text
    values = {}
    for family in text_string_to_metric_families(text):
        if family.name in {INTACT.name, RECORDS.name, VERIFIED.name}:
            for sample in family.samples:
                copy = sample.labels.get("copy")
                values[f"{sample.name}{'/' + copy if copy else ''}"] = sample.value
    return values


def test_metrics_show_the_chain_state_of_both_copies_and_catch_tampering(
    redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    """The receiver's /metrics re-verifies the trail at most once per interval: intact after
    real deliveries, BROKEN on the copy whose record was edited, and again on the mirror when
    a record is removed from the file."""
    file = tmp_path / "audit.jsonl"
    settings = make_settings(redis_url, audit_file=file, audit_verify_interval_seconds=INTERVAL)
    with receiver(settings) as server:
        post(server.url, payload(alert("0000000000000ab1"), alert("0000000000000ab2")))
        time.sleep(INTERVAL + 0.1)
        first = _audit_metrics(server.url)
        assert first[f"{INTACT}/redis"] == 1.0
        assert first[f"{INTACT}/file"] == 1.0
        assert first[f"{RECORDS}/redis"] == first[f"{RECORDS}/file"] >= 2
        assert abs(first[str(VERIFIED)] - time.time()) < 5

        cached = _audit_metrics(server.url)  # within the interval: the same verification
        assert cached[str(VERIFIED)] == first[str(VERIFIED)]

        record = json.loads(cast(str, client.lindex(KEYS.records, 0)))
        record["data"] = {"edited": True}
        client.lset(KEYS.records, 0, json.dumps(record))
        time.sleep(INTERVAL + 0.1)
        edited = _audit_metrics(server.url)
        assert edited[f"{INTACT}/redis"] == 0.0

        lines = read_file_records(file)
        _write(file, lines[1:])
        time.sleep(INTERVAL + 0.1)
        assert _audit_metrics(server.url)[f"{INTACT}/file"] == 0.0
