"""Verify and diagnose the prompt log: both copies of the root chain (hashes, links, order,
head) and their agreement, the stored trees against their roots, and the sealed bytes of every
batch of some segments (SHA-256 in threads: the fast path); batches whose bytes changed are
diagnosed record by record (content hash, leaf order, missing leaves, leaves against the stored
tree and the anchored root) to say where. `deep` diagnoses every batch, recomputing its root.

The chain checks and the diagnosis of a batch are pure; the segment checks read the files
through `SegmentFiles`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from redline.platform.promptlog.errors import PromptLogError
from redline.platform.promptlog.format import (
    GENESIS,
    BatchEntry,
    Head,
    parse_record,
    record_content_hash,
)
from redline.platform.promptlog.merkle import build_levels, leaf_hash, split_levels
from redline.platform.promptlog.segments import SegmentFiles

RESEALED = "bytes differ from the sealed digest but every record verifies (reformatted)"


@dataclass(frozen=True)
class Problem:
    """Where the log does not verify: which copy, batch and leaf, and what it means."""

    where: str
    reason: str
    batch: int | None = None
    leaf: int | None = None

    def render(self) -> str:
        """One line for the CLI."""
        place = self.where
        if self.batch is not None:
            place += f" batch {self.batch}"
        if self.leaf is not None:
            place += f" leaf {self.leaf}"
        return f"{place}: {self.reason}"


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of `verify`: the problems found (none: intact) and what was checked."""

    problems: list[Problem]
    batches: int
    records: int
    seconds: float

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.problems


def check_chain(
    lines: Sequence[str], head: Head | None, where: str
) -> tuple[list[BatchEntry], list[Problem]]:
    """Parse a copy of the chain and check each entry's hash, its position and its link (and the
    head when given); the entries parsed (up to the first unparsable one) and the problems."""
    entries: list[BatchEntry] = []
    problems: list[Problem] = []
    prev = GENESIS
    for position, line in enumerate(lines):
        try:
            entry = BatchEntry.parse(line)
        except PromptLogError as exc:
            problems.append(Problem(where, str(exc), position))
            break
        entries.append(entry)
        if entry.chain != entry.expected_chain():
            problems.append(
                Problem(
                    where,
                    "entry does not match its chain hash: its root or seal was edited",
                    position,
                )
            )
        elif entry.batch != position:
            problems.append(
                Problem(
                    where,
                    f"entry of batch {entry.batch} at position {position}: "
                    "roots removed, inserted or reordered",
                    position,
                )
            )
        elif entry.prev != prev:
            problems.append(
                Problem(
                    where,
                    "prev does not match the previous entry's chain hash: "
                    "a root was edited, removed or reordered",
                    position,
                )
            )
        prev = entry.chain
    if head is not None and not problems and (head.count != len(entries) or head.chain != prev):
        problems.append(
            Problem(
                where,
                f"the chain holds {len(entries)} batches but the head says {head.count} "
                f"({head.chain[:16]}): roots removed from the end or the head edited",
            )
        )
    return entries, problems


def compare_copies(
    redis_entries: Sequence[BatchEntry], file_entries: Sequence[BatchEntry], file_name: str
) -> list[Problem]:
    """The roots file must hold the same entries as Redis (it may lag by the batch being
    mirrored right now, never differ)."""
    for position, (a, b) in enumerate(zip(redis_entries, file_entries, strict=False)):
        if a != b:
            what = "root" if a.root != b.root else "entry"
            return [
                Problem(
                    "roots",
                    f"the {what} in Redis and in {file_name} differ: one copy was edited",
                    position,
                )
            ]
    if len(file_entries) > len(redis_entries):
        return [
            Problem(
                "roots",
                f"{file_name} holds {len(file_entries)} batches, Redis {len(redis_entries)}: "
                "Redis lost roots",
            )
        ]
    if len(redis_entries) - len(file_entries) > 1:
        return [
            Problem(
                "roots",
                f"{file_name} holds {len(file_entries)} batches, Redis {len(redis_entries)}: "
                "roots removed from the file",
            )
        ]
    return []


