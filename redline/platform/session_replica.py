"""The replica side of the session CDC stream: a consumer group member that applies each change
to the replica and only then XACKs it, so "not ACKed" means "not yet safe on the replica"; the
writer and the CDC RPO are `redline.platform.sessions`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis

from redline.platform.sessions import (
    DEFAULT_CONSUMER,
    DEFAULT_GROUP,
    DEFAULT_STREAM,
    REDIS_CONNECTION_ERRORS,
    SessionStoreError,
    stream_id_ms,
    trim_acknowledged,
)

log = logging.getLogger(__name__)


class ConsumerMode(StrEnum):
    """What the replica consumer does with the stream."""

    RUNNING = "running"  # read, apply to the replica, then ACK
    HOLDING = "holding"  # read (entries become pending) but neither apply nor ACK
    PAUSED = "paused"  # do not read: new entries stay undelivered


@dataclass
class ConsumerStats:
    """Counts since the consumer started."""

    applied: int = 0
    skipped: int = 0
    acked: int = 0
    errors: int = 0
    last_error: str | None = None
    trims: int = 0


@dataclass(frozen=True)
class _Change:
    entry_id: str
    op: str
    key: str
    value: str | None = None
    pxat: int | None = None


def _parse_change(entry_id: str, fields: Mapping[str, str]) -> _Change:
    op = fields.get("op")
    key = fields.get("key")
    if not key:
        raise SessionStoreError(f"CDC entry {entry_id}: no 'key' field")
    if op == "del":
        return _Change(entry_id, "del", key)
    if op == "set":
        value = fields.get("value")
        ttl_ms = fields.get("ttl_ms", "")
        if value is None or not ttl_ms.isdigit():
            raise SessionStoreError(f"CDC entry {entry_id}: 'set' needs 'value' and 'ttl_ms'")
        return _Change(entry_id, "set", key, value, stream_id_ms(entry_id) + int(ttl_ms))
    raise SessionStoreError(f"CDC entry {entry_id}: unknown op {op!r} (allowed: set, del)")


class ReplicaConsumer:
    """Applies the CDC stream to the replica through a consumer group, ACKing after applying.

    One consumer per group, under a stable name: a restarted consumer first re-applies its own
    pending entries (XREADGROUP from 0), in stream order, so the replica never moves backwards.
    Applying is idempotent (SET with the primary's absolute expiry, DEL), so re-applying after
    a crash between apply and ACK is harmless. `hold()` and `pause()` let drills stop ACKing.
    """

    def __init__(
        self,
        source: redis.Redis,
        replica: redis.Redis,
        stream: str = DEFAULT_STREAM,
        group: str = DEFAULT_GROUP,
        consumer: str = DEFAULT_CONSUMER,
        batch_size: int = 100,
        block_ms: int = 100,
        trim_interval_seconds: float | None = 5.0,
    ) -> None:
        if batch_size < 1:
            raise SessionStoreError(f"batch_size must be >= 1, got {batch_size}")
        if block_ms < 1:
            raise SessionStoreError(f"block_ms must be >= 1, got {block_ms}")
        self.source = source
        self.replica = replica
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.trim_interval_seconds = trim_interval_seconds
        self.stats = ConsumerStats()
        self._mode = ConsumerMode.RUNNING
        self._cond = threading.Condition()
        self._generation = 0  # bumped by each mode change
        self._seen = 0  # the generation the loop's latest round started under
        self._looping: threading.Thread | None = None
        self._backlog = True  # own pending entries to re-apply first
        self._last_trim = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def mode(self) -> ConsumerMode:
        """The current mode."""
        with self._cond:
            return self._mode

    def _set_mode(self, mode: ConsumerMode, wait_seconds: float) -> None:
        # Waiting until the loop starts a round under the new mode makes the change exact for
        # drills: once `hold()` returns, nothing more is ACKed. A round is bounded by block_ms
        # and the socket timeout; while Redis is down the wait gives up after `wait_seconds`.
        with self._cond:
            if mode is ConsumerMode.RUNNING and self._mode is not ConsumerMode.RUNNING:
                self._backlog = True  # entries read while holding wait in our PEL
            self._mode = mode
            self._generation += 1
            target = self._generation
            if self._looping is not None and self._looping is not threading.current_thread():
                self._cond.wait_for(
                    lambda: self._seen >= target or self._looping is None, wait_seconds
                )
        log.info("session replica consumer %s: %s", self.consumer, mode.value)

    def hold(self, wait_seconds: float = 5.0) -> None:
        """Keep reading but stop applying and ACKing (a stuck replica write)."""
        self._set_mode(ConsumerMode.HOLDING, wait_seconds)

    def pause(self, wait_seconds: float = 5.0) -> None:
        """Stop reading: new entries stay undelivered."""
        self._set_mode(ConsumerMode.PAUSED, wait_seconds)

    def resume(self, wait_seconds: float = 5.0) -> None:
        """Apply and ACK again, starting with whatever was read while holding."""
        self._set_mode(ConsumerMode.RUNNING, wait_seconds)

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing, reading from the beginning."""
        try:
            self.source.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _apply(self, changes: Sequence[_Change]) -> None:
        if not changes:
            return
        with self.replica.pipeline(transaction=False) as pipe:
            for change in changes:
                if change.op == "set":
                    assert change.value is not None and change.pxat is not None
                    # An expiry already in the past deletes the key, as on the primary.
                    pipe.set(change.key, change.value, pxat=change.pxat)
                else:
                    pipe.delete(change.key)
            pipe.execute()

    def _handle(self, entries: Sequence[tuple[str, Mapping[str, str]]]) -> int:
        changes: list[_Change] = []
        ids: list[str] = []
        for entry_id, fields in entries:
            ids.append(entry_id)
            if not fields:  # deleted from the stream (XDEL/XTRIM) while pending
                self.stats.skipped += 1
                continue
            try:
                changes.append(_parse_change(entry_id, fields))
            except SessionStoreError as exc:
                # A poison entry would otherwise block the group forever; it is logged and ACKed.
                log.error("skipping malformed CDC entry on %s: %s", self.stream, exc)
                self.stats.skipped += 1
        self._apply(changes)
        self.stats.applied += len(changes)
        if ids:
            self.stats.acked += int(self.source.xack(self.stream, self.group, *ids))
        return len(changes)

    def _read(self, start: str, block: int | None) -> list[tuple[str, Mapping[str, str]]]:
        reply: Any = self.source.xreadgroup(
            self.group, self.consumer, {self.stream: start}, count=self.batch_size, block=block
        )
        if not reply:
            return []
        # RESP2 clients get [[stream, entries]]; RESP3 ones {stream: [entries]}.
        if isinstance(reply, dict):
            batches = [items[0] for items in reply.values() if items]
        else:
            batches = [items for _name, items in reply]
        return [(str(entry_id), fields) for batch in batches for entry_id, fields in batch]

    def step(self) -> int:
        """One round: read, apply and ACK per the mode; return how many changes were applied."""
        with self._cond:
            mode = self._mode
            self._seen = self._generation
            self._cond.notify_all()
        if mode is ConsumerMode.PAUSED:
            self._stop.wait(self.block_ms / 1000.0)
            return 0
        if mode is ConsumerMode.HOLDING:
            self._read(">", self.block_ms)
            return 0
        applied = 0
        while self._backlog:
            entries = self._read("0", None)
            if not entries:
                self._backlog = False
                break
            applied += self._handle(entries)
        applied += self._handle(self._read(">", self.block_ms))
        self._maybe_trim()
        return applied

    def _maybe_trim(self) -> None:
        if self.trim_interval_seconds is None:
            return
        now = time.monotonic()
        if now - self._last_trim >= self.trim_interval_seconds:
            self._last_trim = now
            if trim_acknowledged(self.source, self.stream) is not None:
                self.stats.trims += 1

    def run(self, stop: threading.Event | None = None) -> None:
        """Loop until `stop` (or `self.stop()`); connection errors are logged and retried."""
        stop = stop or self._stop
        backoff = 0.1
        with self._cond:
            self._looping = threading.current_thread()
        try:
            while not stop.is_set() and not self._stop.is_set():
                try:
                    if self._backlog:
                        self.ensure_group()
                    self.step()
                    backoff = 0.1
                except REDIS_CONNECTION_ERRORS as exc:
                    self._error(exc)
                    self._backlog = True
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 2.0)
                except redis.ResponseError as exc:
                    self._error(exc)
                    if "NOGROUP" in str(exc):
                        self._backlog = True  # the stream or group was deleted: recreate it
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 2.0)
        finally:
            with self._cond:
                self._looping = None
                self._cond.notify_all()

    def _error(self, exc: Exception) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("session replica consumer %s: %s", self.consumer, self.stats.last_error)

    def start(self) -> None:
        """Run in a background thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run, name=f"session-replica-{self.consumer}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the background thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
