"""The prompt log's watcher against a real Redis and real files: appends pass, every kind of
tampering is reported by the check its change event sets off."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from redline.platform.promptlog import BatchEntry, PromptLog, PromptRecord
from redline.platform.promptlog.watch import Detection, PromptLogWatcher

pytestmark = pytest.mark.integration

SEGMENT_BYTES = 4096  # two batches of eight records per segment file


def make_records(batch: int, n: int = 8) -> list[PromptRecord]:
    return [
        PromptRecord(
            f"2026-01-01T00:{batch:02d}:{k:02d}.000000+00:00",
            f"s{k % 3}",
            f"req-{batch}-{k}",
            f"prompt {batch}/{k} " + "x" * 120,
            f"answer {batch}/{k}",
        )
        for k in range(n)
    ]


class Watch:
    """A started watcher and the detections it reported, in order."""

    def __init__(self, log: PromptLog, **options: float | bool) -> None:
        self.found: queue.Queue[Detection] = queue.Queue()
        self.seen: list[Detection] = []
        self.watcher = PromptLogWatcher(log, self.found.put, **options)  # type: ignore[arg-type]
        self.baseline = self.watcher.start()

    def wait(self, match: Callable[[str], bool], timeout: float = 5.0) -> Detection:
        """The first detection (reported so far or within `timeout`) with a matching problem."""
        deadline = time.monotonic() + timeout
        while True:
            for detection in self.seen:
                if any(match(p.render()) for p in detection.problems):
                    return detection
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"nothing matched; reported: {self.rendered()}")
            try:
                self.seen.append(self.found.get(timeout=left))
            except queue.Empty:
                pass

    def rendered(self) -> list[str]:
        while not self.found.empty():
            self.seen.append(self.found.get())
        return [line for d in self.seen for line in d.render()]


@pytest.fixture()
def plog(redis_url: str, tmp_path: Path) -> PromptLog:
    log = PromptLog(redis.Redis.from_url(redis_url), tmp_path / "plog", "w", False, SEGMENT_BYTES)
    for b in range(6):
        log.append(make_records(b))
    return log


@pytest.fixture()
def watch(plog: PromptLog) -> Iterator[Watch]:
    running = Watch(plog, poll_seconds=0.2, sweep_seconds=3600, grace_seconds=0.5)
    yield running
    running.watcher.stop()


def entry(log: PromptLog, batch: int) -> BatchEntry:
    found = log.entry(batch)
    assert found is not None
    return found


def rewrite(path: Path, change: Callable[[list[bytes]], list[bytes]]) -> float:
    """Change a file's lines in place (same inode, never empty meanwhile); when it started."""
    started = time.time()
    data = b"".join(change(path.read_bytes().splitlines(keepends=True)))
    with path.open("r+b") as handle:
        handle.write(data)
        handle.truncate()
    return started


def line_of(log: PromptLog, batch: int, leaf: int) -> int:
    """The line number in its segment file of a record."""
    e = entry(log, batch)
    before = log.segment_path(e.segment).read_bytes()[: e.records_offset]
    return before.count(b"\n") + leaf


def test_the_log_rolls_segments_and_appends_are_not_tampering(
    plog: PromptLog, watch: Watch
) -> None:
    assert watch.baseline.ok and len(plog.segment_files()) == 3
    assert [entry(plog, b).segment for b in range(6)] == [0, 0, 1, 1, 2, 2]
    for b in range(6, 12):
        plog.append(make_records(b))
    time.sleep(1.0)  # several polls and every event of the appends
    assert watch.rendered() == []
    assert watch.watcher.batches == 12 and len(plog.segment_files()) == 6
    assert plog.verify(deep=True).ok and watch.watcher.checks > 0
    assert len(plog.trace("s1").records) == 12 * 3  # k = 1, 4, 7 of each batch


