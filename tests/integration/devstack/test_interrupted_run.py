"""A real e2e run (`python -m tests.run`, as `make test` runs it) interrupted while its stack is
up: SIGTERM to the runner (what make passes on) and SIGKILL of the whole run (a crash, an
out-of-memory kill, a CI job cancelled) both leave no process of its stack behind; a run killed
with its tethers is reaped by the next run's start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from redline.devstack.layout import StackLayout
from redline.devstack.state import read_state
from redline.devstack.tether import parse_chain, reap_orphans, tethered

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
E2E_TEST = "tests/e2e/test_stack.py::test_status_shows_every_part_healthy"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _under(pids: set[int]) -> list[int]:
    """Live processes whose owner chain names one of `pids` (what those processes started)."""
    return [pid for pid, chain in tethered() if {o.pid for o in parse_chain(chain)} & pids]


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


@dataclass(frozen=True)
class Run:
    """The interrupted run: its runner process and the file its output goes to."""

    process: subprocess.Popen[bytes]
    log: Path

    def ended(self) -> str:
        """Why the run ended early: its exit code and the last lines it printed."""
        tail = self.log.read_text(errors="replace").splitlines()[-40:]
        code = self.process.returncode
        return f"the run ended before its stack came up: {code}\n" + "\n".join(tail)


@pytest.fixture()
def run(tmp_path: Path) -> Iterator[Run]:
    """`python -m tests.run` on one test of the shared e2e stack, until that stack is up."""
    env = {**os.environ, "PYTEST_WORKERS": "1"}
    env.pop("REDLINE_OWNER", None)  # the run is a suite of its own, as `make test` starts it
    with (tmp_path / "run.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.run", E2E_TEST, "-p", "no:cacheprovider"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield Run(process, tmp_path / "run.log")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _run_dir(pids: list[int]) -> Path | None:
    """The run directory of the `redline up` among `pids` (its `--run-dir` argument)."""
    for pid in pids:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "up" in args and "--run-dir" in args:
            return Path(args[args.index("--run-dir") + 1])
    return None


def _stack_up(run: Run) -> tuple[set[int], list[int]]:
    """Wait until the run's stack is up and recorded as running; the run's pytest pids and
    every process they started."""
    deadline = time.monotonic() + 300
    run_dir = None
    while time.monotonic() < deadline:
        assert run.process.poll() is None, run.ended()
        pytests = set(_children(run.process.pid))
        parts = _under(pytests)
        run_dir = _run_dir(parts) or run_dir
        state = read_state(StackLayout(run_dir)) if run_dir is not None else None
        if state is not None and state.status == "running" and len(parts) >= len(state.parts):
            return pytests, parts
        time.sleep(1)
    raise AssertionError(f"the run's stack ({run_dir}) did not come up within 300 s")


def _gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _alive(pids)


def test_sigterm_to_the_runner_stops_the_stack(run: Run) -> None:
    pytests, parts = _stack_up(run)
    os.kill(run.process.pid, signal.SIGTERM)
    run.process.wait(timeout=240)
    # The stack's own parts (and anything started since) are gone, not only the ones seen.
    assert not _gone(parts, 30), f"survived the interrupted run: {_alive(parts)}"
    assert not _alive(_under(pytests))


def test_a_run_killed_outright_leaves_nothing_once_its_tethers_act(run: Run) -> None:
    pytests, parts = _stack_up(run)
    # The runner, then each pytest part with its workers (each part leads a group of its own).
    os.killpg(run.process.pid, signal.SIGKILL)
    for pid in _alive(sorted(pytests)):
        os.killpg(pid, signal.SIGKILL)
    run.process.wait()
    assert not _gone(parts, 30), f"survived the killed run: {_alive(parts)}"


def test_the_next_start_reaps_a_run_killed_with_its_tethers() -> None:
    """A tethered process whose owner and reaper are both gone is stopped by `reap_orphans`,
    which every run's start calls (the suite's conftest, `redline up`)."""
    owner = subprocess.Popen(["sleep", "60"])
    stat = Path(f"/proc/{owner.pid}/stat").read_text()
    ticks = stat[stat.rfind(")") + 2 :].split()[19]
    env = {**os.environ, "REDLINE_OWNER": f"{owner.pid}:{ticks}"}
    orphan = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        assert orphan.pid not in reap_orphans()  # its owner lives: left alone
        owner.kill()
        owner.wait()
        assert orphan.pid in reap_orphans()
        orphan.wait(timeout=10)
    finally:
        for process in (owner, orphan):
            if process.poll() is None:
                process.kill()
                process.wait()
