"""The gateway's prompt log writer: the request path only queues an answered request; a
background thread captures its prompt and answer, redacts, batches and appends them."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from redline.gateway.promptcapture import answer_text, prompt_text, session_of, streamed_text
from redline.platform.promptlog import (
    PromptLog,
    PromptLogError,
    PromptLogSettings,
    build_record,
    open_prompt_log,
)

log = logging.getLogger(__name__)

_STOP = object()


class PromptLogWriter:
    """The gateway's background writer: `submit` only enqueues (never blocks, drops when the
    queue is full); a thread redacts, batches and appends."""

    def __init__(self, settings: PromptLogSettings, prompt_log: PromptLog) -> None:
        self.settings = settings
        self.log = prompt_log
        self.redactor = settings.redactor()
        self.queue: queue.Queue[Any] = queue.Queue(settings.queue_size)
        self.dropped = 0
        self.failed = 0
        self.written = 0
        self._thread: threading.Thread | None = None

    def submit(
        self,
        request_id: str,
        headers: Sequence[tuple[str, str]],
        payload: Mapping[str, Any] | None,
        body: bytes | None,
        streamed: Sequence[bytes] | None = None,
        truncated: bool = False,
    ) -> None:
        """Queue one answered request (the request path's only cost): a response's `body`, or
        for a stream the raw content deltas it sent (`streamed`), `truncated` when it was cut
        short. Decoding, redaction and hashing happen on the writer's thread."""
        try:
            item = (time.time(), request_id, headers, payload, body, streamed, truncated)
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="prompt-log", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread is None:
            return
        self.queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        pending: list[Any] = []
        deadline = 0.0
        while True:
            timeout = None if not pending else max(0.0, deadline - time.monotonic())
            try:
                item = self.queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._flush(pending)
                return
            if item is not None:
                if not pending:
                    deadline = time.monotonic() + self.settings.flush_seconds
                pending.append(item)
            if pending and (item is None or len(pending) >= self.settings.batch_size):
                self._flush(pending)
                pending = []

    def _flush(self, items: list[Any]) -> None:
        if not items:
            return
        try:
            records = [
                build_record(
                    ts,
                    request_id,
                    session_of(headers, payload, request_id),
                    prompt_text(payload),
                    answer_text(body) if streamed is None else streamed_text(streamed),
                    self.redactor,
                    self.settings.store,
                    truncated,
                )
                for ts, request_id, headers, payload, body, streamed, truncated in items
            ]
            self.log.append(records)
            self.written += len(records)
        except (PromptLogError, OSError, redis.RedisError) as exc:
            # Logging must never take the gateway down; the lost records are counted.
            self.failed += len(items)
            log.error("prompt log: %d records not written: %s", len(items), exc)


def open_prompt_log_writer(settings: PromptLogSettings, redis_url: str) -> PromptLogWriter | None:
    """The gateway's writer when `settings.enabled` (not started), else None."""
    if not settings.enabled:
        return None
    return PromptLogWriter(settings, open_prompt_log(settings, redis_url))
