"""Delta-log replay throughput: `replay_delta_log` against raw pymilvus batched upserts.

Starts one real redis-server and one Milvus Lite server (loopback, temp dir), fills a delta log
with N upserts of random 384-dim vectors, then in alternating rounds
- raw: `MilvusClient.upsert` of the same rows (already built in memory: ids, numpy vectors, ts_ms,
  region, checksum) in batches of the same size into a fresh collection with the same schema;
- replay: `replay_delta_log` of the log into a fresh collection: reads the stream from the
  checkpoint, decodes, resolves versions against the target, upserts, advances the checkpoint per
  batch; then flush, compaction and verification of every id (vectors fetched, checksums
  recomputed).
Reports rows/s of raw, of raw plus the check a raw user needs to trust the copy (flush, read every
vector back, compare), of replay's apply phase (the raw loop's work plus reading the log,
resolving versions and checkpointing) and of the whole replay (plus flush, compaction and
verification), each as a ratio of raw and of raw+check. Target: ≥ 80 %, like for like: the apply
phase against raw upserts, the whole replay against raw+check. The whole replay against raw
upserts alone is printed too; it pays for reading every vector back and cannot reach 80 % on
Milvus Lite, where reading a vector back costs about half of writing it.

Run: `.venv/bin/python -m bench.replay [--rows N] [--batch B] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis

from redline.platform.deltalog import DeltaLog, vector_checksum
from redline.platform.processes import start_milvus_lite, start_redis
from redline.platform.vectorindex import MilvusTarget, TargetSpec, replay_delta_log

TARGET_RATIO = 0.80
DIM = 384


@dataclass
class Round:
    """Timings of one round, in seconds."""

    raw: float
    raw_checked: float
    apply: float
    replay: float
    verified: int


def _fill_log(log: DeltaLog, vectors: np.ndarray, chunk: int = 1000) -> list[dict[str, Any]]:
    """Append one upsert per vector; returns the same rows as raw pymilvus would send them."""
    rows: list[dict[str, Any]] = []
    ts_ms = int(time.time() * 1000)
    for start in range(0, len(vectors), chunk):
        ops = [("upsert", f"doc-{i}", vectors[i]) for i in range(start, start + chunk)]
        log.append(ops, "primary", ts_ms)  # type: ignore[arg-type]
        rows += [
            {
                "id": f"doc-{i}",
                "vector": vectors[i],
                "ts_ms": ts_ms,
                "region": "primary",
                "checksum": vector_checksum(vectors[i]),
            }
            for i in range(start, start + chunk)
        ]
    return rows


def _fresh(uri: str, kind: str) -> MilvusTarget:
    name = f"{kind}_{uuid.uuid4().hex[:8]}"
    target = MilvusTarget(TargetSpec(uri, name, name), DIM, timeout_seconds=60)
    target.ensure_collection()
    return target


def _drop(target: MilvusTarget) -> None:
    target.client().drop_collection(target.collection)
    target.close()
    time.sleep(1.0)  # let the server settle so the next measurement starts from the same state


def _raw(uri: str, rows: list[dict[str, Any]], batch: int) -> tuple[float, float]:
    """(seconds to upsert every row, seconds to upsert, flush and read every vector back)."""
    target = _fresh(uri, "raw")
    try:
        milvus = target.client()
        started = time.perf_counter()
        for start in range(0, len(rows), batch):
            milvus.upsert(target.collection, rows[start : start + batch], timeout=60)
        raw = time.perf_counter() - started
        milvus.flush(target.collection, timeout=60)
        ids = [row["id"] for row in rows]
        for start in range(0, len(rows), batch):
            got = milvus.get(
                target.collection,
                ids=ids[start : start + batch],
                output_fields=["id", "vector"],
                timeout=60,
                strict_float32=True,
            )
            by_id = {g["id"]: g["vector"] for g in got}
            for row in rows[start : start + batch]:
                if not np.array_equal(by_id[row["id"]], row["vector"]):
                    raise SystemExit(f"raw copy of {row['id']} differs")
        return raw, time.perf_counter() - started
    finally:
        _drop(target)


def _replay(uri: str, log: DeltaLog, rows: int, batch: int) -> tuple[float, float, int]:
    """(apply-phase seconds, whole-replay seconds, ids verified) into a fresh collection."""
    target = _fresh(uri, "replay")
    try:
        started = time.perf_counter()
        report = replay_delta_log(log, target, batch_size=batch)
        total = time.perf_counter() - started
        if not report.ok or report.entries != rows:
            raise SystemExit(f"replay did not verify: {report.summary()}")
        return report.apply_seconds, total, report.verify.verified
    finally:
        _drop(target)


def _round(uri: str, log: DeltaLog, rows: list[dict[str, Any]], batch: int, flip: bool) -> Round:
    if flip:  # alternate which side goes first, so neither always meets a busier server
        apply, whole, verified = _replay(uri, log, len(rows), batch)
        raw, raw_checked = _raw(uri, rows, batch)
    else:
        raw, raw_checked = _raw(uri, rows, batch)
        apply, whole, verified = _replay(uri, log, len(rows), batch)
    return Round(raw, raw_checked, apply, whole, verified)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; exit 1 when replay misses the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows_n = args.rows - args.rows % 1000 or 1000

    with tempfile.TemporaryDirectory(prefix="redline-bench-replay-") as tmp:
        redis_service = start_redis(Path(tmp) / "redis")
        milvus_service = start_milvus_lite(Path(tmp) / "milvus")
        client = redis.Redis.from_url(redis_service.extra["url"])
        try:
            uri = milvus_service.extra["uri"]
            vectors = np.random.default_rng(0).standard_normal((rows_n, DIM)).astype(np.float32)
            log = DeltaLog(client, "bench", DIM)
            rows = _fill_log(log, vectors)
            rounds = []
            for number in range(args.rounds):
                # a fresh replica each round replays the whole log from the start
                rounds.append(_round(uri, log, rows, args.batch, flip=number % 2 == 1))
        finally:
            client.close()
            milvus_service.stop()
            redis_service.stop()

    raw = statistics.median(r.raw for r in rounds)
    raw_checked = statistics.median(r.raw_checked for r in rounds)
    apply = statistics.median(r.apply for r in rounds)
    whole = statistics.median(r.replay for r in rounds)
    print(
        f"delta-log replay vs raw pymilvus upsert: {rows_n} rows x {DIM} dims, batch {args.batch}, "
        f"Milvus Lite, median of {args.rounds} rounds"
    )
    print(f"{'mode':<52} {'seconds':>8} {'rows/s':>9} {'vs raw':>7} {'vs raw+check':>13}")
    for label, seconds in (
        ("raw: MilvusClient.upsert", raw),
        ("raw+check: upsert, flush, read every vector back", raw_checked),
        ("replay_delta_log, apply phase (log, resolve, upsert)", apply),
        ("replay_delta_log, whole (+ flush, compact, verify)", whole),
    ):
        print(
            f"{label:<52} {seconds:8.3f} {rows_n / seconds:9.0f} {raw / seconds:7.1%} "
            f"{raw_checked / seconds:13.1%}"
        )
    apply_ok = raw / apply >= TARGET_RATIO
    whole_ok = raw_checked / whole >= TARGET_RATIO
    print(
        f"target >= {TARGET_RATIO:.0%}: apply phase vs raw upsert {raw / apply:.1%} "
        f"({'met' if apply_ok else 'MISSED'}); whole replay vs raw+check {raw_checked / whole:.1%} "
        f"({'met' if whole_ok else 'MISSED'}); whole replay vs raw upsert alone {raw / whole:.1%}"
    )
    print(f"every one of {rounds[-1].verified} ids verified (vector checksums) in each round")
    return 0 if apply_ok and whole_ok else 1


if __name__ == "__main__":
    sys.exit(main())
