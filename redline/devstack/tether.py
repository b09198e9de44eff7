"""Tether processes to an owner: when the owner dies, however it dies, they are stopped.

The devstack starts its processes detached (each in a session of its own, `processes.spawn`), so
a terminal's Ctrl-C or a signal to a parent never reaches them, and a killed test run, a crashed
pytest worker or an interrupted `redline demo` would leave its stack running. An *owner* is a
process that claims the lifetime of everything started below it: `claim_ownership()` adds it to
`REDLINE_OWNER` (a chain `pid:start_ticks,...`; every process started after that inherits it,
detached or not) and starts a *reaper*, a small detached process that watches the chain. When
any owner in it is gone, the reaper stops every process whose environment carries that chain
(SIGTERM to its group, SIGKILL after a grace period) and exits.

Some programs overwrite their environment in memory to set their process title (redis-server
does), so the environment cannot be the only mark: `processes.spawn`, the devstack's one spawner,
also records each process it starts under its chain in a small registry file
(`record_spawned`), and the reaper stops the recorded processes too (by pid and start time, so a
reused pid is never signalled).

`reap_orphans()` does the same sweep at start-up for chains whose reaper itself was killed (a
`kill -9` of a whole tree): stale runs are cleaned up by the next run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

OWNER_ENV = "REDLINE_OWNER"
"""The environment variable holding the owner chain of a process."""
POLL_SECONDS = 0.5
GRACE_SECONDS = 5.0
"""How long tethered processes get between SIGTERM and SIGKILL."""


@dataclass(frozen=True)
class Owner:
    """One owning process: its pid and the kernel's start time of that pid (a reused pid is not
    the owner)."""

    pid: int
    start_ticks: int

    def alive(self) -> bool:
        """True while the pid still runs the owning process."""
        return _start_ticks(self.pid) == self.start_ticks

    def __str__(self) -> str:
        return f"{self.pid}:{self.start_ticks}"


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def parse_chain(text: str) -> tuple[Owner, ...]:
    """The owners of a `REDLINE_OWNER` value (malformed entries are ignored)."""
    owners = []
    for item in text.split(","):
        pid, _, ticks = item.strip().partition(":")
        if pid.isdigit() and ticks.isdigit():
            owners.append(Owner(int(pid), int(ticks)))
    return tuple(owners)


def render_chain(owners: Sequence[Owner]) -> str:
    """The `REDLINE_OWNER` value of a chain."""
    return ",".join(str(owner) for owner in owners)


def _environ_value(pid: int) -> str | None:
    """The REDLINE_OWNER a process started with, or None."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{OWNER_ENV}=".encode()
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def registry_dir() -> Path:
    """Where the spawned processes of every chain are recorded (one file per chain)."""
    return Path(tempfile.gettempdir()) / f"redline-tether-{os.getuid()}"


def _registry_file(chain: str) -> Path:
    return registry_dir() / f"{hashlib.sha256(chain.encode()).hexdigest()[:24]}.pids"


def record_spawned(pid: int, start_ticks: int | None, chain: str | None) -> None:
    """Record a process `spawn` started under `chain` (nothing when there is no owner)."""
    if not chain or start_ticks is None:
        return
    path = _registry_file(chain)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        if handle.tell() == 0:
            handle.write(f"# {chain}\n")
        handle.write(f"{pid} {start_ticks}\n")


def _recorded() -> Iterator[tuple[Path, str, list[tuple[int, int]]]]:
    """Every registry file: its path, its chain and the (pid, start ticks) it lists."""
    directory = registry_dir()
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.pids")):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        if not lines or not lines[0].startswith("# "):
            continue
        entries = []
        for line in lines[1:]:
            pid, _, ticks = line.partition(" ")
            if pid.isdigit() and ticks.isdigit():
                entries.append((int(pid), int(ticks)))
        yield path, lines[0][2:], entries


def tethered() -> Iterator[tuple[int, str]]:
    """Every live process that carries an owner chain, by its environment or the registry."""
    me = os.getpid()
    seen: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        value = _environ_value(pid)
        if value and _start_ticks(pid) is not None:
            seen.add(pid)
            yield pid, value
    for _, chain, entries in _recorded():
        for pid, ticks in entries:
            if pid not in seen and pid != me and _start_ticks(pid) == ticks:
                seen.add(pid)
                yield pid, chain


def _signal(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tethered(chain: str, grace: float = GRACE_SECONDS) -> list[int]:
    """Stop every process whose chain is `chain` or extends it; the pids that were signalled."""

    def members() -> list[int]:
        return [pid for pid, value in tethered() if value == chain or value.startswith(chain + ",")]

    pids = members()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and members():
        time.sleep(0.1)
    for pid in members():
        _signal(pid, signal.SIGKILL)
    for path, recorded, _ in list(_recorded()):
        if recorded == chain or recorded.startswith(chain + ","):
            with contextlib.suppress(OSError):
                path.unlink()
    return pids


def reap_orphans() -> list[int]:
    """Stop the processes of every chain with a dead owner (their reaper was killed too)."""
    stopped: list[int] = []
    chains = {value for _, value in tethered()} | {chain for _, chain, _ in _recorded()}
    dead = {chain for chain in chains if not all(o.alive() for o in parse_chain(chain))}
    for chain in sorted(dead, key=len):
        stopped += stop_tethered(chain)
    return stopped


def claim_ownership(reaper_log: Path | None = None) -> str:
    """Make this process an owner: extend `REDLINE_OWNER` with it, start its reaper; the chain.

    Idempotent: a process that already heads the chain keeps it.
    """
    ticks = _start_ticks(os.getpid())
    if ticks is None:  # pragma: no cover - our own /proc entry is always readable
        raise RuntimeError("cannot read this process's start time from /proc")
    me = Owner(os.getpid(), ticks)
    owners = parse_chain(os.environ.get(OWNER_ENV, ""))
    if owners and owners[-1] == me:
        return os.environ[OWNER_ENV]
    chain = render_chain((*owners, me))
    os.environ[OWNER_ENV] = chain
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    log = os.devnull if reaper_log is None else str(reaper_log)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.posix_spawn(
            sys.executable,
            [sys.executable, "-m", "redline.devstack.tether", "--watch", chain],
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            setsigmask=(),
            # the reaper outlives the signals that end its owner's tree
            setsigdef=(),
        )
    finally:
        os.close(fd)
    return chain


def watch(chain: str, poll: float = POLL_SECONDS) -> list[int]:
    """Wait until an owner of `chain` is gone, then stop its tethered processes."""
    owners = parse_chain(chain)
    if not owners:
        raise ValueError(f"{OWNER_ENV}: no owner in {chain!r}")
    while all(owner.alive() for owner in owners):
        time.sleep(poll)
    return stop_tethered(chain)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m redline.devstack.tether --watch CHAIN`: the reaper process."""
    parser = argparse.ArgumentParser(prog="redline.devstack.tether", description=__doc__)
    parser.add_argument("--watch", required=True, help="the owner chain to watch")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    stopped = watch(args.watch)
    if stopped:
        print(f"owner of {args.watch} gone: stopped {len(stopped)} process(es): {stopped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "OWNER_ENV",
    "Owner",
    "claim_ownership",
    "parse_chain",
    "reap_orphans",
    "record_spawned",
    "registry_dir",
    "render_chain",
    "stop_tethered",
    "tethered",
    "watch",
]
