"""Prompt-log trace-back and tamper detection at 1 M records (design notes §3.3).

Starts a real redis-server (loopback, temp dir) and appends N records (default 1 M) of S
sessions (default 20 000, records spread at random over the whole log) in batches of B (default
1 024) through `PromptLog.append`: every batch gets its Merkle tree, sealed bytes and chained
root in Redis and `roots.jsonl`, and its records in the session index; segment files roll at
the settings' default size. Records are already redacted text (redaction is timed apart, per
record, on a realistic prompt). fsync is off for the fill: per-batch fsync measures the disk,
not the log, and is printed apart on 50 batches.

Then, side by side for one session (median of R rounds, warm page cache):
- index: `trace(session)`: one Redis list read, one read per record, inclusion proofs checked
  against the anchored roots;
- scan: what a log without an index does: read and parse every record, keep the session's;
- grep: the cheapest scan possible (a bytes search per line, parse only the hits; no proofs).

Tamper detection, side by side:
- `verify()`, the full check (both copies of the chain, every batch's sealed bytes, diagnosis of
  the changed batch), on the intact log and after one record is edited; `verify_batch(b)`;
- the watcher (`redline prompts watch`: inotify and Redis keyspace notifications, then the
  check of the segment, tree or roots that changed): for each kind of tampering — a record
  edited, deleted, two records swapped, a root edited in Redis, a tree node edited — R rounds
  on batches spread over the log, each timed from just before the tampering write to the
  watcher's report naming the batch (and the record), then undone. Also: its CPU per
  legitimate append (the checks an append's own events set off), and that appends while
  watching are not reported.

Run: `.venv/bin/python -m bench.promptlog [--records N] [--sessions S] [--batch B]`.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.figures import Figure, at_most, check, exit_code, info
from redline.devstack.processes import start_redis
from redline.platform.promptlog import (
    BatchEntry,
    PromptLog,
    PromptLogSettings,
    PromptRecord,
    build_record,
)
from redline.platform.promptlog.watch import Detection, PromptLogWatcher
from redline.platform.redaction import build_redactor

TARGET_DETECTION_S = 0.3
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
    for path in log.segment_files().values():
        with path.open("rb") as handle:
            for line in handle:
                if needle in line:
                    found.append(json.loads(line))
    return found


def _entry(log: PromptLog, batch: int) -> BatchEntry:
    entry = log.entry(batch)
    assert entry is not None
    return entry


def _write_in_place(path: Path, offset: int, data: bytes, size: int | None = None) -> None:
    """What a careful intruder does: write into the file, same inode (no new file, no rename),
    then cut it to `size`."""
    with path.open("r+b") as handle:
        handle.seek(offset)
        handle.write(data)
        if size is not None:
            handle.truncate(size)


def _batch_lines(log: PromptLog, batch: int) -> tuple[BatchEntry, list[bytes]]:
    entry = _entry(log, batch)
    with log.segment_path(entry.segment).open("rb") as handle:
        handle.seek(entry.records_offset)
        return entry, handle.read(entry.records_length).splitlines(keepends=True)


class _Tamper:
    """One kind of tampering: `apply(batch)` does it and returns what the report must name and
    how to undo it."""

    def __init__(self, log: PromptLog) -> None:
        self.log = log

    def edit(self, batch: int, leaf: int | None = None) -> tuple[str, Callable[[], None]]:
        entry, lines = _batch_lines(self.log, batch)
        leaf = len(lines) // 2 if leaf is None else leaf
        record = json.loads(lines[leaf])
        record["answer"] = record["answer"].replace("a", "4", 1)  # one character, same length
        forged = json.dumps(record, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        assert len(forged) == len(lines[leaf]), "the bench edits in place, same length"
        at = entry.records_offset + sum(len(x) for x in lines[:leaf])
        path = self.log.segment_path(entry.segment)
        _write_in_place(path, at, forged)
        return f"batch {batch} leaf {leaf}: request", lambda: _write_in_place(path, at, lines[leaf])

    def delete(self, batch: int) -> tuple[str, Callable[[], None]]:
        entry, lines = _batch_lines(self.log, batch)
        leaf = len(lines) // 3
        at = entry.records_offset + sum(len(x) for x in lines[:leaf])
        path = self.log.segment_path(entry.segment)
        size = path.stat().st_size
        with path.open("rb") as handle:
            handle.seek(at)
            tail = handle.read()
        _write_in_place(path, at, tail[len(lines[leaf]) :], size - len(lines[leaf]))
        return f"batch {batch} leaf {leaf}: missing", lambda: _write_in_place(path, at, tail)

    def reorder(self, batch: int) -> tuple[str, Callable[[], None]]:
        entry, lines = _batch_lines(self.log, batch)
        leaf = len(lines) // 4
        at = entry.records_offset + sum(len(x) for x in lines[:leaf])
        path = self.log.segment_path(entry.segment)
        pair = lines[leaf] + lines[leaf + 1]
        _write_in_place(path, at, lines[leaf + 1] + lines[leaf])
        return f"batch {batch} leaf {leaf}: found at", lambda: _write_in_place(path, at, pair)

    def root(self, batch: int) -> tuple[str, Callable[[], None]]:
        client, key = self.log.client, self.log.keys.roots
        raw = client.lindex(key, batch)
        assert isinstance(raw, bytes)
        original = raw.decode()
        client.lset(key, batch, json.dumps(json.loads(original) | {"root": "00" * 32}))

        def undo() -> None:
            client.lset(key, batch, original)

        return f"redis batch {batch}:", undo

    def tree(self, batch: int) -> tuple[str, Callable[[], None]]:
        entry = _entry(self.log, batch)
        path = self.log.tree_path(entry.segment)
        at = entry.tree_offset + 32 * entry.count + 7  # a node of the second level
        with path.open("rb") as handle:
            handle.seek(at)
            byte = handle.read(1)
        _write_in_place(path, at, bytes([byte[0] ^ 1]))
        return f"tree batch {batch}:", lambda: _write_in_place(path, at, byte)


def _detection_rounds(
    log: PromptLog, rounds: int, batches: int
) -> tuple[dict[str, list[float]], float, float, int, int, float]:
    """Start a watcher over the filled log; time each kind of tampering `rounds` times; then
    time legitimate appends while it watches."""
    found: queue.Queue[Detection] = queue.Queue()
    watcher = PromptLogWatcher(log, found.put, poll_seconds=1.0, sweep_seconds=3600)
    started = time.perf_counter()
    baseline = watcher.start()
    baseline_s = time.perf_counter() - started
    assert baseline.ok, [p.render() for p in baseline.problems]
    tamper = _Tamper(log)
    kinds: dict[str, Callable[[int], tuple[str, Callable[[], None]]]] = {
        "record edited": tamper.edit,
        "record deleted": tamper.delete,
        "records reordered": tamper.reorder,
        "root edited (Redis)": tamper.root,
        "tree node edited": tamper.tree,
    }
    rng = random.Random(11)
    times: dict[str, list[float]] = {}
    try:
        for kind, apply in kinds.items():
            for _ in range(rounds):
                batch = rng.randrange(batches - 1)  # never the last: its segment is live
                begun = time.time()
                needle, undo = apply(batch)
                detection = _wait_for(found, needle, 5.0)
                times.setdefault(kind, []).append(detection.detected_at - begun)
                undo()
                _settle(watcher, found)
        spent_before = watcher.check_seconds
        appended = 20
        rng_fill = random.Random(5)
        for b in range(appended):
            log.append(_records(rng_fill, batches + b, 1024, 20_000))
            time.sleep(0.05)
        time.sleep(1.5)  # every event of the appends checked, a poll or two
        per_append = (watcher.check_seconds - spent_before) / appended
        false_alarms = sum(len(d.problems) for d in _drain(found))
        checked = watcher.batches
    finally:
        watcher.stop()
    return times, baseline_s, per_append, false_alarms, checked, watcher.check_seconds


def _wait_for(found: queue.Queue[Detection], needle: str, timeout: float) -> Detection:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            detection = found.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen += detection.render()
        if any(needle in p.render() for p in detection.problems):
            return detection
    raise AssertionError(f"no report named {needle!r} within {timeout} s; reported: {seen}")


def _drain(found: queue.Queue[Detection]) -> list[Detection]:
    out = []
    while not found.empty():
        out.append(found.get())
    return out


def _settle(watcher: PromptLogWatcher, found: queue.Queue[Detection]) -> None:
    """Wait until the undone tampering is checked (the watcher knows no problem), then drop
    what it reported meanwhile."""
    deadline = time.monotonic() + 5
    while watcher.problems and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not watcher.problems, watcher.problems
    _drain(found)


def run(argv: list[str] | None = None) -> list[Figure]:
    """Fill the log, trace one session both ways, detect tampering; print the tables and
    return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    segment_bytes = PromptLogSettings().segment_bytes
    with tempfile.TemporaryDirectory(prefix="bench-promptlog-") as tmp:
        service = start_redis(Path(tmp) / "redis")
        try:
            client = redis.Redis.from_url(service.extra["url"])
            log = PromptLog(client, Path(tmp) / "log", "bench", False, segment_bytes)
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

            victim = trace.records[len(trace.records) // 2]
            needle, undo = _Tamper(log).edit(victim.batch, victim.leaf)
            detect_s, report = _median(lambda: log.verify(), 3)
            assert any(needle in p.render() for p in report.problems), report.problems
            batch_s, one = _median(lambda: log.verify_batch(victim.batch), args.rounds)
            assert any(needle in p.render() for p in one.problems)
            after_s, after = _median(lambda: log.trace(session), args.rounds)
            flagged = [(r.batch, r.leaf) for r in after.records if not r.ok]
            undo()
            assert log.verify().ok

            watched = _detection_rounds(log, args.rounds, batches)
            times, baseline_s, per_append, false_alarms, accepted, _ = watched

            memory = client.info("memory")
            files = log.segment_files()
            seg_mb = sum(p.stat().st_size for p in files.values()) / 1e6
            tree_mb = sum(log.tree_path(n).stat().st_size for n in files) / 1e6
        finally:
            service.stop()

    print(
        f"records {args.records:,} in {batches} batches of {args.batch}, "
        f"{args.sessions:,} sessions; {len(files)} segment files of up to "
        f"{segment_bytes / 2**20:.0f} MiB, {seg_mb:.0f} MB; trees {tree_mb:.0f} MB; "
        f"Redis {memory['used_memory'] / 1e6:.0f} MB (roots + index)"
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
    print(f"  {'index + proofs':<34}{index_s * 1000:>10.1f} ms")
    print(
        f"  {'full scan (parse all)':<34}{scan_s * 1000:>10.1f} ms   ratio {scan_s / index_s:,.0f}x"
    )
    print(
        f"  {'grep scan (no proofs)':<34}{grep_s * 1000:>10.1f} ms   ratio {grep_s / index_s:,.0f}x"
    )
    print("  notes' target: ~120 ms via the index vs 8.2 s of full scans")
    print()
    target_ms = TARGET_DETECTION_S * 1000
    print(f"tamper detection over {args.records:,} records (target {target_ms:.0f} ms):")
    print(f"  {'full verify(), intact log':<34}{intact_s * 1000:>10.1f} ms   (median of 3)")
    print(
        f"  {'full verify(), one record edited':<34}{detect_s * 1000:>10.1f} ms   "
        f"found: {'; '.join(p.render() for p in report.problems)}"
    )
    print(f"  {'verify_batch(b), targeted':<34}{batch_s * 1000:>10.1f} ms")
    print(f"  {'trace after the edit':<34}{after_s * 1000:>10.1f} ms   flags {flagged}")
    print(
        f"  watcher (inotify + keyspace notifications, the changed segment re-checked), "
        f"tampering write -> report naming it, {args.rounds} rounds each:"
    )
    worst = 0.0
    for kind, values in times.items():
        worst = max(worst, max(values))
        print(
            f"    {kind:<32}median {statistics.median(values) * 1000:>7.1f} ms   "
            f"max {max(values) * 1000:>7.1f} ms"
        )
    verdict = "met" if worst <= TARGET_DETECTION_S else "NOT met"
    appended_batches = 20  # what _detection_rounds appends while watching
    print(
        f"  watcher: baseline (full verify + every tree) {baseline_s:.1f} s once; "
        f"{per_append * 1000:.1f} ms of checks per legitimate append; "
        f"{false_alarms} reports during 20 appends ({accepted} batches accepted)"
    )
    print(
        f"  target: detection within {TARGET_DETECTION_S * 1000:.0f} ms: {verdict} "
        f"(worst {worst * 1000:.0f} ms; full verify alone {detect_s * 1000:.0f} ms, growing "
        "with the log; the watcher's check is bounded by one segment)"
    )
    return [
        at_most(
            "promptlog",
            "watcher: worst tampering write -> report",
            worst * 1000,
            "ms",
            TARGET_DETECTION_S * 1000,
        ),
        check(
            "promptlog",
            f"watcher: no report during {appended_batches} legitimate appends",
            false_alarms == 0,
            "none",
        ),
        info(
            "promptlog", f"trace-back via the index, {args.records:,} records", index_s * 1000, "ms"
        ),
        info("promptlog", "full scan / index trace-back", scan_s / index_s, "x"),
        info("promptlog", "full verify(), one record edited", detect_s * 1000, "ms"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
