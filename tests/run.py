"""`make pytest`: the e2e drills and the rest of the suite side by side, and nothing left running.

Two pytest processes run at once:
- the e2e drills (`--e2e=only`) at normal priority, in one process: they share a local stack and
  their deadlines are wall-clock ones, so they must get the CPU when they ask for it;
- everything else (`--e2e=without`) in parallel xdist workers at a lower priority: the unit and
  integration tests wait on real services more than they compute and take the CPU the drills
  leave idle (over a serial run, about half of two cores was idle). Each part is a session of
  its own, so its priority is its autogroup's nice value, which the services it spawns inherit
  (`redline.devstack.priority`): a plain `nice` weighed the rest's 4 workers against the drills'
  stack at an equal share, and the stack's P99 went over the red line on a busy machine.

Each runs in a process group of its own, with its output streamed line by line behind a prefix.
SIGINT, SIGTERM and SIGHUP are passed on to both groups as SIGINT, so pytest stops as Ctrl-C stops
it: the test in progress fails, fixtures tear down, stacks are stopped with `redline down`. A
group still running `GRACE_SECONDS` after that is killed; whatever its processes had started is
then stopped by their tether (`redline.devstack.tether`), which the suite's conftest claims.

Exit status: the first failing part's; 5 (no test ran) only when neither part ran a test.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from redline.devstack.priority import set_autogroup_nice

ROOT = Path(__file__).resolve().parents[1]
GRACE_SECONDS = 120.0
"""How long an interrupted part may tear down (a stack's `redline down` included)."""
NICE = 5
"""The rest of the suite runs this much nicer than the drills, as a process and as an autogroup
(CFS: about a third of the weight). At 10 the drills held but the rest's own timed tests starved
(two holds meant to overlap ran one after the other, leases lapsed, a fake node missed its 15 s):
5 of them failed in one run, none at 0, where the drills failed instead."""
NO_TESTS = 5


@dataclass
class Part:
    """One pytest process of the run."""

    name: str
    argv: list[str]
    nice: int = 0
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float | None = None
    output: list[str] = field(default_factory=list)

    def start(self) -> None:
        """Start the part in a process group of its own."""
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if self.nice:
            set_autogroup_nice(self.process.pid, self.nice)

    def signal(self, sig: int) -> None:
        """Send `sig` to the part's process group."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass


def build_parts(workers: int, extra: Sequence[str]) -> list[Part]:
    """The two pytest invocations of `make pytest`."""
    pytest = [sys.executable, "-m", "pytest"]
    return [
        Part("e2e", [*pytest, "--e2e=only", "--durations=10", *extra]),
        Part(
            "rest",
            nice=NICE,
            argv=[
                "nice",
                "-n",
                str(NICE),
                *pytest,
                "-n",
                str(workers),
                "--dist",
                "loadfile",
                "--e2e=without",
                "--durations=15",
                *extra,
            ],
        ),  # fmt: skip
    ]


def combined_status(codes: Sequence[int]) -> int:
    """The run's exit status from each part's."""
    if all(code == NO_TESTS for code in codes):
        return NO_TESTS
    for code in codes:
        if code not in (0, NO_TESTS):
            return code
    return 0


def _stream(parts: Sequence[Part], out: IO[str]) -> None:
    """Copy each part's output, line by line behind its name, until every part has ended."""
    selector = selectors.DefaultSelector()
    for part in parts:
        assert part.process is not None and part.process.stdout is not None
        os.set_blocking(part.process.stdout.fileno(), False)
        selector.register(part.process.stdout, selectors.EVENT_READ, (part, bytearray()))
    while selector.get_map():
        for key, _ in selector.select(timeout=1.0):
            part, pending = key.data
            chunk = key.fileobj.read(65536)  # type: ignore[union-attr]
            if chunk:
                pending.extend(chunk)
            *lines, rest = pending.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                part.output.append(text)
                out.write(f"[{part.name}] {text}\n")
            pending[:] = rest
            if not chunk:
                if rest:
                    out.write(f"[{part.name}] {rest.decode(errors='replace')}\n")
                selector.unregister(key.fileobj)
                part.ended = time.monotonic()
        out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run both parts; pass interrupts on; the combined exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    workers = int(os.environ.get("PYTEST_WORKERS", "4"))
    parts = build_parts(workers, args)
    interrupted: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        interrupted.append(signum)
        for part in parts:
            part.signal(signal.SIGINT if len(interrupted) == 1 else signal.SIGKILL)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    started = time.monotonic()
    for part in parts:
        part.start()
    try:
        _stream(parts, sys.stdout)
    finally:
        deadline = time.monotonic() + GRACE_SECONDS
        for part in parts:
            assert part.process is not None
            try:
                part.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                part.signal(signal.SIGKILL)
                part.process.wait()
    codes = [part.process.returncode for part in parts if part.process is not None]
    for part in parts:
        took = (part.ended or time.monotonic()) - part.started
        code = part.process.returncode if part.process is not None else None
        print(f"[{part.name}] exit {code} after {took / 60:.1f} min", flush=True)
    print(f"pytest parts done in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    if interrupted:
        return 128 + interrupted[0]
    return combined_status([code if code >= 0 else 128 - code for code in codes])


if __name__ == "__main__":
    raise SystemExit(main())
