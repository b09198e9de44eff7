"""One holder at a time: an exclusive, non-blocking lock on a file (flock)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(path: Path, busy: Exception) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; raise `busy` at
    once when another process (or another open of the file) holds it. The kernel releases the
    lock when its holder dies, so a crashed holder never blocks the next one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["exclusive_lock"]
