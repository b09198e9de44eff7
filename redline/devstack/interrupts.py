"""Interrupting `redline up` safely: SIGINT, SIGTERM and SIGHUP stop the start-up, but never
between spawning a part and recording it in the state file (the clean-up must know every part)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from redline.devstack.errors import StartInterruptedError
from redline.devstack.processes import INTERRUPTS


class InterruptGuard:
    """Turns SIGINT/SIGTERM/SIGHUP into StartInterruptedError, but never inside `hold()`.

    A signal may reach any thread (numpy's BLAS threads, say), so masking it in the main thread
    is not enough; instead the handler notes a signal that arrives while a part is being
    spawned and recorded, and the interruption is raised once the part is in the state file.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None

    def handler(self, signum: int, frame: object) -> None:
        """The signal handler installed by `interrupt_on_signals`."""
        if self.depth:
            self.pending = signum
            return
        raise StartInterruptedError(f"interrupted by {signal.Signals(signum).name}")

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Defer interruptions until the block (spawn + record) is done."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise StartInterruptedError(f"interrupted by {signal.Signals(signum).name}")


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[InterruptGuard]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise StartInterruptedError."""
    guard = InterruptGuard()
    previous = {sig: signal.signal(sig, guard.handler) for sig in INTERRUPTS}
    try:
        yield guard
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"interrupted by {signal.Signals(signum).name}")


@contextlib.contextmanager
def interrupt_as_keyboard() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP end it as Ctrl-C does: KeyboardInterrupt, which
    no `except Exception` of a drill swallows, so the caller's clean-up runs."""
    previous = {sig: signal.signal(sig, _keyboard_interrupt) for sig in INTERRUPTS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def shield_cleanup() -> None:
    """Ignore further interrupts while the parts already started are being stopped."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


__all__ = ["InterruptGuard", "interrupt_as_keyboard", "interrupt_on_signals", "shield_cleanup"]
