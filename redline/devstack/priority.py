"""CPU priority that survives a new session: the autogroup nice value.

With Linux's `sched_autogroup` (on by default on desktop and many cloud kernels, and on the
machines this project is tested on), every session is an autogroup and the scheduler first
shares the CPU between autogroups, then between the threads of each one. A process's own `nice`
only weighs it against the threads of its autogroup: `nice -n 10 cmd` in a session of its own
still gets an equal share against every other session. What weighs a session against the others
is its autogroup's nice value (`/proc/PID/autogroup`, `man 7 sched`).

Measured on the 2-core test machine: two CPU burners in one session beside four in another,
started with `nice -n 10`, split the CPU 50/50; with the second session's autogroup at nice 19
the first got both cores until it ended.

The devstack starts every process in a session of its own (`processes.spawn`), so a niced run
(the rest of the suite beside the e2e drills) would lose its nice in every service it starts:
each spawned session gets the autogroup nice of its spawner.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def parse_autogroup(text: str) -> int | None:
    """The nice value of a `/proc/PID/autogroup` line (`/autogroup-12 nice 10`); None if none."""
    parts = text.split()
    if len(parts) == 3 and parts[1] == "nice":
        try:
            return int(parts[2])
        except ValueError:
            return None
    return None


def read_autogroup_nice(pid: int | None = None, proc: Path = PROC) -> int | None:
    """The autogroup nice of `pid` (None: this process); None without autogroups."""
    path = proc / ("self" if pid is None else str(pid)) / "autogroup"
    try:
        return parse_autogroup(path.read_text())
    except OSError:
        return None


def set_autogroup_nice(pid: int, nice: int, proc: Path = PROC) -> bool:
    """Set the autogroup nice of `pid`'s session; False where the kernel has no autogroups, the
    process is gone, or lowering it is not permitted (raising it always is)."""
    try:
        (proc / str(pid) / "autogroup").write_text(f"{nice}\n")
    except OSError:
        return False
    return True


def inherit_autogroup_nice(pid: int, proc: Path = PROC) -> None:
    """Give `pid`'s autogroup this process's autogroup nice when ours is raised."""
    ours = read_autogroup_nice(proc=proc)
    if ours is not None and ours > 0:
        set_autogroup_nice(pid, ours, proc)


__all__ = [
    "inherit_autogroup_nice",
    "parse_autogroup",
    "read_autogroup_nice",
    "set_autogroup_nice",
]
