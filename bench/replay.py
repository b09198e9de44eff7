"""Delta-log replay throughput: `replay_delta_log` against raw pymilvus batched upserts.

Starts a real redis-server (loopback, temp dir) and fills a delta log with N upserts of random
384-dim vectors. Then, in rounds that alternate which side goes first, each side on a fresh Milvus
Lite server of its own (same binary, same settings; neither meets the other's background work):
- raw: `MilvusClient.upsert` of the same rows, already built in memory (ids, numpy vectors, ts_ms,
  region, checksum), in batches of the same size into a collection with the same schema; then
  what a raw user needs to trust the copy: flush and read every vector back, compared;
- replay: `replay_delta_log` of the log into an empty replica: reads the log from the checkpoint,
  decodes, resolves versions, upserts, advances the checkpoint per batch (the apply phase); then
  flush, compaction and verification of every id (vectors read back, checksums recomputed).

Each is measured in wall seconds (the target: rows/s, median over rounds) and in CPU seconds
(this process + the Milvus Lite server + redis-server, from /proc): on a shared machine other
tenants' load moves wall time by 2-4x from one run to the next, while CPU seconds measure the work
each side needs (they count Redis and client work that overlaps the server's in wall time). Target
≥ 80 %, like for like: the apply phase against raw upserts, the whole replay against raw + check.
The whole replay against raw upserts alone is printed too: it also reads every vector back, which
costs about half of writing it on Milvus Lite.

Run: `.venv/bin/python -m bench.replay [--rows N] [--batch B] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis

from bench.figures import BenchmarkError, Figure, at_least, exit_code, info
from redline.devstack.processes import Service, start_milvus_lite, start_redis
from redline.platform.index import (
    DeltaLog,
    MilvusTarget,
    TargetSpec,
    replay_delta_log,
    vector_checksum,
)

TARGET_RATIO = 0.80
DIM = 384
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cost:
    """Wall and CPU seconds of one measured span."""

    wall: float
    cpu: float


@dataclass
class Round:
    """One round: raw, raw + check, replay apply phase, whole replay."""

    raw: Cost
    raw_checked: Cost
    apply: Cost
    replay: Cost


class Meter:
    """Wall clock plus the CPU time of this process and of the given service processes."""

    def __init__(self, *services: Service) -> None:
        self.pids = [s.process.pid for s in services]

    def read(self) -> tuple[float, float]:
        """(wall, cpu) now."""
        cpu = time.process_time()
        for pid in self.pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
        return time.perf_counter(), cpu

    @staticmethod
    def since(start: tuple[float, float], end: tuple[float, float]) -> Cost:
        """The cost between two readings."""
        return Cost(end[0] - start[0], end[1] - start[1])


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


@contextmanager
def _fresh(workdir: Path, kind: str) -> Iterator[tuple[MilvusTarget, Service]]:
    """A collection on a Milvus Lite server of its own."""
    service = start_milvus_lite(workdir / f"milvus-{kind}-{uuid.uuid4().hex[:8]}")
    target = MilvusTarget(TargetSpec(service.extra["uri"], kind, kind), DIM, timeout_seconds=60)
    try:
        target.ensure_collection()
        yield target, service
    finally:
        target.close()
        service.stop()


def _raw(workdir: Path, rows: list[dict[str, Any]], batch: int) -> tuple[Cost, Cost]:
    """(upsert every row, upsert + flush + read every vector back and compare)."""
    with _fresh(workdir, "raw") as (target, service):
        meter = Meter(service)
        milvus = target.client()
        started = meter.read()
        for start in range(0, len(rows), batch):
            milvus.upsert(target.collection, rows[start : start + batch], timeout=60)
        upserted = meter.read()
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
                    raise BenchmarkError(f"raw copy of {row['id']} differs")
        checked = meter.read()
        return Meter.since(started, upserted), Meter.since(started, checked)


def _replay(
    workdir: Path, log: DeltaLog, redis_service: Service, rows: int, batch: int
) -> tuple[Cost, Cost]:
    """(apply phase, whole replay) of the whole log into an empty replica."""
    with _fresh(workdir, "replay") as (target, service):
        log.redis.delete(log.target_key(target.name))  # start from the beginning of the log
        meter = Meter(service, redis_service)
        marks: list[tuple[float, float]] = []
        started = meter.read()
        report = replay_delta_log(
            log, target, batch_size=batch, on_batch=lambda _: marks.append(meter.read())
        )
        finished = meter.read()
        if not report.ok or report.entries != rows or report.verify.verified != rows:
            raise BenchmarkError(f"replay did not verify: {report.summary()}")
        return Meter.since(started, marks[-1]), Meter.since(started, finished)


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run the benchmark, print the table; the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows_n = max(1000, args.rows - args.rows % 1000)

    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="redline-bench-replay-") as tmp:
        workdir = Path(tmp)
        redis_service = start_redis(workdir / "redis")
        client = redis.Redis.from_url(redis_service.extra["url"])
        try:
            vectors = np.random.default_rng(0).standard_normal((rows_n, DIM)).astype(np.float32)
            log = DeltaLog(client, "bench", DIM)
            rows = _fill_log(log, vectors)
            for number in range(args.rounds):
                if number % 2:  # alternate which side goes first
                    apply, whole = _replay(workdir, log, redis_service, rows_n, args.batch)
                    raw, raw_checked = _raw(workdir, rows, args.batch)
                else:
                    raw, raw_checked = _raw(workdir, rows, args.batch)
                    apply, whole = _replay(workdir, log, redis_service, rows_n, args.batch)
                rounds.append(Round(raw, raw_checked, apply, whole))
                print(f"round {number + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
        finally:
            client.close()
            redis_service.stop()

    def median(pick: str, part: str) -> float:
        return float(statistics.median(getattr(getattr(r, pick), part) for r in rounds))

    print(
        f"delta-log replay vs raw pymilvus upsert: {rows_n} rows x {DIM} dims, batch "
        f"{args.batch}, a fresh Milvus Lite server per measurement, median of {args.rounds} rounds"
    )
    header = f"{'mode':<50} {'wall s':>7} {'rows/s':>7} {'cpu s':>6} {'rows/cpu-s':>10}"
    print(f"{header} {'vs raw (wall/cpu)':>18} {'vs raw+check':>13}")
    labels = {
        "raw": "raw: MilvusClient.upsert",
        "raw_checked": "raw+check: upsert, flush, read back, compare",
        "apply": "replay_delta_log: apply (log, resolve, upsert)",
        "replay": "replay_delta_log: whole (+flush, compact, verify)",
    }
    for key, label in labels.items():
        wall, cpu = median(key, "wall"), median(key, "cpu")
        vs_raw = f"{median('raw', 'wall') / wall:.0%} / {median('raw', 'cpu') / cpu:.0%}"
        vs_checked = f"{median('raw_checked', 'wall') / wall:.0%} / "
        vs_checked += f"{median('raw_checked', 'cpu') / cpu:.0%}"
        print(
            f"{label:<50} {wall:7.2f} {rows_n / wall:7.0f} {cpu:6.2f} {rows_n / cpu:10.0f} "
            f"{vs_raw:>18} {vs_checked:>13}"
        )

    def ratio(base: str, other: str, part: str) -> float:
        return median(base, part) / median(other, part)

    apply_wall, whole_wall = ratio("raw", "apply", "wall"), ratio("raw_checked", "replay", "wall")
    ok = apply_wall >= TARGET_RATIO and whole_wall >= TARGET_RATIO
    print(
        f"target: rows/s >= {TARGET_RATIO:.0%} of raw, like for like: apply vs raw "
        f"{apply_wall:.0%}, whole replay vs raw+check {whole_wall:.0%}: "
        f"{'met' if ok else 'MISSED'} (wall-clock medians). CPU-seconds, which other tenants do "
        f"not move: apply {ratio('raw', 'apply', 'cpu'):.0%}, whole "
        f"{ratio('raw_checked', 'replay', 'cpu'):.0%}. Whole replay vs raw upserts alone: "
        f"{ratio('raw', 'replay', 'wall'):.0%} wall, {ratio('raw', 'replay', 'cpu'):.0%} CPU."
    )
    print("Every id was verified (recomputed vector checksums) in every round.")
    return [
        at_least(
            "replay",
            "rows/s, apply phase vs raw upsert (wall)",
            100 * apply_wall,
            "%",
            100 * TARGET_RATIO,
        ),
        at_least(
            "replay",
            "rows/s, whole replay vs raw + check (wall)",
            100 * whole_wall,
            "%",
            100 * TARGET_RATIO,
        ),
        info("replay", "apply vs raw, CPU seconds", 100 * ratio("raw", "apply", "cpu"), "%"),
        info(
            "replay",
            "whole vs raw + check, CPU seconds",
            100 * ratio("raw_checked", "replay", "cpu"),
            "%",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when replay misses the target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
