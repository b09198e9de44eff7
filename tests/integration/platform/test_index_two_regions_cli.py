"""Two writing regions run as processes through the CLI, on a real redis-server and two Milvus
Lite servers: per region a replicator (`redline index replicate --origin R --from OTHER`) and
writers (`redline index write-demo --origin R`) writing the same ids at the same time, some with
equal content and some not. Both copies must end with identical rows, every differing id with
exactly one conflict-map record and its losing content under the re-mapped id; the replicators
stop cleanly on SIGTERM, and a process whose flags would make the regions diverge is refused."""

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
from pymilvus.exceptions import MilvusException

from redline.devstack.processes import Service, start_milvus_lite
from redline.platform.index import (
    ConflictMap,
    DeltaLog,
    MilvusTarget,
    TargetSpec,
    connect_milvus,
    remap_id,
    row_checksum,
    verify_range,
)

DIM = 8
COUNT = 30
WINDOW_S = 3600.0  # the CLI's default heads_retention_seconds
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}
Row = tuple[str, int, str]
"""(checksum recomputed from the row read back, ts_ms, region)."""


@pytest.fixture()
def second_milvus(tmp_path: Path) -> Iterator[Service]:
    """A second Milvus Lite server: the other region's copy."""
    service = start_milvus_lite(tmp_path / "milvus-us")
    yield service
    service.stop()


def _index(*args: str) -> list[str]:
    return [sys.executable, "-m", "redline.cli", "index", *args]


def _rows(uri: str, collection: str) -> dict[str, Row]:
    """Every row of a copy, read back and checksummed here (not by redline's replicator)."""
    client = connect_milvus(uri)
    try:
        if not client.has_collection(collection):
            return {}
        rows = client.query(
            collection, filter='id != ""', output_fields=["*"], limit=10_000,
            consistency_level="Strong",
        )  # fmt: skip
    finally:
        client.close()
    return {
        str(r["id"]): (
            row_checksum(np.asarray(r["vector"], dtype=np.float32), b""),
            int(r["ts_ms"]),
            str(r["region"]),
        )
        for r in rows
    }


def _write(
    common: list[str], uri: str, region: str, prefix: str, seed: int
) -> subprocess.Popen[str]:
    argv = _index("write-demo", *common, "--origin", region, "--primary-uri", uri,
                  "--prefix", prefix, "--seed", str(seed), "--count", str(COUNT), "--batch", "5",
                  "--regions", "eu,us")  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)  # fmt: skip


def _finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, out + err
    return out


def test_two_regions_through_the_cli_converge_with_every_conflict_recorded(
    redis_url: str, milvus_service: Service, second_milvus: Service, tmp_path: Path
) -> None:
    collection = f"c{uuid.uuid4().hex[:10]}"
    uris = {"eu": milvus_service.extra["uri"], "us": second_milvus.extra["uri"]}
    common = ["--redis-url", redis_url, "--collection", collection, "--dim", str(DIM)]
    other = {"eu": "us", "us": "eu"}
    logs = {r: tmp_path / f"replicate-{r}.log" for r in uris}
    replicators: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for region, uri in uris.items():
            argv = _index("replicate", *common, "--origin", region, "--from", other[region],
                          "--primary-uri", uri, "--batch-size", "7", "--regions",
                          "eu,us")  # fmt: skip
            with logs[region].open("wb") as output:
                replicators[region] = subprocess.Popen(
                    argv, stdout=output, stderr=subprocess.STDOUT, env=ENV
                )
        # both regions write the same ids at once: equal content (same seed), then not
        for prefix, seeds in (("same-", (7, 7)), ("diff-", (1, 2))):
            writers = [
                _write(common, uris[region], region, prefix, seed)
                for region, seed in zip(uris, seeds, strict=True)
            ]
            for writer in writers:
                assert f'"written": {COUNT}' in _finish(writer)

        client = redis.Redis.from_url(redis_url)
        conflicts = ConflictMap(client, collection)
        deadline = time.monotonic() + 120
        while True:
            try:
                eu, us = _rows(uris["eu"], collection), _rows(uris["us"], collection)
            except MilvusException as exc:
                # A read that cannot reach a copy's server for a moment (a busy machine): read
                # again; convergence is still owed by the deadline.
                assert time.monotonic() < deadline, exc
                time.sleep(0.5)
                continue
            if eu == us and len(eu) == 3 * COUNT and len(conflicts.records()) == COUNT:
                break
            for region, process in replicators.items():
                assert process.poll() is None, logs[region].read_text()
            assert time.monotonic() < deadline, (len(eu), len(us), len(conflicts.records()))
            time.sleep(0.5)

        for region, process in replicators.items():
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, logs[region].read_text()
            text = logs[region].read_text()
            assert f"log of {other[region]} -> copy of {region}" in text, text

        records = conflicts.records()
        differing = {f"diff-{i}" for i in range(COUNT)}
        assert sorted(r["id"] for r in records) == sorted(differing)  # equal content: none
        assert conflicts.counts() == {"remapped": COUNT}
        for record in records:
            winner, loser = record["winner"], record["loser"]
            assert (winner["ts_ms"], winner["region"]) > (loser["ts_ms"], loser["region"])
            remapped = remap_id(record["id"], loser["region"], "redline", "varchar")
            assert record["remapped_id"] == remapped
            # both contents kept in both copies: the winner under the id, the loser re-mapped
            assert eu[record["id"]] == (winner["checksum"], winner["ts_ms"], winner["region"])
            assert eu[remapped] == (loser["checksum"], loser["ts_ms"], loser["region"])
        same = {f"same-{i}" for i in range(COUNT)}
        assert set(eu) == same | differing | {r["remapped_id"] for r in records}
        # each copy holds every write of both logs where the conflict map says
        remapped_writes = 0
        for origin in uris:
            log = DeltaLog(client, collection, DIM, origin=origin)
            assert log.targets() == {other[origin]: "replica"}
            for region, uri in uris.items():
                copy = MilvusTarget(TargetSpec(uri, collection, region), DIM)
                try:
                    report = verify_range(log, copy, "0-0", log.last_id(),
                                          conflict_window_seconds=WINDOW_S)  # fmt: skip
                finally:
                    copy.close()
                assert report.ok, (origin, region, report)
                remapped_writes += report.remapped
        assert remapped_writes == 2 * COUNT  # each losing write, found re-mapped on both copies

        # flags that would make the regions diverge stop a process before it does anything
        refused = {
            ("replicate", "--origin", "eu", "--from", "eu"): "--origin and --from are both eu",
            ("replicate", "--origin", "eu", "--from", "ap", "--regions", "eu,us"):
                "--from ap is not one of the collection's regions (eu, us)",
            ("write-demo", "--origin", "eu", "--heads-retention-seconds", "60"):
                "the conflict window is 3600 s",
        }  # fmt: skip
        for args, message in refused.items():
            done = subprocess.run(_index(*args, *common, "--primary-uri", uris["eu"]),
                                  capture_output=True, text=True, timeout=120, env=ENV,
                                  check=False)  # fmt: skip
            assert done.returncode == 2 and message in done.stderr, done.stdout + done.stderr
        assert _rows(uris["eu"], collection) == eu  # the refused writer wrote nothing
        client.close()
    finally:
        for process in replicators.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        for uri in uris.values():
            milvus = connect_milvus(uri)
            milvus.drop_collection(collection)
            milvus.close()
