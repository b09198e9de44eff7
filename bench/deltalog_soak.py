"""Delta-log soak: is the log bounded under steady writes? (Not part of `make bench` or CI.)

Starts a real redis-server and a Milvus Lite server (temp dirs, loopback), a primary and a
replica collection, then for `--minutes` (default 30):
- a writer appends `--rate` rows/s through `IndexWriter` (upserts over a fixed key space, one
  write in 20 a delete, so tombstones accumulate too);
- the replicator applies the log to the replica and trims it every `--trim-interval` seconds,
  keeping `--retention` seconds of history behind the replica's checkpoint.
Every `--every` seconds it prints the stream's length (XLEN), its memory (MEMORY USAGE), Redis'
used_memory, the replica's tombstones and backlog. At the end: the peak and final figures and
whether the log stayed within what the retention explains (rate x (retention + trim interval),
plus slack for a moment's backlog).

Run: `.venv/bin/python -m bench.deltalog_soak [--minutes 3] [--rate 100] [--retention 60]`.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from redline.devstack.processes import start_milvus_lite, start_redis
from redline.platform.index import (
    DeltaLog,
    IndexWriter,
    MilvusTarget,
    Replicator,
    TargetSpec,
)

COLLECTION = "soak"


@dataclass
class Sample:
    """One line of the soak's table."""

    at: float
    written: int
    length: int
    stream_bytes: int
    used_memory: int
    tombstones: int
    pending: int


class SteadyWriter:
    """Writes `rate` rows/s in batches every 0.1 s until stopped."""

    def __init__(self, writer: IndexWriter, rate: float, dim: int, keys: int = 20_000) -> None:
        self.writer, self.rate, self.dim, self.keys = writer, rate, dim, keys
        self.written = 0
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.written
            if due > 0:
                vectors = rng.standard_normal((due, self.dim)).astype(np.float32)
                ops = []
                for i in range(due):
                    n = self.written + i
                    key = f"doc-{n % self.keys}"
                    ops.append(
                        ("delete", key, None) if n % 20 == 19 else ("upsert", key, vectors[i])
                    )
                try:
                    self.writer.write(ops)  # type: ignore[arg-type]
                    self.written += due
                except Exception:  # a soak counts failed writes and goes on  # noqa: BLE001
                    self.errors += 1
            self.stop.wait(0.1)


def _sample(client: redis.Redis, log: DeltaLog, started: float, written: int) -> Sample:
    info = log.info()
    return Sample(
        at=time.monotonic() - started,
        written=written,
        length=info.length,
        stream_bytes=log.memory_bytes(),
        used_memory=int(client.info("memory")["used_memory"]),
        tombstones=int(client.hlen(log.tombstone_key("replica"))),
        pending=log.pending("replica")[0],
    )


def _mb(value: int) -> str:
    return f"{value / 1e6:8.2f}"


def soak(minutes: float, rate: float, dim: int, retention: float, trim_interval: float,
         every: float) -> list[Sample]:  # fmt: skip
    """Run the soak; returns the samples taken."""
    with tempfile.TemporaryDirectory(prefix="redline-soak-") as tmp:
        work = Path(tmp)
        redis_service = start_redis(work / "redis")
        milvus = start_milvus_lite(work / "milvus")
        client = redis.Redis.from_url(redis_service.extra["url"])
        uri = milvus.extra["uri"]
        primary = MilvusTarget(TargetSpec(uri, f"{COLLECTION}_p", "primary"), dim, 30.0)
        replica = MilvusTarget(TargetSpec(uri, f"{COLLECTION}_r", "replica"), dim, 30.0)
        stop = threading.Event()
        samples: list[Sample] = []
        try:
            primary.ensure_collection()
            replica.ensure_collection()
            log = DeltaLog(client, COLLECTION, dim)
            replicator = Replicator(
                DeltaLog(redis.Redis.from_url(redis_service.extra["url"]), COLLECTION, dim),
                replica, batch_size=500, retention_seconds=retention,
                trim_interval_seconds=trim_interval,
            )  # fmt: skip
            applying = threading.Thread(target=replicator.run, args=(stop,), daemon=True)
            applying.start()
            writer = SteadyWriter(IndexWriter(log, primary, "eu"), rate, dim)
            started = time.monotonic()
            writer.thread.start()
            print(f"soak: {minutes:g} min, {rate:g} rows/s of dim {dim}, retention "
                  f"{retention:g} s, trim every {trim_interval:g} s")  # fmt: skip
            print(" seconds  written  entries  stream_MB  redis_used_MB  tombstones  pending")
            end = started + minutes * 60
            while time.monotonic() < end:
                time.sleep(max(0.0, min(every, end - time.monotonic())))
                s = _sample(client, log, started, writer.written)
                samples.append(s)
                print(f"{s.at:8.0f} {s.written:8d} {s.length:8d} {_mb(s.stream_bytes):>10} "
                      f"{_mb(s.used_memory):>14} {s.tombstones:11d} {s.pending:8d}",
                      flush=True)  # fmt: skip
            writer.stop.set()
            writer.thread.join(10)
            if writer.errors:
                print(f"write errors: {writer.errors}")
        finally:
            stop.set()
            primary.close()
            replica.close()
            client.close()
            milvus.stop()
            redis_service.stop()
    return samples


def main(argv: list[str]) -> int:
    """Parse flags, soak, print the verdict (exit 1 when the log was not bounded)."""
    parser = argparse.ArgumentParser(prog="bench.deltalog_soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0, help="rows written per second")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--retention", type=float, default=60.0, help="retention_seconds")
    parser.add_argument("--trim-interval", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    samples = soak(args.minutes, args.rate, args.dim, args.retention, args.trim_interval,
                   args.every)  # fmt: skip
    if not samples:
        return 1
    bound = args.rate * (args.retention + args.trim_interval) * 1.5 + 1000
    settled = [s for s in samples if s.at > args.retention + 2 * args.trim_interval] or samples
    peak = max(s.length for s in samples)
    print(
        f"\nwritten {samples[-1].written} rows; entries: peak {peak}, final {samples[-1].length} "
        f"(bound {bound:.0f} = rate x (retention + trim interval) x 1.5 + 1000); stream memory "
        f"peak {_mb(max(s.stream_bytes for s in samples)).strip()} MB; Redis used_memory "
        f"first {_mb(samples[0].used_memory).strip()} MB, peak "
        f"{_mb(max(s.used_memory for s in samples)).strip()} MB, final "
        f"{_mb(samples[-1].used_memory).strip()} MB"
    )
    half = settled[len(settled) // 2 :]
    first, last = settled[0], settled[-1]
    print(
        f"after settling ({first.at:.0f} s .. {last.at:.0f} s): entries {first.length} -> "
        f"{last.length}, used_memory {_mb(first.used_memory).strip()} -> "
        f"{_mb(last.used_memory).strip()} MB; max entries in the second half "
        f"{max(s.length for s in half)}"
    )
    bounded = max(s.length for s in settled) <= bound
    print(f"bounded: {'yes' if bounded else 'NO'}")
    return 0 if bounded else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
