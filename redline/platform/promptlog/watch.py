"""The prompt log's watcher: tampering detected as it happens, not at the next full verify.

A full `verify` reads every record: its cost grows with the log (a few hundred ms per million
records). The watcher runs beside the log (`redline prompts watch`) and re-checks only what a
change notification names, so detection costs the same at any log size:

1. **Baseline**: a full `verify`, and the stored trees checked against their roots. The anchored
   entries it read become the watcher's own copy of the chain: a third copy, in its memory,
   that later states of Redis and `roots.jsonl` are compared with.
2. **Change events**, handled at once:
   - the files' (Linux inotify on the directory, through libc): a changed `records-N.seg` gets
     the seals of segment N's batches checked (at most `segment_bytes` of SHA-256) and the
     batches that changed diagnosed record by record (edited, deleted, reordered); a changed
     `tree-N.bin` gets each batch's tree bytes compared with their digest when last checked,
     and those that differ rebuilt against the anchored root; `roots.jsonl` is compared with
     the watcher's copy (it may lag Redis by the batch being mirrored, never differ);
   - Redis' keyspace notifications on the roots list and the head (the watcher adds the `K`,
     `l`, `$` and `g` classes to `notify-keyspace-events` unless told not to): an RPUSH adds
     entries, accepted once their hash, link and sealed bytes check out; anything that changes
     an accepted entry, or the head, is tampering.
3. **A poll** every `poll_seconds`: the files' (inode, size, mtime, ctime) compared with what
   was last checked (the safety net for writes inotify does not report: through a shared
   mapping, from another host on a network filesystem, a platform without inotify), bytes past
   the last batch that stayed unanchored longer than `grace_seconds`, and the roots when the
   notifications are unavailable.
4. **A sweep** (a full `verify`) every `sweep_seconds`, for whatever all of that missed (an
   event queue overflow, notifications lost while the watcher was disconnected).

A legitimate append writes the last segment, its tree, then anchors (Redis) and mirrors
(`roots.jsonl`): bytes past the last anchored batch are that append in flight, and are only
reported if they stay unanchored past the grace. What the watcher cannot see is what `verify`
cannot see either (the records and every copy of the roots rewritten consistently) — plus,
since it compares with its own copy, nothing done before its baseline that the baseline
verify did not catch.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from redline.platform.promptlog.errors import PromptLogError
from redline.platform.promptlog.format import GENESIS, BatchEntry
from redline.platform.promptlog.inotify import EVERYTHING, Inotify
from redline.platform.promptlog.store import PromptLog, as_text, read_lines
from redline.platform.promptlog.verify import Problem, VerifyReport, check_tree

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(records|tree)-(\d{6,})\.(?:seg|bin)$")
_ROOTS = "roots"
_REDIS = "redis"
_PENDING = "pending"
_SWEEP = "sweep"

# What the watcher needs of notify-keyspace-events: keyspace channels (K) for lists (l),
# strings ($) and generic commands (g: DEL, RENAME, EXPIRE...). `A` stands for all classes.
_NOTIFY_NEEDED = frozenset("Kl$g")
_NOTIFY_ALL = frozenset("g$lshzxetd")


@dataclass(frozen=True)
class Detection:
    """What one check found that was not already known: the problems, what set the check off
    (a file, a Redis event, the poll, the sweep), when it ended and how long it took."""

    problems: list[Problem]
    trigger: str
    detected_at: float
    seconds: float

    def render(self) -> list[str]:
        """One line per problem, for the CLI."""
        return [
            f"{p.render()} [{self.trigger}, checked in {self.seconds * 1000:.1f} ms]"
            for p in self.problems
        ]


class WatchError(Exception):
    """The watcher cannot start (the log's directory or its Redis cannot be read)."""


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when a file's bytes or the file itself change (None: no such file). ctime
    cannot be set back by a user, so restoring mtime after an edit does not hide it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def enable_keyspace_notifications(client: redis.Redis) -> bool:
    """Add the classes the watcher needs to Redis' `notify-keyspace-events` (keeping the
    others); False when CONFIG is refused (a managed Redis: the watcher then polls)."""
    try:
        reply = client.config_get("notify-keyspace-events")
        current = str(reply.get("notify-keyspace-events", ""))
        have = set(current) | (_NOTIFY_ALL if "A" in current else set())
        missing = _NOTIFY_NEEDED - have
        if missing:
            client.config_set("notify-keyspace-events", current + "".join(sorted(missing)))
        return True
    except redis.ResponseError as exc:
        log.warning("keyspace notifications unavailable (%s): the roots are polled", exc)
        return False


@dataclass
class _Round:
    """The events one check handles together."""

    files: set[str] = field(default_factory=set)
    redis: bool = False
    everything: bool = False
    first: str = ""

    def add(self, kind: str, what: str) -> None:
        if not self.first:
            self.first = f"{what} ({kind})"
        if what == EVERYTHING:
            self.everything = True
        elif kind == _REDIS:
            self.redis = True
        else:
            self.files.add(what)


class PromptLogWatcher:
    """Watches one prompt log; `on_detection` is called (on the watcher's thread) with what
    each check finds that was not found before."""

    def __init__(
        self,
        prompt_log: PromptLog,
        on_detection: Callable[[Detection], None],
        poll_seconds: float = 1.0,
        sweep_seconds: float = 300.0,
        grace_seconds: float = 5.0,
        configure_redis: bool = True,
        use_inotify: bool = True,
        threads: int = 2,
    ) -> None:
        self.log = prompt_log
        self.on_detection = on_detection
        self.poll_seconds = poll_seconds
        self.sweep_seconds = sweep_seconds
        self.grace_seconds = grace_seconds
        self.configure_redis = configure_redis
        self.use_inotify = use_inotify
        self.threads = threads
        self.detections: list[Detection] = []
        self.checks = 0
        self.check_seconds = 0.0  # time spent checking after the baseline (its cost)
        self.notifications = False
        self.inotify = False
        self._events: queue.Queue[tuple[str, str]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lines: list[str] = []
        self._entries: list[BatchEntry] = []
        self._by_segment: dict[int, list[BatchEntry]] = {}
        self._file_lines = 0
        self._signatures: dict[str, tuple[int, int, int, int] | None] = {}
        self._trees: dict[int, str] = {}
        self._pending_since: float | None = None
        self._open: dict[str, set[str]] = {}
        self._open_lock = threading.Lock()  # `problems` is read from other threads

    # lifecycle ------------------------------------------------------------------------------

    def start(self) -> VerifyReport:
        """Take the baseline (a full verify, the trees checked), then watch; the baseline's
        report (its problems are also the first detection)."""
        started = time.perf_counter()
        if not self.log.directory.is_dir():
            raise WatchError(f"{self.log.directory} is not a directory")
        # Events are listened to before anything is read: a change made while the baseline
        # runs waits in the queue, checked once the watch starts.
        inotify: Inotify | None = None
        if self.use_inotify:
            try:
                inotify = Inotify(self.log.directory)
                self.inotify = True
            except (OSError, AttributeError) as exc:
                log.warning("no inotify (%s): the log's files are polled", exc)
        try:
            if self.configure_redis:
                self.notifications = enable_keyspace_notifications(self.log.client)
            pubsub = self._subscribe() if self.notifications else None
            self._signatures = {p.name: _signature(p) for p in self._files()}
            # The entries accepted are read before the verify, which covers at least them;
            # later ones come with their RPUSH notifications, checked as new.
            lines, _ = self.log.anchored()
            report = self.log.verify(threads=self.threads)
        except (redis.RedisError, OSError, PromptLogError) as exc:
            if inotify is not None:
                inotify.close()
            raise WatchError(f"cannot read the prompt log: {exc}") from None
        self._accept_baseline(lines)
        found = {_SWEEP: list(report.problems)}
        for entry in self._entries:
            found[f"tree-{entry.batch}"] = self._check_tree(entry)
        self._record(found, "baseline", started)
        self._spawn(self._check_loop, "prompt-watch")
        if inotify is not None:
            self._spawn(lambda: self._file_loop(inotify), "prompt-watch-files")
        if pubsub is not None:
            self._spawn(lambda: self._redis_loop(pubsub), "prompt-watch-redis")
        return report

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching (joins the threads)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []

    @property
    def batches(self) -> int:
        """The anchored batches the watcher has accepted."""
        return len(self._entries)

    @property
    def problems(self) -> list[str]:
        """Every problem currently known, rendered."""
        with self._open_lock:
            return sorted(set().union(*self._open.values()))

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # event sources --------------------------------------------------------------------------

    def _file_loop(self, inotify: Inotify) -> None:
        try:
            while not self._stop.is_set():
                for name in inotify.read(0.2):
                    self._events.put(("file", name))
        finally:
            inotify.close()

    def _channels(self) -> dict[str, str]:
        db = self.log.client.connection_pool.connection_kwargs.get("db", 0)
        keys = (self.log.keys.roots, self.log.keys.head)
        return {f"__keyspace@{db}__:{key}": key for key in keys}

    def _subscribe(self) -> Any:
        pubsub = self.log.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(*self._channels())
        return pubsub

    def _redis_loop(self, pubsub: Any) -> None:
        while not self._stop.is_set():
            try:
                message = pubsub.get_message(timeout=0.2)
                if message is not None and message.get("type") == "message":
                    self._events.put((_REDIS, as_text(message.get("data"))))
            except (redis.RedisError, OSError) as exc:
                log.warning("keyspace notifications lost (%s): resubscribing", exc)
                with contextlib.suppress(redis.RedisError, OSError):
                    pubsub.close()
                if self._stop.wait(1.0):
                    break
                with contextlib.suppress(redis.RedisError, OSError):
                    pubsub = self._subscribe()
                # Whatever happened while disconnected: everything is checked again.
                self._events.put((_REDIS, EVERYTHING))
        with contextlib.suppress(redis.RedisError, OSError):
            pubsub.close()

    # the checks -----------------------------------------------------------------------------

    def _check_loop(self) -> None:
        next_poll = time.monotonic() + self.poll_seconds
        next_sweep = time.monotonic() + self.sweep_seconds
        while not self._stop.is_set():
            wait = max(0.0, min(next_poll, next_sweep) - time.monotonic())
            round_ = _Round()
            try:
                round_.add(*self._events.get(timeout=min(wait, 0.2)))
                while True:
                    round_.add(*self._events.get_nowait())
            except queue.Empty:
                pass
            try:
                if round_.first:
                    self.check(round_, round_.first)
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + self.poll_seconds
                    self._poll()
                if now >= next_sweep:
                    next_sweep = now + self.sweep_seconds
                    self.sweep()
            except (redis.RedisError, OSError, PromptLogError) as exc:
                # Not tampering: the log cannot be read right now. Everything is checked again.
                log.error("prompt log watch: check failed: %s", exc)
                self._events.put(("file", EVERYTHING))
                self._stop.wait(1.0)

    def check(self, round_: _Round, trigger: str) -> None:
        """Check what the round's events name (the Redis anchors first: an append's entries
        are accepted before its files are looked at)."""
        started = time.perf_counter()
        self.checks += 1
        everything = round_.everything
        # Signatures first: a change made while this check runs is seen by the next poll.
        names = {p.name for p in self._files()} if everything else round_.files
        for name in names | {self.log.roots_file.name}:
            self._signatures[name] = _signature(self.log.directory / name)
        segments: set[int] = set()
        trees: set[int] = set()
        roots_file = everything or self.log.roots_file.name in round_.files
        for name in round_.files:
            match = _FILE.match(name)
            if match:
                (segments if match.group(1) == "records" else trees).add(int(match.group(2)))
        found: dict[str, list[Problem]] = {}
        # The roots file is never ahead of Redis (it is mirrored after anchoring): read before
        # Redis, an entry only the file holds was not written by the log.
        check_redis = everything or round_.redis or roots_file or not self.notifications
        file_lines = read_lines(self.log.roots_file) if check_redis else []
        fresh: list[BatchEntry] = []
        if check_redis:
            found[_REDIS], fresh = self._check_redis()
            roots_file = roots_file or bool(fresh)
        if everything:
            segments |= set(self._by_segment)
            trees |= set(self._by_segment)
        # New batches: their own seal and tree (a change to the rest of their segment comes
        # with events of its own); a seal that fails gets the segment checked and diagnosed.
        unsealed = [e for e in fresh if e.segment not in segments and not self.log.sealed(e)]
        segments |= {e.segment for e in unsealed}
        for segment in sorted(segments):
            found[f"records-{segment}"] = self.log.check_segments(
                self._entries, {segment}, threads=self.threads, unanchored=False
            )
        fresh_trees = [e for e in fresh if e.segment not in trees]
        for entry in fresh_trees + [e for s in sorted(trees) for e in self._by_segment.get(s, [])]:
            found[f"tree-{entry.batch}"] = self._check_tree(entry)
        if roots_file:
            found[_ROOTS] = self._check_roots_file(file_lines)
        found[_PENDING] = self._check_pending()
        self._record(found, trigger, started)
        self.check_seconds += time.perf_counter() - started

    def sweep(self) -> None:
        """A full verify, for whatever the events missed."""
        started = time.perf_counter()
        report = self.log.verify(threads=self.threads)
        self._record({_SWEEP: report.problems}, "sweep", started)

    def _poll(self) -> None:
        changed = _Round()
        for path in self._files():
            signature = _signature(path)
            if self._signatures.get(path.name) != signature:
                changed.add("poll", path.name)
        present = {p.name for p in self._files()}
        for name, signature in self._signatures.items():
            if name not in present and signature is not None:
                changed.add("poll", name)  # a file that went away
        if not self.notifications:
            changed.redis = True
        if changed.first or changed.redis:
            self.check(changed, changed.first or "poll")
        else:
            started = time.perf_counter()
            self._record({_PENDING: self._check_pending()}, "poll", started)

    def _files(self) -> list[Path]:
        names = [self.log.roots_file]
        with contextlib.suppress(FileNotFoundError):
            names += [p for p in self.log.directory.iterdir() if _FILE.match(p.name)]
        return names

    def _record(self, found: dict[str, list[Problem]], trigger: str, started: float) -> None:
        """Keep each checked scope's problems (a scope checked clean forgets its own); report
        those no scope knew of."""
        fresh: list[Problem] = []
        with self._open_lock:
            known: set[str] = set().union(*self._open.values())
            for scope, problems in found.items():
                rendered = {p.render(): p for p in problems}
                fresh += [p for text, p in rendered.items() if text not in known]
                known |= set(rendered)
                if rendered:
                    self._open[scope] = set(rendered)
                else:
                    self._open.pop(scope, None)
        if not fresh:
            return
        detection = Detection(fresh, trigger, time.time(), time.perf_counter() - started)
        self.detections.append(detection)
        try:
            self.on_detection(detection)
        except Exception:  # a failing callback must not stop the watch
            log.exception("prompt log watch: the detection callback failed")

    # the anchors ----------------------------------------------------------------------------

    def _accept_baseline(self, lines: list[str]) -> None:
        prev = GENESIS
        for position, line in enumerate(lines):
            try:
                entry = BatchEntry.parse(line)
            except PromptLogError:
                break
            if entry.chain != entry.expected_chain() or entry.batch != position:
                break
            if entry.prev != prev:
                break
            self._lines.append(line)
            self._entries.append(entry)
            self._by_segment.setdefault(entry.segment, []).append(entry)
            prev = entry.chain
        self._file_lines = len(read_lines(self.log.roots_file))

    def _check_redis(self) -> tuple[list[Problem], list[BatchEntry]]:
        """Compare the anchors in Redis with the watcher's copy; accept new entries whose
        hash and link check out. The problems, and the entries accepted."""
        lines, head = self.log.anchored()
        known = len(self._lines)
        problems: list[Problem] = []
        changed = [k for k in range(min(known, len(lines))) if lines[k] != self._lines[k]]
        if len(lines) < known:
            problems.append(
                Problem(
                    "redis",
                    f"the roots list holds {len(lines)} entries, {known} were anchored: "
                    "roots removed",
                    changed[0] if changed else len(lines),
                )
            )
        for k in changed[:5]:
            problems.append(Problem("redis", _entry_change(self._entries[k], lines[k], k), k))
        if len(changed) > 5:
            problems.append(Problem("redis", f"{len(changed) - 5} more anchored entries changed"))
        if problems:
            return problems, []
        fresh: list[BatchEntry] = []
        prev = self._entries[-1].chain if self._entries else GENESIS
        for position in range(known, len(lines)):
            try:
                entry = BatchEntry.parse(lines[position])
            except PromptLogError as exc:
                problems.append(Problem("redis", f"a new entry: {exc}", position))
                break
            if entry.chain != entry.expected_chain() or entry.batch != position:
                problems.append(
                    Problem("redis", "a new entry does not match its hash or position", position)
                )
                break
            if entry.prev != prev:
                problems.append(
                    Problem("redis", "a new entry is not linked to the last anchored one", position)
                )
                break
            fresh.append(entry)
            prev = entry.chain
        if problems:
            return problems, []
        count = known + len(fresh)
        if head is None and count:
            return [Problem("redis", "the head key is missing: deleted")], []
        if head is not None and (head.count != count or (count and head.chain != prev)):
            return [
                Problem(
                    "redis",
                    f"the head says {head.count} batches ({head.chain[:16]}), the roots list "
                    f"{count}: the head was edited or roots removed from the end",
                )
            ], []
        if not fresh:
            return [], []
        self._lines += lines[known:count]
        self._entries += fresh
        for entry in fresh:
            self._by_segment.setdefault(entry.segment, []).append(entry)
        return [], fresh

    def _check_roots_file(self, lines: list[str]) -> list[Problem]:
        name = self.log.roots_file.name
        problems = []
        for k in range(min(len(lines), len(self._lines))):
            if lines[k] != self._lines[k]:
                problems.append(
                    Problem(
                        "roots",
                        f"the entry in {name} differs from the anchored one: one copy was edited",
                        k,
                    )
                )
                break
        if len(lines) > len(self._lines):
            problems.append(
                Problem(
                    "roots",
                    f"{name} holds {len(lines)} entries, Redis {len(self._lines)}: "
                    "entries added to the file outside the log",
                    len(self._lines),
                )
            )
        if len(lines) < self._file_lines:
            problems.append(
                Problem(
                    "roots",
                    f"{name} holds {len(lines)} entries, it held {self._file_lines}: "
                    "roots removed from the file",
                )
            )
        self._file_lines = len(lines)
        return problems

    # the files ------------------------------------------------------------------------------

    def _check_tree(self, entry: BatchEntry) -> list[Problem]:
        """A batch's stored tree: its bytes unchanged since they last checked out, or rebuilt
        against the anchored root (and their digest kept when they check out)."""
        tree = self.log.stored_tree(entry)
        digest = None if tree is None else hashlib.sha256(tree).hexdigest()
        if digest is not None and digest == self._trees.get(entry.batch):
            return []
        reason = check_tree(entry, tree)
        if reason is not None:
            return [Problem("tree", reason, entry.batch)]
        if digest is not None:
            self._trees[entry.batch] = digest
        return []

    def _check_pending(self) -> list[Problem]:
        """Bytes past the last anchored batch: an append in flight, unless they stay."""
        last = self._entries[-1] if self._entries else None
        end = 0 if last is None else last.records_end
        after = -1 if last is None else last.segment
        pending = 0
        for number, path in self.log.segment_files().items():
            if number >= after:
                with contextlib.suppress(FileNotFoundError):
                    pending += max(0, path.stat().st_size - (end if number == after else 0))
        if not pending:
            self._pending_since = None
            return []
        now = time.monotonic()
        if self._pending_since is None:
            self._pending_since = now
        if now - self._pending_since < self.grace_seconds:
            return []
        return [
            Problem(
                "records",
                f"{pending} bytes past the last anchored batch for over {self.grace_seconds:g} "
                "s: an interrupted append, or records written outside the log",
            )
        ]


def _entry_change(old: BatchEntry, line: str, position: int) -> str:
    """What changed in an accepted entry, in words."""
    try:
        new = BatchEntry.parse(line)
    except PromptLogError:
        return "the anchored entry no longer parses: edited"
    if new.batch != old.batch:
        return (
            f"the entry of batch {new.batch} is now at position {position}: roots removed, "
            "inserted or reordered"
        )
    if new.root != old.root:
        return "the anchored root was edited"
    fields = [k for k, v in old.body().items() if new.body().get(k) != v]
    return f"the anchored entry was edited ({', '.join(fields) or 'its formatting'})"