def test_edit_is_detected_in_the_segment_it_names(plog: PromptLog, watch: Watch) -> None:
    target = line_of(plog, 1, 5)  # batch 1 (segment 0, closed), leaf 5

    def edit(lines: list[bytes]) -> list[bytes]:
        record = json.loads(lines[target])
        record["answer"] = record["answer"].replace("answer", "ANSWER")  # same length
        lines[target] = json.dumps(record, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        return lines

    started = rewrite(plog.segment_path(0), edit)
    found = watch.wait(lambda text: "batch 1 leaf 5" in text and "edited" in text)
    assert "records-000000.seg" in found.trigger
    assert found.detected_at - started < 2.0


def test_deletion_is_detected(plog: PromptLog, watch: Watch) -> None:
    target = line_of(plog, 2, 3)  # batch 2 is the first of segment 1
    rewrite(plog.segment_path(1), lambda lines: lines[:target] + lines[target + 1 :])
    watch.wait(lambda text: "batch 2 leaf 3: missing: the record was deleted" in text)
    assert any("removed" in line for line in watch.rendered())


def test_reorder_is_detected(plog: PromptLog, watch: Watch) -> None:
    a = line_of(plog, 3, 1)

    def swap(lines: list[bytes]) -> list[bytes]:
        lines[a], lines[a + 1] = lines[a + 1], lines[a]
        return lines

    rewrite(plog.segment_path(1), swap)
    watch.wait(lambda text: "batch 3 leaf 2: found at position 1: reordered" in text)
    watch.wait(lambda text: "batch 3 leaf 1: found at position 2: reordered" in text)


def test_edited_root_in_redis_is_detected(plog: PromptLog, watch: Watch) -> None:
    forged = json.loads(plog.client.lindex(plog.keys.roots, 2) or b"{}")
    forged["root"] = "00" * 32
    plog.client.lset(plog.keys.roots, 2, json.dumps(forged))
    found = watch.wait(lambda text: "redis batch 2: the anchored root was edited" in text)
    assert found.trigger.endswith("(redis)") == watch.watcher.notifications
    plog.client.rpop(plog.keys.roots)  # and the last root removed
    watch.wait(lambda text: "roots removed" in text)


def test_deleted_segment_tree_and_roots_file_edits_are_detected(
    plog: PromptLog, watch: Watch
) -> None:
    tree = plog.tree_path(2)
    data = bytearray(tree.read_bytes())
    data[40] ^= 1  # a leaf of batch 4
    with tree.open("r+b") as handle:
        handle.write(bytes(data))
    watch.wait(lambda text: text.startswith("tree batch 4:") and "edited" in text)

    def reroot(lines: list[bytes]) -> list[bytes]:
        forged = json.loads(lines[1]) | {"root": "ab" * 32}
        lines[1] = json.dumps(forged, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        return lines

    rewrite(plog.roots_file, reroot)
    watch.wait(lambda text: text.startswith("roots batch 1:") and "edited" in text)

    plog.segment_path(0).unlink()
    watch.wait(lambda text: "records-000000.seg is missing" in text)


def test_bytes_written_past_the_last_batch_are_reported_after_the_grace(
    plog: PromptLog,
) -> None:
    running = Watch(plog, poll_seconds=0.1, sweep_seconds=3600, grace_seconds=2.0)
    try:
        with plog.segment_path(2).open("ab") as handle:
            handle.write(b'{"b":6,"i":0}\n')
        time.sleep(0.5)
        assert running.rendered() == []  # within the grace: could be an append in flight
        running.wait(lambda text: "bytes past the last anchored batch" in text)
    finally:
        running.watcher.stop()


def test_without_inotify_or_notifications_the_poll_detects(plog: PromptLog) -> None:
    running = Watch(
        plog,
        poll_seconds=0.1,
        sweep_seconds=3600,
        configure_redis=False,
        use_inotify=False,
    )
    try:
        assert not running.watcher.inotify and not running.watcher.notifications
        plog.append(make_records(6))
        target = line_of(plog, 0, 0)
        rewrite(plog.segment_path(0), lambda lines: [lines[target + 1], lines[target], *lines[2:]])
        running.wait(lambda text: "batch 0 leaf 1: found at position 0: reordered" in text)
        plog.client.lset(
            plog.keys.roots, 5, cast(bytes, plog.client.lindex(plog.keys.roots, 4)).decode()
        )
        running.wait(lambda text: "redis batch 5" in text)
        assert running.watcher.batches == 7
    finally:
        running.watcher.stop()


def test_the_sweep_finds_what_no_event_named(plog: PromptLog) -> None:
    running = Watch(
        plog, poll_seconds=3600, sweep_seconds=0.3, configure_redis=False, use_inotify=False
    )
    try:
        target = line_of(plog, 5, 7)
        rewrite(plog.segment_path(2), lambda lines: lines[:target])
        found = running.wait(lambda text: "batch 5 leaf 7: missing" in text)
        assert found.trigger == "sweep"
    finally:
        running.watcher.stop()
