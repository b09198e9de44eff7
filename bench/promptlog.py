"""Prompt-log trace-back and tamper detection at 1 M records (design notes §3.3).

Starts a real redis-server (loopback, temp dir) and appends N records (default 1 M) of S
sessions (default 20 000, records spread at random over the whole log) in batches of B (default
1 024) through `PromptLog.append`: every batch gets its Merkle tree, sealed bytes and chained
root in Redis and `roots.jsonl`, and its records in the session index. Records are already
redacted text (redaction is timed apart, per record, on a realistic prompt). fsync is off for
the fill: per-batch fsync measures the disk, not the log, and is printed apart on 50 batches.

Then, side by side for one session (median of R rounds, warm page cache):
- index: `trace(session)`: one Redis list read, one read per record, inclusion proofs checked
  against the anchored roots;
- scan: what a log without an index does: read and parse every record, keep the session's;
- grep: the cheapest scan possible (a bytes search per line, parse only the hits; no proofs).

Tamper detection: one record in the middle is edited; `verify()` (both copies of the chain,
every batch's sealed bytes, diagnosis of the changed batch) and `verify_batch(b)` (the targeted
check of one batch) are timed, and must name the edited batch and leaf.

Run: `.venv/bin/python -m bench.promptlog [--records N] [--sessions S] [--batch B]`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from redline.devstack.processes import start_redis
from redline.platform.promptlog import PromptLog, PromptRecord, build_record
from redline.platform.redaction import build_redactor

WORDS = (
    "summarise the quarterly report for the board and list the risks in order of impact "
    "translate this paragraph into French keep the tone formal explain the error message "
    "write a SQL query that joins orders and customers by region and month"
).split()


def _records(rng: random.Random, batch: int, size: int, sessions: int) -> list[PromptRecord]:
    out = []
    for k in range(size):
        words = rng.sample(WORDS, 14)
        out.append(
            PromptRecord(
                f"2026-03-01T{batch // 3600 % 24:02d}:{batch // 60 % 60:02d}:{batch % 60:02d}."
                f"{k:06d}+00:00",
                f"session-{rng.randrange(sessions):06d}",
                f"req-{batch:07d}-{k:05d}",
                "user: " + " ".join(words),
                "assistant: " + " ".join(reversed(words)),
            )
        )
    return out


def _median(fn: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _grep(log: PromptLog, session: str) -> list[dict[str, Any]]:
    needle = f'"session":"{session}"'.encode()
    found = []
    with log.segment.open("rb") as handle:
        for line in handle:
            if needle in line:
                found.append(json.loads(line))
    return found


def main(argv: list[str] | None = None) -> None:
    """Fill the log, trace one session both ways, detect a tampered record; print a table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="bench-promptlog-") as tmp:
        service = start_redis(Path(tmp) / "redis")
        try:
            client = redis.Redis.from_url(service.extra["url"])
            log = PromptLog(client, Path(tmp) / "log", "bench", fsync=False)
            redactor = build_redactor()
            sample = "I am eve@corp.com, +1 415 555 0132; " + " ".join(WORDS[:30])
            redact_s, _ = _median(lambda: [redactor.redact(sample) for _ in range(2000)], 3)
            build_s, _ = _median(
                lambda: [
                    build_record(0.0, "r", "s", sample, sample, redactor, "text")
                    for _ in range(1000)
                ],
                3,
            )

            started = time.perf_counter()
            batches = (args.records + args.batch - 1) // args.batch
            for b in range(batches):
                size = min(args.batch, args.records - b * args.batch)
                log.append(_records(rng, b, size, args.sessions))
            fill_s = time.perf_counter() - started

            synced = PromptLog(client, Path(tmp) / "synced", "synced", fsync=True)
            started = time.perf_counter()
            for b in range(50):
                synced.append(_records(rng, b, args.batch, args.sessions))
            fsync_batch_s = (time.perf_counter() - started) / 50

            session = f"session-{rng.randrange(args.sessions):06d}"
            index_s, trace = _median(lambda: log.trace(session), args.rounds)
            scan_s, scanned = _median(lambda: log.scan(session), max(1, args.rounds // 2))
            grep_s, grepped = _median(lambda: _grep(log, session), args.rounds)
            assert trace.ok, "an intact log must verify"
            requests = [r.record["request"] for r in trace.records]
            assert requests == [r["request"] for r in scanned] == [r["request"] for r in grepped]

            intact_s, intact = _median(lambda: log.verify(), 3)
            assert intact.ok, [p.render() for p in intact.problems]

            lines = log.segment.read_bytes()
            target = len(trace.records) // 2
            victim = trace.records[target]
            entry = log.entry(victim.batch)
            assert entry is not None
            raw = json.loads(_read_line(lines, log, victim.batch, victim.leaf))
            raw["answer"] = raw["answer"].replace("a", "4", 1)  # one character, same length
            _patch(log, victim.batch, victim.leaf, json.dumps(raw, separators=(",", ":")))
            detect_s, report = _median(lambda: log.verify(), 3)
            located = {(p.batch, p.leaf) for p in report.problems}
            assert (victim.batch, victim.leaf) in located, [p.render() for p in report.problems]
            batch_s, one = _median(lambda: log.verify_batch(victim.batch), args.rounds)
            assert (victim.batch, victim.leaf) in {(p.batch, p.leaf) for p in one.problems}
            after_s, after = _median(lambda: log.trace(session), args.rounds)
            flagged = [(r.batch, r.leaf) for r in after.records if not r.ok]

            info = client.info("memory")
            seg_mb = log.segment.stat().st_size / 1e6
            tree_mb = log.tree_file.stat().st_size / 1e6
        finally:
            service.stop()

    print(
        f"records {args.records:,} in {batches} batches of {args.batch}, "
        f"{args.sessions:,} sessions; segment {seg_mb:.0f} MB, trees {tree_mb:.0f} MB, "
        f"Redis {info['used_memory'] / 1e6:.0f} MB (roots + index)"
    )
    print(
        f"fill: {fill_s:.1f} s ({args.records / fill_s:,.0f} records/s, fsync off); "
        f"with fsync {fsync_batch_s * 1000:.1f} ms per batch of {args.batch}"
    )
    print(
        f"redaction {redact_s / 2000 * 1e6:.0f} us per prompt; record build (2 texts) "
        f"{build_s / 1000 * 1e6:.0f} us"
    )
    print()
    print(
        f"trace-back of {session} ({len(trace.records)} records in "
        f"{len({r.batch for r in trace.records})} batches), median of {args.rounds}:"
    )
    print(f"  {'index + proofs':<28}{index_s * 1000:>10.1f} ms")
    print(
        f"  {'full scan (parse all)':<28}{scan_s * 1000:>10.1f} ms   ratio {scan_s / index_s:,.0f}x"
    )
    print(
        f"  {'grep scan (no proofs)':<28}{grep_s * 1000:>10.1f} ms   ratio {grep_s / index_s:,.0f}x"
    )
    print("  notes' target: ~120 ms via the index vs 8.2 s of full scans")
    print()
    print(f"tamper detection (one character of batch {victim.batch} leaf {victim.leaf} edited):")
    print(f"  {'verify(), intact log':<28}{intact_s * 1000:>10.1f} ms")
    print(
        f"  {'verify(), tampered':<28}{detect_s * 1000:>10.1f} ms   "
        f"found: {'; '.join(p.render() for p in report.problems)}"
    )
    print(f"  {'verify_batch(b) targeted':<28}{batch_s * 1000:>10.2f} ms")
    print(f"  {'trace after tampering':<28}{after_s * 1000:>10.1f} ms   flags {flagged}")
    print("  notes' target: detection within 300 ms")


def _read_line(data: bytes, log: PromptLog, batch: int, leaf: int) -> bytes:
    entry = log.entry(batch)
    assert entry is not None
    chunk = data[entry.records_offset : entry.records_end]
    return chunk.splitlines()[leaf]


def _patch(log: PromptLog, batch: int, leaf: int, line: str) -> None:
    entry = log.entry(batch)
    assert entry is not None
    with log.segment.open("r+b") as handle:
        handle.seek(entry.records_offset)
        chunk = handle.read(entry.records_length)
        lines = chunk.splitlines(keepends=True)
        offset = entry.records_offset + sum(len(x) for x in lines[:leaf])
        assert len(line) + 1 == len(lines[leaf]), "the bench edits in place, same length"
        handle.seek(offset)
        handle.write(line.encode() + b"\n")


if __name__ == "__main__":
    main()