def diagnose_batch(entry: BatchEntry, lines: Sequence[bytes], tree: bytes | None) -> list[Problem]:
    """Say which records of a batch whose bytes changed were edited, removed or reordered."""
    problems: list[Problem] = []
    where, b = "records", entry.batch
    leaves: list[bytes] = []
    seen: list[int] = []
    for position, raw in enumerate(lines):
        record = parse_record(raw)
        if record is None:
            problems.append(
                Problem(where, f"line {position} of the batch is not a record: {raw[:60]!r}", b)
            )
            continue
        leaf = record["i"]
        if record["b"] != b:
            problems.append(
                Problem(where, f"found among the records of batch {b}: moved", record["b"], leaf)
            )
            continue
        if record_content_hash(record) != record["content_hash"]:
            problems.append(
                Problem(
                    where,
                    f"request {record['request']}: content does not match its hash: edited",
                    b,
                    leaf,
                )
            )
        seen.append(leaf)
        leaves.append(
            leaf_hash(str(record["ts"]), str(record["session"]), str(record["content_hash"]))
        )
    for missing in sorted(set(range(entry.count)) - set(seen)):
        problems.append(Problem(where, "missing: the record was deleted", b, missing))
    extra = [leaf for leaf in seen if not 0 <= leaf < entry.count]
    for leaf in extra:
        problems.append(
            Problem(where, f"leaf index outside 0..{entry.count - 1}: inserted", b, leaf)
        )
    tally = Counter(seen)
    for leaf, times in sorted(tally.items()):
        if times > 1:
            problems.append(Problem(where, f"found {times} times: duplicated", b, leaf))
    for position, leaf in enumerate(seen):
        if leaf != position and tally[leaf] == 1 and len(seen) == entry.count:
            problems.append(Problem(where, f"found at position {position}: reordered", b, leaf))
    if problems or len(leaves) != entry.count:
        return problems or [Problem(where, f"{len(leaves)} records, {entry.count} anchored", b)]
    if build_levels(leaves)[-1][0].hex() == entry.root:
        return []
    stored: list[bytes] | None = None
    if tree is not None:
        with contextlib.suppress(PromptLogError):
            levels = split_levels(tree, entry.count)
            if levels[-1][0].hex() == entry.root:
                stored = levels[0]
    if stored is not None:
        for leaf, (now, then) in enumerate(zip(leaves, stored, strict=True)):
            if now != then:
                problems.append(
                    Problem(
                        where,
                        "ts, session or content_hash edited "
                        "(its leaf differs from the anchored tree)",
                        b,
                        leaf,
                    )
                )
        return problems
    return [
        Problem(
            where,
            "records do not hash to the anchored root (a record and the stored tree were edited)",
            b,
        )
    ]


def check_tree(entry: BatchEntry, tree: bytes | None) -> str | None:
    """Why a batch's stored tree cannot give proofs of its anchored root (None: it can): every
    level is rebuilt from the stored leaves and compared, the root against the anchor."""
    if tree is None:
        return "the stored tree cannot be read"
    try:
        levels = split_levels(tree, entry.count)
    except PromptLogError as exc:
        return f"the stored tree is cut or grown: {exc}"
    if build_levels(levels[0]) != levels:
        return "the stored tree was edited: its levels do not hash to each other"
    if levels[-1][0].hex() != entry.root:
        return "the stored tree was rebuilt over other leaves: it leads to another root"
    return None


def _leaf_of(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["i"])
    except (ValueError, KeyError, TypeError):
        return None


def _batch_of(line: bytes) -> int:
    try:
        return int(json.loads(line)["b"])
    except (ValueError, KeyError, TypeError):
        return -1


def _sha256_at(fd: int, offset: int, length: int) -> str:
    # pread, not mmap: a file truncated under a mapping kills the reader with SIGBUS, and the
    # watcher must outlive exactly that kind of tampering.
    return hashlib.sha256(os.pread(fd, max(0, length), offset)).hexdigest()


def _lines_from(path: Path, offset: int) -> Iterator[bytes]:
    with path.open("rb") as handle:
        handle.seek(offset)
        for line in handle:
            if line.strip():
                yield line.rstrip(b"\n")


