"""One local stack for the whole e2e session, started and stopped through the real CLI, with a
Prometheus per region federated by a global one (`redline up --regions 2`).

The modules that start a stack of their own (`--source vllm`, `--redis sentinel`) run first:
the shared stack starts only after them, so no two stacks share the machine's cores (on two
cores, a second stack's load starved the first one's service fronts into timeouts).

The run directory is seeded with the state file of a "crashed" earlier run (its pids exited long
ago), so every session also proves that `redline up` cleans up a stale run directory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from redline.devstack.layout import StackLayout
from redline.devstack.parts import part_alive
from redline.devstack.state import load_running
from tests.support.stack import (
    UP_TIMEOUT,
    RunningStack,
    processes_mentioning,
    redline,
    seed_crashed_run,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on a stack of their own first, those on the shared stack last (a stable sort)."""
    items.sort(key=lambda item: "stack" in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """`redline up` on a stale run directory; `redline down` at the end, nothing left behind."""
    run_dir = tmp_path_factory.mktemp("stack") / "run"
    run_dir.mkdir()
    seed_crashed_run(StackLayout(run_dir))
    started = time.monotonic()
    # One Prometheus per region and a global one federating them: the drills close their loops
    # through federation (the single-Prometheus stack is the `redline demo` default).
    up = redline("up", "--run-dir", str(run_dir), "--regions", "2", timeout=UP_TIMEOUT)
    seconds = time.monotonic() - started
    assert up.returncode == 0, f"redline up failed:\n{up.stdout}\n{up.stderr}"
    state = load_running(run_dir)
    try:
        yield RunningStack(run_dir, state, up, seconds)
    finally:
        state = load_running(run_dir)  # drills may have restarted parts (new pids)
        down = redline("down", "--run-dir", str(run_dir), timeout=180.0)
        assert down.returncode == 0, down.stderr
        alive = [p.name for p in state.parts if part_alive(p)]
        assert not alive, f"still running after down: {alive}"
        assert not processes_mentioning(str(run_dir)), "processes of the run dir survived"
