"""`make pytest`: the e2e drills, then the rest of the suite, and nothing left running.

Two pytest processes, one after the other:
- the e2e drills (`--e2e=only`), in one process: they share a local stack and judge wall-clock
  figures (a P99 over 0.8 s, a restore within its bound), so they run on an otherwise idle
  machine;
- everything else (`--e2e=without`), in parallel xdist workers: the unit and integration tests
  wait on real services more than they compute.

Run side by side (until this module's previous version) they failed a few tests in every run on
two cores, a different few each time: the stack's own P99 went over the red line before a fault,
a loaded secondary breached in turn, a first-byte budget opened a breaker. Niceness does not
help: with Linux's sched_autogroup every session is weighed against the others at its
autogroup's nice (`/proc/PID/autogroup`), not its processes' (`nice -n 10` in a session of its
own still took half of two cores), and with the rest's autogroup niced the drills held but the
rest's own timed tests starved. One after the other costs about 6 minutes of the 15 and fails
none of them.

Each runs in a process group of its own, with its output streamed line by line behind a prefix.
SIGINT, SIGTERM and SIGHUP are passed on to the running part as SIGINT, so pytest stops as Ctrl-C
stops it: the test in progress fails, fixtures tear down, stacks are stopped with `redline down`,
and the next part does not start. A part still running `GRACE_SECONDS` after that is killed;
whatever its processes had started is then stopped by their tether (`redline.devstack.tether`),
which the suite's conftest claims.

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

ROOT = Path(__file__).resolve().parents[1]
GRACE_SECONDS = 120.0
"""How long an interrupted part may tear down (a stack's `redline down` included)."""
NO_TESTS = 5


@dataclass
class Part:
    """One pytest process of the run."""

    name: str
    argv: list[str]
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
            [
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


def failure_lines(output: Sequence[str]) -> list[str]:
    """The FAILED/ERROR lines of a pytest part's short test summary."""
    return [line for line in output if line.startswith(("FAILED ", "ERROR "))]


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
    """Run the parts one after the other; pass interrupts on; the combined exit status."""
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
        if interrupted:
            break
        part.start()
        try:
            _stream([part], sys.stdout)
        finally:
            assert part.process is not None
            try:
                part.process.wait(timeout=GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                part.signal(signal.SIGKILL)
                part.process.wait()
    ran = [part for part in parts if part.process is not None]
    for part in ran:
        # Repeated last: a CI log shows its tail, and the e2e part's summary is long scrolled by.
        for line in failure_lines(part.output):
            print(f"[{part.name}] {line}", flush=True)
    for part in ran:
        assert part.process is not None
        took = (part.ended or time.monotonic()) - part.started
        print(f"[{part.name}] exit {part.process.returncode} after {took / 60:.1f} min", flush=True)
    print(f"pytest parts done in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    if interrupted:
        return 128 + interrupted[0]
    codes = [part.process.returncode for part in ran if part.process is not None]
    return combined_status([code if code >= 0 else 128 - code for code in codes])


if __name__ == "__main__":
    raise SystemExit(main())