def check_segments(
    files: SegmentFiles,
    entries: Sequence[BatchEntry],
    segments: Iterable[int] | None,
    deep: bool,
    threads: int,
    unanchored: bool,
    anchored_count: Callable[[], int],
) -> list[Problem]:
    """Check the sealed bytes of every batch of `segments` (None: all) against the anchored
    `entries` (the whole chain, trusted) and the files' sizes; diagnose the batches that
    changed. `deep`: diagnose every batch (recompute its root) even when its bytes are
    intact. `unanchored`: report bytes past the last anchored batch. `anchored_count` reads
    how many batches are anchored now (only when bytes past the last batch need explaining)."""
    if not entries:
        wanted = None if segments is None else set(segments)
        return _unanchored(files, None, wanted, 0, anchored_count) if unanchored else []
    groups: dict[int, list[BatchEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.segment, []).append(entry)
    asked = None if segments is None else set(segments)
    wanted = set(groups) if asked is None else asked & set(groups)
    problems: list[Problem] = []
    fds: dict[int, int] = {}
    last = entries[-1]
    try:
        for segment in sorted(wanted):
            path = files.segment_path(segment)
            group = groups[segment]
            try:
                fds[segment] = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                problems.append(
                    Problem(
                        "records",
                        f"{path.name} is missing: the {sum(e.count for e in group)} records "
                        f"of batches {group[0].batch}..{group[-1].batch} were deleted",
                        group[0].batch,
                    )
                )
        jobs = [(fds[s], e) for s in sorted(fds) for e in groups[s]]
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            # hashlib and pread release the GIL: the seals are checked in parallel.
            digests = list(
                pool.map(
                    lambda job: _sha256_at(job[0], job[1].records_offset, job[1].records_length),
                    jobs,
                    chunksize=max(1, len(jobs) // (8 * max(1, threads))),
                )
            )
        bad = {e.batch for (_, e), d in zip(jobs, digests, strict=True) if d != e.records_digest}
        for segment, fd in fds.items():
            problems += _check_segment(
                files, segment, fd, groups[segment], bad, last, deep, unanchored, anchored_count
            )
    finally:
        for fd in fds.values():
            os.close(fd)
    if unanchored:
        problems += _unanchored(files, last, asked, len(entries), anchored_count)
    return problems


def _unanchored(
    files: SegmentFiles,
    last: BatchEntry | None,
    segments: set[int] | None,
    count: int,
    anchored_count: Callable[[], int],
) -> list[Problem]:
    """Records files past the last anchored segment that hold bytes (an append in progress,
    one interrupted, or bytes written outside the log)."""
    after = -1 if last is None else last.segment
    stray = {
        n: path
        for n, path in files.segment_files().items()
        if n > after and (segments is None or n in segments)
    }
    found = [(path, path.stat().st_size) for path in stray.values() if path.exists()]
    found = [(path, size) for path, size in found if size]
    if found and anchored_count() != count:
        return []  # an append anchored since the entries were read: those bytes are its
    return [
        Problem(
            "records",
            f"{path.name} holds {size} bytes that no anchored batch names: an interrupted "
            "append, or records written outside the log",
        )
        for path, size in found
    ]


def _check_segment(
    files: SegmentFiles,
    segment: int,
    fd: int,
    group: Sequence[BatchEntry],
    bad: set[int],
    last: BatchEntry,
    deep: bool,
    unanchored: bool,
    anchored_count: Callable[[], int],
) -> list[Problem]:
    """Size and diagnosis of one records file whose batches' seals were checked (`bad`:
    the batches whose bytes differ from their seal)."""
    path = files.segment_path(segment)
    size, problems = _check_size(
        path.name, segment, fd, group, bad, last, unanchored, anchored_count
    )
    mine = [e for e in group if e.batch in bad]
    if not mine and not deep:
        return problems
    if mine and not deep:
        found = _diagnose_shifted(files, fd, group, mine, size - group[-1].records_end)
        if found is not None:
            return problems + found
    start = mine[0] if mine and not deep else group[0]
    last_bad = mine[-1].batch if mine and not deep else group[-1].batch
    # The general case: from the first changed batch on, records are grouped by the batch
    # they name (a removed or inserted line shifts later batches' bytes, not their records),
    # up to the first line of a batch after the last changed one.
    grouped, moved = _group_by_batch(path, start.records_offset, last_bad, group[-1].batch)
    problems += moved
    problems += _misplaced(grouped, group, last, path.name)
    shifted = any("moved" in p.reason for p in problems)
    for entry in group:
        if entry.batch < start.batch or entry.batch > last_bad:
            continue
        if entry.batch not in bad and not deep:
            continue  # its sealed bytes are intact where the anchor says
        found = diagnose_batch(entry, grouped.get(entry.batch, []), files.stored_tree(entry))
        problems += found
        shifted = shifted or bool(found)
        if not found and entry.batch in bad and not shifted:
            problems.append(Problem("records", RESEALED, entry.batch))
    return problems


def _check_size(
    name: str,
    segment: int,
    fd: int,
    group: Sequence[BatchEntry],
    bad: set[int],
    last: BatchEntry,
    unanchored: bool,
    anchored_count: Callable[[], int],
) -> tuple[int, list[Problem]]:
    """The size of a records file that its batches account for, and the problem when it is not
    the size its anchored batches end at."""
    size = os.fstat(fd).st_size
    end = group[-1].records_end
    trailing = size > end and last.segment == segment and not (bad & {e.batch for e in group})
    if trailing and (not unanchored or anchored_count() != last.batch + 1):
        size = end  # the bytes of an append in flight, or anchored since the entries were read
    if size == end:
        return size, []
    what = (
        "records were removed or shortened"
        if size < end
        else "unanchored bytes at its end (an interrupted append, or records "
        "written outside the log)"
        if trailing
        else "bytes were inserted or records lengthened"
    )
    return size, [
        Problem("records", f"{name} holds {size} bytes, the anchored batches {end}: {what}")
    ]


def _diagnose_shifted(
    files: SegmentFiles,
    fd: int,
    group: Sequence[BatchEntry],
    mine: Sequence[BatchEntry],
    delta: int,
) -> list[Problem] | None:
    """The diagnosis of the first changed batch alone when one edit of it explains every
    changed batch of the file (None: it does not, the general case applies)."""
    first = mine[0]
    # One edit that changed the length of `first` moves every later batch of the file by
    # `delta` bytes: their seals hold where they moved to, so only `first` is parsed.
    moved = all(
        _sha256_at(fd, e.records_offset + delta, e.records_length) == e.records_digest
        for e in mine[1:]
    )
    if not moved or (delta != 0 and len(mine) != len(group) - group.index(first)):
        return None
    data = os.pread(fd, max(0, first.records_length + delta), first.records_offset)
    found = diagnose_batch(first, data.splitlines(), files.stored_tree(first))
    return found or [Problem("records", RESEALED, first.batch)]


def _group_by_batch(
    path: Path, offset: int, last_bad: int, last_batch: int
) -> tuple[dict[int, list[bytes]], list[Problem]]:
    """The lines of a records file from `offset` by the batch they name (-1: not a record), up
    to the first line of a batch after `last_bad` and up to `last_batch`; and the records found
    after a later batch's records (moved)."""
    grouped: dict[int, list[bytes]] = {}
    problems: list[Problem] = []
    highest = -1
    for line in _lines_from(path, offset):
        b = _batch_of(line)
        if last_bad < b <= last_batch:
            break
        grouped.setdefault(b, []).append(line)
        if 0 <= b < highest:
            # Records are grouped by the batch they name, so a record moved into another
            # batch's bytes would look intact: its place in the file gives it away.
            leaf = _leaf_of(line)
            problems.append(
                Problem("records", f"found after records of batch {highest}: moved", b, leaf)
            )
        highest = max(highest, b)
    return grouped, problems


def _misplaced(
    grouped: dict[int, list[bytes]], group: Sequence[BatchEntry], last: BatchEntry, name: str
) -> list[Problem]:
    """The lines of a records file that are not records, and the records of batches that are
    not the file's."""
    problems = [
        Problem("records", f"a line of {name} that is not a record: {stray[:60]!r}")
        for stray in grouped.get(-1, [])
    ]
    here = {e.batch for e in group}
    for b in sorted(set(grouped) - here - {-1}):
        reason = (
            f"records of batch {b}, anchored in another segment, found in {name}: moved"
            if 0 <= b <= last.batch
            else "records of a batch that was never anchored: inserted"
        )
        problems.append(Problem("records", reason, b))
    return problems
