"""Unit tests are pure and in-process, and this enforces it: a test that starts a process
(`subprocess`, asyncio subprocesses, `os.posix_spawn`, `os.fork`, multiprocessing) fails. Such a
test belongs in tests/integration.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest


# A BaseException, so that code under test catching `Exception` (or `OSError`) cannot swallow
# it and pass: pytest still reports it as the test's failure.
class SubprocessInUnitTestError(BaseException):
    """A unit test started a process."""


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        shown = ", ".join(repr(a) for a in args if not isinstance(a, subprocess.Popen))
        raise SubprocessInUnitTestError(
            f"unit tests start no process; move this test to tests/integration: {what}({shown})"
        )

    return refuse


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way of starting a process raises for the duration of a unit test."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("subprocess.Popen"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"os.{name}"))
