"""Helpers of the e2e tests: the real CLI in a subprocess, orphan detection, a crashed run."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from redline.devstack.layout import StackLayout
from redline.devstack.state import PartState, StackState, write_state

UP_TIMEOUT = 300.0


def redline(
    *args: str, timeout: float = 120.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (`python -m redline.cli ...`) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "redline.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Every live process whose command line contains `text` (orphans of a run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in ("Z", "X"):
            found.append((int(entry.name), cmdline.strip()))
    return found


def seed_crashed_run(layout: StackLayout) -> list[int]:
    """A run directory whose state file lists processes that have since exited."""
    pids = []
    for _ in range(2):
        process = subprocess.Popen(["true"])
        process.wait()
        pids.append(process.pid)
    parts = [
        PartState(
            name=f"part-{i}",
            kind="redline",
            pid=pid,
            start_ticks=1,
            log="x",
            started_at=time.time() - 3600,
        )  # fmt: skip
        for i, pid in enumerate(pids)
    ]
    state = StackState(run_dir=str(layout.root), spec=None, spec_source="<embedded>",
                       host="127.0.0.1", regions=["primary", "secondary"], ports={}, rate=50.0,
                       seed=1, started_at=time.time() - 3600, parts=parts)  # fmt: skip
    write_state(layout, state)
    layout.marker.write_text("crashed run\n")
    (layout.root / "logs").mkdir(exist_ok=True)
    (layout.root / "logs" / "old.log").write_text("from the crashed run\n")
    return pids


@dataclass
class RunningStack:
    """The session's stack: its run directory, state and what `redline up` printed."""

    run_dir: Path
    state: StackState
    up: subprocess.CompletedProcess[str]
    up_seconds: float
