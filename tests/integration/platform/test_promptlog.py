"""The prompt log on disk, anchored in a real Redis: append, trace with proofs, tamper cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
import redis

from redline.platform.promptlog import (
    BatchEntry,
    PromptLog,
    PromptRecord,
    content_hash,
)

pytestmark = pytest.mark.integration


def make_records(batch: int, n: int = 8) -> list[PromptRecord]:
    return [
        PromptRecord(
            f"2026-01-01T00:{batch:02d}:{k:02d}.000000+00:00",
            f"s{k % 3}",
            f"req-{batch}-{k}",
            f"prompt {batch}/{k}",
            f"answer {batch}/{k}",
        )
        for k in range(n)
    ]


@pytest.fixture()
def plog(redis_url: str, tmp_path: Path) -> PromptLog:
    log = PromptLog(redis.Redis.from_url(redis_url), tmp_path / "plog", "t", fsync=False)
    for b in range(4):
        log.append(make_records(b))
    return log


def seg_lines(log: PromptLog) -> list[bytes]:
    return log.segment_path(0).read_bytes().splitlines(keepends=True)


def write_lines(log: PromptLog, lines: list[bytes]) -> None:
    log.segment_path(0).write_bytes(b"".join(lines))


def test_intact_log_verifies_and_traces(plog: PromptLog) -> None:
    report = plog.verify(deep=True)
    assert report.ok, [p.render() for p in report.problems]
    assert (report.batches, report.records) == (4, 32)
    trace = plog.trace("s1")
    assert trace.ok and len(trace.records) == 4 * 3  # k = 1, 4, 7 in each batch
    assert [r.record["request"] for r in trace.records[:3]] == ["req-0-1", "req-0-4", "req-0-7"]
    assert all(len(r.proof) == 3 for r in trace.records)  # 8 leaves: 3 levels of siblings
    first = plog.entry(0)
    assert first is not None and trace.records[0].root == first.root
    assert [r["request"] for r in plog.scan("s1")] == [r.record["request"] for r in trace.records]
    assert plog.trace("nobody").records == []
    assert plog.roots_file.read_text().count("\n") == 4
    assert plog.verify_batch(2).ok


def test_edited_record(plog: PromptLog) -> None:
    lines = seg_lines(plog)
    record = json.loads(lines[13])  # batch 1, leaf 5 (session s2)
    record["answer"] = "tampered"
    lines[13] = (json.dumps(record) + "\n").encode()
    write_lines(plog, lines)
    report = plog.verify()
    assert not report.ok
    assert [(p.batch, p.leaf) for p in report.problems if p.leaf is not None] == [(1, 5)]
    assert "edited" in report.problems[-1].reason
    assert not plog.verify_batch(1).ok and plog.verify_batch(0).ok
    # The edited line grew: the records after it are not at their indexed offsets any more.
    bad = [r for r in plog.trace("s2").records if not r.ok]
    assert (bad[0].batch, bad[0].leaf, "edited" in bad[0].problem) == (1, 5, True)
    assert all("offset" in r.problem for r in bad[1:]) and len(bad) == 5


def test_edited_record_with_recomputed_hash(plog: PromptLog) -> None:
    lines = seg_lines(plog)
    record = json.loads(lines[2])
    record["prompt"] = "forged"
    record["content_hash"] = content_hash(record["request"], record["prompt"], record["answer"])
    record["prompt"] = "forged".ljust(len("prompt 0/2"))  # same length: offsets stay right
    record["content_hash"] = content_hash(record["request"], record["prompt"], record["answer"])
    lines[2] = (json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode()
    write_lines(plog, lines)
    problems = plog.verify().problems
    assert [(p.batch, p.leaf) for p in problems if p.leaf is not None] == [(0, 2)]
    bad = [r for r in plog.trace("s2").records if not r.ok]
    assert [(r.batch, r.leaf, "proof" in r.problem) for r in bad] == [(0, 2, True)]


def test_deleted_record(plog: PromptLog) -> None:
    lines = seg_lines(plog)
    del lines[10]  # batch 1, leaf 2
    write_lines(plog, lines)
    problems = plog.verify().problems
    located = [(p.batch, p.leaf) for p in problems if p.leaf is not None]
    assert located == [(1, 2)]
    assert any("deleted" in p.reason for p in problems)
    assert any("removed" in p.reason for p in problems)  # the segment is shorter


def test_reordered_records(plog: PromptLog) -> None:
    lines = seg_lines(plog)
    lines[25], lines[26] = lines[26], lines[25]  # batch 3, leaves 1 and 2
    write_lines(plog, lines)
    problems = plog.verify().problems
    assert sorted((p.batch, p.leaf) for p in problems) == [(3, 1), (3, 2)]
    assert all("reordered" in p.reason for p in problems)


def test_edited_root_in_redis(plog: PromptLog) -> None:
    entry = json.loads(cast(bytes, plog.client.lindex(plog.keys.roots, 2)))
    entry["root"] = "00" * 32
    plog.client.lset(plog.keys.roots, 2, json.dumps(entry))
    problems = plog.verify().problems
    assert problems[0].where == "redis" and problems[0].batch == 2
    assert "edited" in problems[0].reason
    assert not plog.verify_batch(2).ok


def test_edited_root_rechained_in_the_file(plog: PromptLog) -> None:
    entries = [BatchEntry.parse(x) for x in plog.roots_file.read_text().splitlines()]
    prev = entries[0].prev
    rewritten = []
    for entry in entries:
        body = entry.body() | {"prev": prev}
        if entry.batch == 1:
            body["root"] = "ab" * 32
        forged = BatchEntry(**body, chain="")
        forged = BatchEntry(**body, chain=forged.expected_chain())
        rewritten.append(forged.render())
        prev = forged.chain
    plog.roots_file.write_text("".join(f"{x}\n" for x in rewritten))
    problems = plog.verify().problems
    assert [(p.where, p.batch) for p in problems] == [("roots", 1)]


def test_deleted_last_batch_root(plog: PromptLog) -> None:
    plog.client.rpop(plog.keys.roots)
    problems = plog.verify().problems
    assert any(p.where == "redis" and "head" in p.reason for p in problems)


def test_interrupted_append_is_cut_and_appends_continue(plog: PromptLog) -> None:
    with plog.segment_path(0).open("ab") as handle:
        handle.write(b'{"half":')
    assert not plog.verify().ok  # unanchored bytes are reported...
    plog.append(make_records(4, 3))  # ...and cut by the next append
    assert plog.verify(deep=True).ok
    assert len(plog.trace("s0").records) == 4 * 3 + 1


def test_segments_roll_and_each_is_checked_on_its_own(redis_url: str, tmp_path: Path) -> None:
    log = PromptLog(redis.Redis.from_url(redis_url), tmp_path / "seg", "g", False, 3000)
    for b in range(7):
        log.append(make_records(b))
    segments = [cast(BatchEntry, log.entry(b)).segment for b in range(7)]
    assert segments == [0, 0, 1, 1, 2, 2, 3] and list(log.segment_files()) == [0, 1, 2, 3]
    assert log.verify(deep=True).ok
    trace = log.trace("s0")
    assert trace.ok and {r.batch for r in trace.records} == set(range(7))
    assert [r["request"] for r in log.scan("s0")] == [r.record["request"] for r in trace.records]

    # A record of batch 2 (the first of segment 1) deleted: batch 3 moved up intact.
    path = log.segment_path(1)
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[4]
    path.write_bytes(b"".join(lines))
    problems = log.verify().problems
    assert [(p.batch, p.leaf) for p in problems if p.batch is not None] == [(2, 4)]
    assert any("records-000001.seg holds" in p.reason and "removed" in p.reason for p in problems)
    entries = [cast(BatchEntry, log.entry(b)) for b in range(7)]
    assert log.check_segments(entries, {0, 2, 3}) == []  # the other segments, checked alone
    assert [p.leaf for p in log.check_segments(entries, {1})] == [None, 4]

    log.segment_path(2).unlink()
    problems = log.check_segments(entries, {2})
    assert len(problems) == 1 and "records-000002.seg is missing" in problems[0].reason
    assert not log.verify_batch(4).ok and log.verify_batch(6).ok
    assert [r.ok for r in log.trace("s0").records if r.batch in (4, 5)] == [False] * 6
    assert log.check_trees(entries) == []


def test_records_moved_between_batches_or_duplicated(plog: PromptLog) -> None:
    original = seg_lines(plog)
    lines = list(original)
    lines[7], lines[8] = lines[8], lines[7]  # batch 0's last record and batch 1's first
    write_lines(plog, lines)
    problems = [p.render() for p in plog.verify().problems]
    assert problems == ["records batch 0 leaf 7: found after records of batch 1: moved"]

    write_lines(plog, [*original[:10], original[9], *original[10:]])  # batch 1, leaf 1 twice
    problems = [p.render() for p in plog.verify().problems]
    assert "records batch 1 leaf 1: found 2 times: duplicated" in problems
    assert any("bytes were inserted" in p for p in problems)
