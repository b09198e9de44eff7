"""The recorded parts of a run: is each still running, signal it, stop it, restart it, wait for it.

A part is acted on through its state-file record (pid and kernel start time), never by name, so
`redline down` from another shell stops exactly what `redline up` started. Processes are started
by `redline.devstack.processes.spawn`: detached, their output in their log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from redline.devstack.errors import StackError
from redline.devstack.fakes.service import HEALTH_PATH as SERVICE_HEALTH_PATH
from redline.devstack.interrupts import InterruptGuard
from redline.devstack.layout import SESSION_SYNC_PREFIX, replica_base
from redline.devstack.processes import (
    Process,
    ServiceError,
    StopOutcome,
    http_ok,
    log_tail,
    session_leader,
    spawn,
    start_ticks,
    wait_until,
)
from redline.devstack.state import PartState, StackState, write_state
from redline.devstack.tether import OWNER_ENV

Say = Callable[[str], None]
READY_PATHS = {
    "gateway": "/healthz",
    "exporters": "/healthz",
    "remediation": "/readyz",
    "trace-store": "/healthz",
}
SESSION_SYNC_MARKER = "session sync:"
"""What a CRDT session sync part logs once it runs."""
LOG_MARKERS = {
    "replicator": "replicating",
    "session-replica": "session replica:",
}


def part_process(part: PartState) -> Process:
    """The process a part record names."""
    return Process(part.pid, part.start_ticks, tuple(part.argv), Path(part.log))


def part_alive(part: PartState) -> bool:
    """True when the part's pid still runs the process this stack started."""
    return part_process(part).alive()


def signal_part(part: PartState, sig: int) -> None:
    """Send `sig` to a running part (drills: SIGKILL, SIGSTOP, SIGCONT)."""
    process = part_process(part)
    if not process.alive():
        raise StackError(f"{part.name} (pid {part.pid}) is not running")
    process.signal(sig)


def stop_part(part: PartState, timeout: float = 10.0) -> StopOutcome:
    """SIGTERM the part, SIGKILL it after `timeout`; returns stopped, killed or not running."""
    return part_process(part).stop(timeout)


def stop_parts(parts: Sequence[PartState], say: Say, timeout: float = 10.0) -> dict[str, str]:
    """Stop parts in reverse start order; returns each part's outcome."""
    outcomes: dict[str, str] = {}
    for part in reversed(parts):
        outcome = stop_part(part, timeout)
        outcomes[part.name] = outcome
        say(f"{part.name} (pid {part.pid}): {outcome}")
    return outcomes


def find_strays(root: Path, known: Sequence[int] = ()) -> list[PartState]:
    """Session leaders whose arguments name a file inside `root` that the state file does not
    list: parts a `redline up` killed between spawning and recording them had started. (A
    `tail -f` of a log runs in its shell's session and is never taken for one.)"""
    prefix = str(root.resolve()) + "/"
    strays = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), *known):
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        texts = [arg.decode(errors="replace") for arg in args if arg]
        if not any(prefix in arg for arg in texts):
            continue
        pid = int(entry.name)
        ticks = start_ticks(pid)
        if ticks is None or not session_leader(pid):
            continue
        strays.append(PartState(name="stray", kind="redline", pid=pid, start_ticks=ticks,
                                log="", argv=texts, started_at=time.time()))  # fmt: skip
    return strays


def child_env() -> dict[str, str]:
    """The environment of a part: ours without REDLINE_* (the settings file is the truth) but
    the owner chain, which tethers the part to whoever owns this run (`devstack.tether`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_") or k == OWNER_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn_part(
    name: str,
    argv: Sequence[str],
    log: Path,
    port: int | None,
    host: str,
    env: Mapping[str, str] | None = None,
) -> PartState:
    """Start a redline part detached (not waiting for it), with `env` over `child_env()`; its
    record for the state file (which keeps `env`, so a restart gets it again)."""
    extra = dict(env or {})
    process = spawn(argv, log, {**child_env(), **extra})
    return PartState(
        name=name,
        kind="redline",
        pid=process.pid,
        start_ticks=process.start_ticks,
        port=port,
        url=f"http://{host}:{port}" if port else None,
        log=str(log),
        argv=list(argv),
        env=extra,
        started_at=time.time(),
    )


def health_path(part: PartState) -> str | None:
    """The path a redline HTTP part answers its health on (None: not an HTTP part)."""
    if part.name.startswith("service-"):
        return SERVICE_HEALTH_PATH
    return READY_PATHS.get(
        replica_base(part.name), "/healthz" if part.name.startswith("simulator-") else None
    )


def _ready_check(part: PartState) -> Callable[[], bool]:
    """Ready: the HTTP parts answer their health path, the others logged their start line (or,
    without one, have stayed up for a second)."""
    path = health_path(part)
    marker = LOG_MARKERS.get(part.name)
    if part.name.startswith(SESSION_SYNC_PREFIX):
        marker = SESSION_SYNC_MARKER
    settle = time.monotonic() + 1.0
    if path is not None and part.url is not None:
        return http_ok(part.url + path)
    if marker is not None:
        return lambda: marker in log_tail(Path(part.log), 200)
    return lambda: time.monotonic() >= settle


def wait_ready(part: PartState, timeout: float) -> None:
    """Wait until a redline part answers (HTTP parts) or logged its start line; StackError."""
    process = part_process(part)
    try:
        wait_until(process, part.name, _ready_check(part), timeout, interval=0.1)
    except ServiceError as exc:
        raise StackError(str(exc)) from None


def restart_part(state: StackState, name: str, timeout: float = 60.0) -> PartState:
    """Start a redline part again with its recorded argv; the state file gets the new pid."""
    part = state.part(name)
    if part is None:
        raise StackError(f"no part {name!r} in this stack")
    if part.kind != "redline":
        raise StackError(f"{name} is a service binary; restart the stack instead")
    if part_alive(part):
        stop_part(part)
    with InterruptGuard().hold():
        process = spawn(part.argv, Path(part.log), {**child_env(), **part.env})
        update = {"pid": process.pid, "start_ticks": process.start_ticks}
        fresh = part.model_copy(update={**update, "started_at": time.time()})
        state.parts[state.parts.index(part)] = fresh
        write_state(state.layout(), state)
    wait_ready(fresh, timeout)
    return fresh


__all__ = [
    "child_env",
    "find_strays",
    "part_alive",
    "part_process",
    "restart_part",
    "signal_part",
    "spawn_part",
    "stop_part",
    "stop_parts",
    "wait_ready",
]
