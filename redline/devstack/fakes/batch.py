"""The simulator's scheduler: at most `limit` requests in the running batch, the rest waiting.

vLLM admits at most `--max-num-seqs` requests into its running batch and keeps the others in
its waiting queue, first come first served (vllm/v1/core/sched/scheduler.py); SGLang and TGI
do the same with their own limits. A simulator with `Faults.max_concurrency` set behaves so: a
request holds a slot for its service time, a request finding none waits, and its wait is what
the engine's queue-time histogram records. The counts go to `on_change` at every change (the
engine's waiting and running gauges). With no limit nothing ever waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

Observer = Callable[[int, int, int | None], None]
"""Called with (waiting, running, limit) after every change."""


class Batch:
    """The running batch and the FIFO of requests waiting for a slot in it."""

    def __init__(self, on_change: Observer | None = None) -> None:
        self.running = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.limit: int | None = None
        self.on_change = on_change

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(len(self.waiting), self.running, self.limit)

    def _admit(self) -> None:
        """Move waiting requests into the batch while it has room."""
        while self.waiting and (self.limit is None or self.running < self.limit):
            future = self.waiting.popleft()
            if not future.done():
                self.running += 1
                future.set_result(None)

    def set_limit(self, limit: int | None) -> None:
        """A new batch limit (None: unlimited); a raised one admits waiting requests at once."""
        self.limit = limit
        self._admit()
        self._changed()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold a slot of the batch for the block; yields how long the request waited for it."""
        waited = 0.0
        if self.limit is not None and (self.running >= self.limit or self.waiting):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.append(future)
            self._changed()
            started = time.monotonic()
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._release()  # admitted just as the client went away
                else:
                    self.waiting.remove(future)
                    self._changed()
                raise
            waited = time.monotonic() - started
        else:
            self.running += 1
        self._changed()
        try:
            yield waited
        finally:
            self._release()

    def _release(self) -> None:
        self.running -= 1
        self._admit()
        self._changed()


__all__ = ["Batch", "Observer"]
