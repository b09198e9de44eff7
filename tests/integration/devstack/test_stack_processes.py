"""The local stack's processes: spawned detached, stopped by pid (never a reused one), strays
found, a live run directory refused; and a service that dies or never answers is reported."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from redline.devstack.errors import StackError, StackRunningError
from redline.devstack.layout import StackLayout
from redline.devstack.parts import find_strays, part_alive, spawn_part, stop_part, wait_ready
from redline.devstack.processes import (
    ServiceError,
    free_port,
    http_ok,
    spawn,
    start_service,
    start_ticks,
)
from redline.devstack.runtime import prepare_run_dir
from redline.devstack.state import PartState, StackState, write_state

pytestmark = [pytest.mark.integration]


def _state(layout: StackLayout, parts: list[PartState]) -> StackState:
    return StackState(run_dir=str(layout.root), spec=None, spec_source="<embedded>",
                      host="127.0.0.1", regions=["primary", "secondary"], ports={}, rate=10.0,
                      seed=1, started_at=time.time(), parts=parts)  # fmt: skip


def _sleeper(tmp_path: Path, name: str = "sleeper") -> PartState:
    sleep = shutil.which("sleep")
    assert sleep is not None
    log = tmp_path / f"{name}.log"
    return spawn_part(name, [sleep, "60"], log, None, "127.0.0.1")


def test_spawned_part_runs_detached_and_stops_by_pid(tmp_path: Path) -> None:
    part = _sleeper(tmp_path)
    assert part_alive(part)
    assert os.getpgid(part.pid) == part.pid  # its own session and process group
    assert stop_part(part, timeout=5) == "stopped"
    assert not part_alive(part)
    assert stop_part(part) == "not running"


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    bystander = _sleeper(tmp_path, "bystander")
    try:
        impostor = bystander.model_copy(update={"start_ticks": (bystander.start_ticks or 0) + 1})
        assert not part_alive(impostor)
        assert stop_part(impostor) == "not running"
        assert part_alive(bystander)
    finally:
        stop_part(bystander)


def test_a_part_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    shell = shutil.which("sh")
    assert shell is not None
    argv = [shell, "-c", "trap '' TERM; while :; do sleep 0.1; done"]
    part = spawn_part("stubborn", argv, tmp_path / "stubborn.log", None, "127.0.0.1")
    time.sleep(0.3)
    assert stop_part(part, timeout=0.5) == "killed"
    assert not part_alive(part)


def test_a_live_run_dir_is_refused_and_a_stale_one_cleaned(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path / "run")
    live = _sleeper(tmp_path)
    try:
        write_state(layout, _state(layout, [live]))
        (layout.root / "leftover.txt").write_text("x")
        with pytest.raises(StackRunningError, match=r"already running .* 1 of 1 parts alive"):
            prepare_run_dir(layout, lambda _: None)
        assert (layout.root / "leftover.txt").exists()
    finally:
        stop_part(live)
    said: list[str] = []
    prepare_run_dir(layout, said.append)
    assert "stale run directory" in said[0]
    assert not (layout.root / "leftover.txt").exists()
    assert layout.marker.exists() and layout.logs_dir.is_dir()


def test_signals_reach_a_whole_process_group(tmp_path: Path) -> None:
    shell = shutil.which("sh")
    assert shell is not None
    part = spawn_part("group", [shell, "-c", "sleep 60 & wait"], tmp_path / "group.log", None,
                      "127.0.0.1")  # fmt: skip
    pid = part.pid
    time.sleep(0.3)
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pid]
    assert len(children) >= 2
    assert stop_part(part, timeout=5) == "stopped"
    time.sleep(0.2)
    assert all(start_ticks(child) is None for child in children)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_strays_are_session_leaders_naming_the_run_dir(tmp_path: Path) -> None:
    shell = shutil.which("sh")
    assert shell is not None
    marker = tmp_path / "run" / "config" / "part.yaml"
    marker.parent.mkdir(parents=True)
    marker.write_text("x")
    leader = spawn([shell, "-c", "sleep 60", str(marker)], tmp_path / "a.log").pid
    reader = subprocess.Popen([shell, "-c", "sleep 60", str(marker)])  # same session as us
    try:
        found = {stray.pid for stray in find_strays(tmp_path / "run")}
        assert leader in found
        assert reader.pid not in found
    finally:
        reader.kill()
        reader.wait()
        part = PartState(name="x", kind="redline", pid=leader, start_ticks=start_ticks(leader),
                         log="x", started_at=time.time())  # fmt: skip
        stop_part(part)


def test_output_goes_to_the_log_and_default_signals_are_restored(tmp_path: Path) -> None:
    """Nothing a process prints reaches our terminal, and it can be interrupted even when we
    ignore SIGINT (a shell's background job does)."""
    script = (
        "import signal, sys; print('to stdout'); print('to stderr', file=sys.stderr); "
        "print(signal.getsignal(signal.SIGINT) is not signal.SIG_IGN, flush=True)"
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = spawn([sys.executable, "-c", script], tmp_path / "out.log")
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 10
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() == 0
    assert (tmp_path / "out.log").read_text().split() == ["to", "stdout", "to", "stderr", "True"]


def test_a_service_that_exits_or_never_answers_is_reported_and_stopped(tmp_path: Path) -> None:
    sh = shutil.which("sh")
    assert sh is not None
    port = free_port()
    ready = http_ok(f"http://127.0.0.1:{port}/")
    with pytest.raises(ServiceError, match=r"dies exited with code 3 during start-up(.|\n)*bye"):
        start_service("dies", [sh, "-c", "echo bye; exit 3"], tmp_path / "dies.log", port, ready)
    marker = f"mute-{uuid.uuid4().hex}"
    with pytest.raises(ServiceError, match=r"mute not ready on 127.0.0.1:\d+ after 0.5 s"):
        start_service("mute", [sh, "-c", "sleep 60", marker], tmp_path / "mute.log", port, ready,
                      timeout=0.5)  # fmt: skip
    assert not _running(marker)  # stopped, not left behind


def _running(text: str) -> list[int]:
    """Live (not zombie) processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and start_ticks(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


def test_a_part_that_exits_during_start_up_is_a_stack_error(tmp_path: Path) -> None:
    sh = shutil.which("sh")
    assert sh is not None
    part = spawn_part("replicator", [sh, "-c", "echo broken config; exit 2"],
                      tmp_path / "replicator.log", None, "127.0.0.1")  # fmt: skip
    with pytest.raises(StackError, match=r"replicator exited with code 2(.|\n)*broken config"):
        wait_ready(part, 10.0)
