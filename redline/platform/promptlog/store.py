"""The prompt log's store: batches appended to the segment files and anchored in Redis (the
root chain and the session index) and mirrored to `roots.jsonl`; trace-back of a session with
inclusion proofs; the entry points of verification.

Layout (one directory, one writer at a time: appends hold an exclusive `flock` on `lock`):

- `records-<segment>.seg` and `tree-<segment>.bin` (`segments`): the records, batch after
  batch, and each batch's Merkle tree (`merkle`);
- `roots.jsonl` and, in Redis, the list `{prefix}:prompts:roots` with the head
  `{prefix}:prompts:head` (`<batches>:<last chain hash>`): one anchor per batch (`format`);
- the session index in Redis: `{prefix}:prompts:s:<session>`, a list of
  `<batch>:<leaf>:<offset>:<length>`. It only locates records; everything `trace` returns is
  checked against the anchored root with an inclusion proof.

Why files for the records and Redis for the anchors and the index: a million records of a few
hundred bytes are a few hundred MB, which sequential files hold for free and Redis would hold
in RAM; the anchors (one small entry per batch) and the index (a short string per record) are
tens of MB, and Redis gives a second copy of the roots on another machine plus O(1) look-ups.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import redis

from redline.core.redisconn import open_redis
from redline.platform.promptlog.errors import PromptLogError
from redline.platform.promptlog.format import (
    EMPTY_HEAD,
    BatchEntry,
    Head,
    PromptRecord,
    build_batch,
    parse_record,
    record_content_hash,
)
from redline.platform.promptlog.merkle import leaf_hash, verify_proof
from redline.platform.promptlog.segments import SegmentFiles, read_range, stored_proof
from redline.platform.promptlog.settings import PromptLogSettings
from redline.platform.promptlog.verify import (
    RESEALED,
    Problem,
    VerifyReport,
    check_chain,
    check_segments,
    check_tree,
    compare_copies,
    diagnose_batch,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TracedRecord:
    """One record of a session, its inclusion proof, the anchored root and whether it verifies."""

    batch: int
    leaf: int
    record: dict[str, Any]
    proof: list[str]
    root: str
    ok: bool
    problem: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "batch": self.batch,
            "leaf": self.leaf,
            "record": self.record,
            "proof": self.proof,
            "root": self.root,
            "verified": self.ok,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Trace:
    """A session's records in log order."""

    session: str
    records: list[TracedRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every record's proof verifies against its anchored root."""
        return all(r.ok for r in self.records)


@dataclass(frozen=True)
class PromptLogKeys:
    """Redis keys of the log (hash-tagged so they share a cluster slot)."""

    roots: str
    head: str
    session_prefix: str

    @classmethod
    def for_prefix(cls, prefix: str) -> PromptLogKeys:
        """Keys under `{prefix}`."""
        return cls(
            f"{{{prefix}}}:prompts:roots", f"{{{prefix}}}:prompts:head", f"{{{prefix}}}:prompts:s:"
        )

    def session(self, session: str) -> str:
        """The index key of a session."""
        return self.session_prefix + session


_APPEND_LUA = """
local head = redis.call('GET', KEYS[2])
if not head then
  if redis.call('LLEN', KEYS[1]) > 0 then return {-1, 'prompt log head key missing'} end
  head = ARGV[4]
end
if head ~= ARGV[1] then return {0, head} end
redis.call('RPUSH', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[2])
for k = 3, #KEYS do
  for item in string.gmatch(ARGV[k + 2], '[^,]+') do redis.call('RPUSH', KEYS[k], item) end
end
return {1, ARGV[2]}
"""

SHIFTED = (
    "not at its indexed offset: bytes before it were edited, inserted or removed "
    "(redline prompts verify says where)"
)


class PromptLog(SegmentFiles):
    """Append, trace and verify the prompt log of `directory`, anchored in Redis."""

    def __init__(
        self,
        client: redis.Redis,
        directory: Path,
        prefix: str = "redline",
        fsync: bool = True,
        segment_bytes: int = 16 << 20,
    ) -> None:
        super().__init__(directory)
        self.client = client
        self.keys = PromptLogKeys.for_prefix(prefix)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.roots_file = directory / "roots.jsonl"
        self._script = client.register_script(_APPEND_LUA)
        self._mirrored: int | None = None

    # appends ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "lock").open("a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def head(self) -> Head:
        """The anchored head (the empty head when nothing was appended)."""
        raw = self.client.get(self.keys.head)
        return Head.parse(as_text(raw)) if raw else EMPTY_HEAD

    def entry(self, batch: int) -> BatchEntry | None:
        """The anchored entry of `batch` (None when there is none)."""
        raw = self.client.lindex(self.keys.roots, batch)
        return None if raw is None else BatchEntry.parse(as_text(raw))

    def anchored(self) -> tuple[list[str], Head | None]:
        """Every anchored entry line in Redis and the head (None when there is none), read at
        one instant."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(self.keys.roots, 0, -1)
            pipe.get(self.keys.head)
            raw_lines, raw_head = pipe.execute()
        return [as_text(x) for x in raw_lines], Head.parse(as_text(raw_head)) if raw_head else None

    def append(self, records: Sequence[PromptRecord]) -> BatchEntry:
        """Write `records` as one batch, anchor its root, mirror it; its entry."""
        with self._locked():
            head = self.head()
            last = self.entry(head.count - 1) if head.count else None
            if last is None:
                segment, records_at, tree_at = 0, 0, 0
            elif last.records_end >= self.segment_bytes:
                # The current segment is full: it is closed for good, the batch opens the next.
                self._cut(self.segment_path(last.segment), last.records_end)
                self._cut(self.tree_path(last.segment), last.tree_end)
                segment, records_at, tree_at = last.segment + 1, 0, 0
            else:
                segment, records_at, tree_at = last.segment, last.records_end, last.tree_end
            for stale in (self.segment_path(segment + 1), self.tree_path(segment + 1)):
                if stale.exists():
                    self._cut(stale, 0)
            built = build_batch(records, head.count, head.chain, records_at, tree_at, segment)
            self._write_at(self.segment_path(segment), records_at, built.records)
            self._write_at(self.tree_path(segment), tree_at, built.tree)
            sessions = list(built.index)
            reply = self._script(
                keys=[self.keys.roots, self.keys.head, *(self.keys.session(s) for s in sessions)],
                args=[
                    head.render(),
                    Head(head.count + 1, built.entry.chain).render(),
                    built.entry.render(),
                    EMPTY_HEAD.render(),
                    *(",".join(built.index[s]) for s in sessions),
                ],
            )
            status, value = int(reply[0]), as_text(reply[1])
            if status != 1:
                raise PromptLogError(f"anchoring batch {head.count} failed: {value}")
            self._mirror()
            return built.entry

    def _cut(self, path: Path, offset: int) -> None:
        # Bytes past the last anchored batch belong to an append that never anchored: they were
        # never part of the log, so they are cut before a batch takes their place.
        with contextlib.suppress(FileNotFoundError), path.open("r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size > offset:
                log.warning(
                    "%s: dropping %d unanchored bytes of an interrupted append", path, size - offset
                )
                handle.truncate(offset)

    def _write_at(self, path: Path, offset: int, data: bytes) -> None:
        with path.open("ab+") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size < offset:
                raise PromptLogError(
                    f"{path} holds {size} bytes, the anchored batches {offset}: it was truncated"
                )
            if size > offset:
                log.warning(
                    "%s: dropping %d unanchored bytes of an interrupted append", path, size - offset
                )
                handle.truncate(offset)
            handle.write(data)
            handle.flush()
            if self.fsync:
                os.fsync(handle.fileno())

    def _mirror(self) -> None:
        """Append to roots.jsonl the entries it lacks (it follows Redis, never leads)."""
        try:
            if self._mirrored is None:
                self._mirrored = len(read_lines(self.roots_file))
            lines = [
                as_text(x)
                for x in cast(list[Any], self.client.lrange(self.keys.roots, self._mirrored, -1))
            ]
            if lines:
                with self.roots_file.open("a", encoding="utf-8") as handle:
                    handle.write("".join(f"{line}\n" for line in lines))
                    handle.flush()
                    if self.fsync:
                        os.fsync(handle.fileno())
                self._mirrored += len(lines)
        except (OSError, redis.RedisError) as exc:
            self._mirrored = None
            log.error("prompt log roots mirror %s not updated: %s", self.roots_file, exc)

    # trace-back ----------------------------------------------------------------------------

    def trace(self, session: str) -> Trace:
        """The session's records from the index, each with its inclusion proof checked against
        the anchored root of its batch (no scan: one index read, then a read per record)."""
        raw = cast(list[Any], self.client.lrange(self.keys.session(session), 0, -1))
        located = []
        for item in raw:
            b, leaf, offset, length = (int(x) for x in as_text(item).split(":"))
            located.append((b, leaf, offset, length))
        if not located:
            return Trace(session)
        batches = sorted({b for b, *_ in located})
        with self.client.pipeline(transaction=False) as pipe:
            for b in batches:
                pipe.lindex(self.keys.roots, b)
            anchored = dict(zip(batches, pipe.execute(), strict=True))
        out: list[TracedRecord] = []
        with contextlib.ExitStack() as stack:
            files: dict[int, tuple[BinaryIO, BinaryIO] | OSError] = {}
            for b, leaf, offset, length in located:
                text = anchored.get(b)
                if text is None:
                    out.append(
                        TracedRecord(b, leaf, {}, [], "", False, "no anchored root for the batch")
                    )
                    continue
                entry = BatchEntry.parse(as_text(text))
                if entry.segment not in files:
                    try:
                        files[entry.segment] = (
                            stack.enter_context(self.segment_path(entry.segment).open("rb")),
                            stack.enter_context(self.tree_path(entry.segment).open("rb")),
                        )
                    except OSError as exc:
                        files[entry.segment] = exc
                opened = files[entry.segment]
                if isinstance(opened, OSError):
                    problem = f"segment {entry.segment} cannot be read: {opened.strerror}"
                    out.append(TracedRecord(b, leaf, {}, [], entry.root, False, problem))
                    continue
                seg, tree_handle = opened
                out.append(self._traced(entry, leaf, read_range(seg, offset, length), tree_handle))
        return Trace(session, out)

    def _traced(
        self,
        entry: BatchEntry,
        leaf: int,
        raw: bytes,
        tree_handle: BinaryIO,
    ) -> TracedRecord:
        b = entry.batch
        record = parse_record(raw)
        if record is None or (record["b"], record["i"]) != (b, leaf):
            return TracedRecord(b, leaf, {}, [], entry.root, False, SHIFTED)
        proof = stored_proof(tree_handle, entry, leaf)
        problem = ""
        if record_content_hash(record) != record["content_hash"]:
            problem = "content does not match its hash: edited"
        else:
            node = leaf_hash(str(record["ts"]), str(record["session"]), str(record["content_hash"]))
            if not verify_proof(node, leaf, entry.count, proof, bytes.fromhex(entry.root)):
                problem = "the inclusion proof does not lead to the anchored root: edited"
        return TracedRecord(
            b, leaf, record, [p.hex() for p in proof], entry.root, not problem, problem
        )

    def scan(self, session: str) -> list[dict[str, Any]]:
        """The session's records by reading every record (what a log without an index does)."""
        found: list[dict[str, Any]] = []
        for path in self.segment_files().values():
            with path.open("rb") as handle:
                for line in handle:
                    record = json.loads(line)
                    if record.get("session") == session:
                        found.append(record)
        return found

    # verification --------------------------------------------------------------------------

    def verify(self, deep: bool = False, threads: int = 2) -> VerifyReport:
        """Check both copies of the chain, that they agree, and every batch's sealed bytes;
        diagnose the batches that changed. `deep`: recompute every Merkle root too."""
        started = time.perf_counter()
        raw_lines, head = self.anchored()
        redis_entries, problems = check_chain(raw_lines, head or EMPTY_HEAD, "redis")
        file_entries, file_problems = check_chain(
            read_lines(self.roots_file), None, str(self.roots_file.name)
        )
        problems += file_problems
        if not problems:
            problems += compare_copies(redis_entries, file_entries, self.roots_file.name)
        problems += self.check_segments(redis_entries, None, deep, threads)
        records = sum(e.count for e in redis_entries)
        return VerifyReport(problems, len(redis_entries), records, time.perf_counter() - started)

    def verify_batch(self, batch: int) -> VerifyReport:
        """The targeted check: one batch's anchored entry, its sealed bytes, its records."""
        started = time.perf_counter()
        entry = self.entry(batch)
        if entry is None:
            return VerifyReport(
                [Problem("redis", "no anchored entry", batch)], 0, 0, time.perf_counter() - started
            )
        problems: list[Problem] = []
        if entry.chain != entry.expected_chain():
            problems.append(Problem("redis", "entry does not match its chain hash: edited", batch))
        try:
            data = self.segment_range(entry.segment, entry.records_offset, entry.records_length)
        except FileNotFoundError:
            name = self.segment_path(entry.segment).name
            problems.append(Problem("records", f"{name} is missing: deleted", batch))
            return VerifyReport(problems, 1, entry.count, time.perf_counter() - started)
        if hashlib.sha256(data).hexdigest() != entry.records_digest:
            problems += diagnose_batch(entry, data.splitlines(), self.stored_tree(entry)) or [
                Problem("records", RESEALED, batch)
            ]
        return VerifyReport(problems, 1, entry.count, time.perf_counter() - started)

    def check_trees(self, entries: Sequence[BatchEntry]) -> list[Problem]:
        """Check the stored trees of `entries` against their anchored roots (the records are
        not read: `trace` relies on these trees for its proofs)."""
        problems = []
        for entry in entries:
            reason = check_tree(entry, self.stored_tree(entry))
            if reason is not None:
                problems.append(Problem("tree", reason, entry.batch))
        return problems

    def check_segments(
        self,
        entries: Sequence[BatchEntry],
        segments: Iterable[int] | None = None,
        deep: bool = False,
        threads: int = 2,
        unanchored: bool = True,
    ) -> list[Problem]:
        """Check the sealed bytes of every batch of `segments` (None: all) against the anchored
        `entries` (the whole chain, trusted) and the files' sizes; diagnose the batches that
        changed. `deep`: diagnose every batch (recompute its root) even when its bytes are
        intact. `unanchored`: report bytes past the last anchored batch (the watcher, which
        sees appends in flight, judges those itself)."""
        return check_segments(
            self, entries, segments, deep, threads, unanchored, lambda: self.head().count
        )


def read_lines(path: Path) -> list[str]:
    """The non-blank lines of a text file, none when it does not exist."""
    try:
        with path.open("r", encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def as_text(value: Any) -> str:
    """A Redis reply (bytes or str) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def open_prompt_log(settings: PromptLogSettings, redis_url: str) -> PromptLog:
    """The log `settings` describe, anchored in `settings.redis_url` or else `redis_url`."""
    client = open_redis(settings.redis_url or redis_url, socket_timeout=5.0)
    return PromptLog(
        client, settings.directory, settings.key_prefix, settings.fsync, settings.segment_bytes
    )
