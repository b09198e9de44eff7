"""A part started with its own environment (the gateway's OTEL_* variables pointing at the trace
store) gets it on its first start and again when a drill restarts it from the state file."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from redline.devstack.layout import StackLayout
from redline.devstack.parts import restart_part, spawn_part, stop_part
from redline.devstack.processes import log_tail
from redline.devstack.state import StackState, read_state, write_state

pytestmark = pytest.mark.integration


def _wait_for(path: Path, text: str, count: int, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tail = log_tail(path, 50)
        if tail.count(text) >= count:
            return tail
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not seen {count} time(s) in {path}:\n{log_tail(path, 50)}")


def test_the_environment_survives_a_restart(tmp_path: Path) -> None:
    shell = shutil.which("sh")
    assert shell is not None
    layout = StackLayout(tmp_path / "run")
    log = tmp_path / "gateway.log"
    env = {"OTEL_SERVICE_NAME": "redline-gateway", "OTEL_TRACES_SAMPLER": "parentbased_always_on"}
    argv = [shell, "-c", 'echo "service=$OTEL_SERVICE_NAME sampler=$OTEL_TRACES_SAMPLER"; sleep 60']
    part = spawn_part("gateway", argv, log, None, "127.0.0.1", env)
    state = StackState(run_dir=str(layout.root), spec=None, spec_source="<embedded>",
                       host="127.0.0.1", regions=["primary", "secondary"], ports={}, rate=1.0,
                       seed=1, started_at=time.time(), parts=[part])  # fmt: skip
    write_state(layout, state)
    line = "service=redline-gateway sampler=parentbased_always_on"
    fresh = part
    try:
        _wait_for(log, line, 1)
        recorded = read_state(layout)
        assert recorded is not None and recorded.parts[0].env == env
        fresh = restart_part(recorded, "gateway", timeout=10.0)
        assert fresh.pid != part.pid and fresh.env == env
        _wait_for(log, line, 2)
    finally:
        stop_part(part, 5.0)
        stop_part(fresh, 5.0)
