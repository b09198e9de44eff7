"""The local stack's processes: start every part detached, record them, stop exactly those.

Each part is a separate process in its own session (process group), with its log in the run
directory. The state file lists every part with its pid and the kernel's start time of that pid,
so `redline down` and `redline status` act on exactly the processes this run started: a pid that
was reused by another program has another start time and is left alone. The state file is
rewritten after each part starts, so even a `redline up` killed half-way can be cleaned up.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.dashboards.render import DASHBOARDS_DIR
from redline.devstack.config import (
    HOST,
    Endpoints,
    PartCommand,
    StackConfigError,
    StackLayout,
    build_endpoints,
    build_part_commands,
    build_ported_parts,
    build_prometheus_configs,
    build_service_parts,
    build_stack_spec,
    check_regions,
    render_settings,
)
from redline.devstack.multiregion import (
    MultiRegionError,
    render_prometheus_config,
    select_regions,
)
from redline.devstack.processes import (
    Service,
    ServiceError,
    find_binary,
    free_port,
    start_alertmanager,
    start_milvus_lite,
    start_prometheus,
    start_redis,
)
from redline.generate.outputs import ALERTMANAGER_FILE, RULE_FILE, RULES_DIR, build_outputs
from redline.slo.load import LoadedSpec, SpecError, apply_profile, load_spec
from redline.slo.spec import Spec

STATE_FORMAT = 1
PartKind = Literal["service", "redline"]
Say = Callable[[str], None]


class StackError(Exception):
    """The stack cannot be started, stopped or read; the message says why and what to do."""


class StackRunningError(StackError):
    """The run directory already holds a running stack."""


class PortInUseError(StackError):
    """A port asked for on the command line is taken."""


class BinaryMissingError(StackError):
    """A service binary (Prometheus, Alertmanager, redis-server, milvus-lite) is not installed."""


class PartState(BaseModel):
    """One started process."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: PartKind
    pid: int
    start_ticks: int | None = Field(None, description="Kernel start time of the pid (/proc).")
    port: int | None = None
    url: str | None = None
    log: str
    argv: list[str] = Field(default_factory=list)
    started_at: float


class StackState(BaseModel):
    """What `redline up` started, where, and how to reach it."""

    model_config = ConfigDict(extra="forbid")

    format: int = STATE_FORMAT
    status: Literal["starting", "running"] = "starting"
    run_dir: str
    spec: str | None
    spec_source: str
    host: str
    regions: list[str]
    prometheus_regions: list[str] = Field(
        default_factory=list,
        description="Regions with their own Prometheus, federated by the global one.",
    )
    ports: dict[str, int]
    rate: float
    seed: int
    started_at: float
    parts: list[PartState] = Field(default_factory=list)

    def part(self, name: str) -> PartState | None:
        """The part called `name`, if started."""
        return next((p for p in self.parts if p.name == name), None)

    def endpoints(self) -> Endpoints:
        """The URLs of this run."""
        return build_endpoints(self.ports, self.regions, self.host, self.prometheus_regions)

    def layout(self) -> StackLayout:
        """The run directory's layout."""
        return StackLayout(Path(self.run_dir))

    def load_spec(self) -> Spec:
        """The spec this run was started with, local profile applied."""
        return apply_profile(load_spec(self.spec).spec, "local")


# ---- processes ---------------------------------------------------------------------------------


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot); None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def part_alive(part: PartState) -> bool:
    """True when the part's pid still runs the process this stack started."""
    ticks = start_ticks(part.pid)
    return ticks is not None and (part.start_ticks is None or ticks == part.start_ticks)


def _reap(pid: int) -> None:
    """Collect the exit status of our own child so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def child_env() -> dict[str, str]:
    """The environment of a part: ours without REDLINE_* (the settings file is the truth)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> int:
    """Start `argv` detached (new session), output appended to `log_path`; returns the pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return os.posix_spawn(
            argv[0],
            list(argv),
            dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            # The child starts with no blocked signals and default handlers, whatever the
            # parent is masking or ignoring right now (see `recording`).
            setsigmask=(),
            setsigdef=INTERRUPTS,
        )
    finally:
        os.close(fd)


INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


class InterruptGuard:
    """Turns SIGINT/SIGTERM/SIGHUP into StartInterruptedError, but never inside `hold()`.

    A signal may reach any thread (numpy's BLAS threads, say), so masking it in the main thread
    is not enough; instead the handler notes a signal that arrives while a part is being
    spawned and recorded, and the interruption is raised once the part is in the state file.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None

    def handler(self, signum: int, frame: object) -> None:
        """The signal handler installed by `interrupt_on_signals`."""
        if self.depth:
            self.pending = signum
            return
        raise StartInterruptedError(f"interrupted by {signal.Signals(signum).name}")

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Defer interruptions until the block (spawn + record) is done."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise StartInterruptedError(f"interrupted by {signal.Signals(signum).name}")


def _signal(part: PartState, sig: int) -> None:
    # Each part leads its own session; signalling the group reaches any helper it forked.
    try:
        if os.getpgid(part.pid) == part.pid:
            os.killpg(part.pid, sig)
        else:
            os.kill(part.pid, sig)
    except ProcessLookupError:
        pass


def stop_part(part: PartState, timeout: float = 10.0) -> str:
    """SIGTERM the part, SIGKILL it after `timeout`; returns stopped, killed or not running."""
    if not part_alive(part):
        _reap(part.pid)
        return "not running"
    _signal(part, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(part.pid)
        if not part_alive(part):
            return "stopped"
        time.sleep(0.05)
    _signal(part, signal.SIGKILL)
    for _ in range(100):
        _reap(part.pid)
        if not part_alive(part):
            break
        time.sleep(0.05)
    return "killed"


def session_leader(pid: int) -> bool:
    """True when `pid` leads its own session, as every part the stack starts does."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = raw[raw.rfind(")") + 2 :].split()
    return len(fields) > 3 and fields[3] == str(pid)


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


def signal_part(part: PartState, sig: int) -> None:
    """Send `sig` to a running part (drills: SIGKILL, SIGSTOP, SIGCONT)."""
    if not part_alive(part):
        raise StackError(f"{part.name} (pid {part.pid}) is not running")
    _signal(part, sig)


# ---- state file --------------------------------------------------------------------------------


def read_state(layout: StackLayout) -> StackState | None:
    """The run's state, or None when the directory holds none; StackError when unreadable."""
    try:
        text = layout.state_file.read_text("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StackError(f"{layout.state_file}: cannot read: {exc.strerror}") from None
    try:
        return StackState.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise StackError(
            f"{layout.state_file}: not a redline state file ({where}: {first['msg']}); "
            "remove it if no stack runs from this directory"
        ) from None


def write_state(layout: StackLayout, state: StackState) -> None:
    """Replace the state file atomically."""
    layout.root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=layout.root, prefix=".state.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(state.model_dump_json(indent=2))
    os.replace(tmp, layout.state_file)


def load_running(run_dir: Path) -> StackState:
    """The state of a running stack; StackError when the directory has none."""
    layout = StackLayout(run_dir.resolve())
    state = read_state(layout)
    if state is None:
        raise StackError(f"no stack in {layout.root} (no {layout.state_file.name}); "
                         f"start one with `redline up --run-dir {run_dir}`")  # fmt: skip
    return state


@contextlib.contextmanager
def run_dir_lock(layout: StackLayout) -> Iterator[None]:
    """Serialize `up` and `down` on one run directory."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.root / ".lock", "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StackRunningError(
                f"{layout.root}: another `redline up` or `down` is working on this directory"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---- up ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpOptions:
    """What `redline up` was asked for."""

    run_dir: Path
    spec_path: Path | None = None
    ports: Mapping[str, int] = field(default_factory=dict)
    rate: float = 50.0
    seed: int = 7
    baseline_requests: int = 200
    ready_timeout: float = 90.0
    prometheus_regions: int | None = None
    """`--regions N`: a Prometheus for each of the spec's first N regions and a global one."""


SERVICE_BINARIES = {
    "redis": ("redis-server",),
    "prometheus": ("prometheus",),
    "alertmanager": ("prometheus-alertmanager", "alertmanager"),
}


def check_binaries() -> None:
    """Every service binary is installed; BinaryMissingError with the install command if not."""
    problems = []
    for names in SERVICE_BINARIES.values():
        try:
            find_binary(*names)
        except ServiceError as exc:
            problems.append(str(exc))
    milvus = Path(sys.executable).with_name("milvus-lite")
    if not milvus.exists() and shutil.which("milvus-lite") is None:
        problems.append(
            "milvus-lite not found next to this Python or on PATH; install it with: "
            f"{sys.executable} -m pip install milvus-lite"
        )
    if problems:
        raise BinaryMissingError("\n".join(problems))


def port_free(port: int, host: str = HOST) -> bool:
    """True when `port` can be bound on `host` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def choose_ports(
    parts: Sequence[str], wanted: Mapping[str, int], host: str = HOST
) -> dict[str, int]:
    """A port per part: the ones asked for (PortInUseError when taken), free ones for the rest."""
    unknown = sorted(set(wanted) - set(parts))
    if unknown:
        raise StackError(
            f"--port names unknown part(s) {', '.join(unknown)}; parts with a port: "
            f"{', '.join(parts)}"
        )
    taken = [f"{part}={port}" for part, port in wanted.items() if not port_free(port, host)]
    if taken:
        raise PortInUseError(
            f"port(s) in use on {host}: {', '.join(taken)}; free them, pick others with "
            "--port PART=PORT, or leave --port out to use free ports"
        )
    ports = dict(wanted)
    while len(ports) < len(parts):
        port = free_port(host)
        if port not in ports.values():
            ports[next(p for p in parts if p not in ports)] = port
    return ports


def prepare_run_dir(layout: StackLayout, say: Say) -> None:
    """Refuse a live run directory; clean up a stale or previous one; create a fresh layout."""
    root = layout.root
    state = read_state(layout) if root.exists() else None
    if state is not None:
        alive = [p for p in state.parts if part_alive(p)]
        if alive:
            names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
            raise StackRunningError(
                f"a stack is already running from {root}: {len(alive)} of {len(state.parts)} "
                f"parts alive ({names}); see `redline status --run-dir {root}`, or stop it "
                f"with `redline down --run-dir {root}` first"
            )
        for part in state.parts:
            _reap(part.pid)
        say(
            f"{root}: stale run directory from a run that is no longer running "
            f"({len(state.parts)} recorded parts, none alive); cleaning up"
        )
    if root.exists():
        for stray in find_strays(root):
            say(f"stopping a stray process of an interrupted run (pid {stray.pid}): "
                f"{' '.join(stray.argv)[:120]}")  # fmt: skip
            stop_part(stray)
    if root.exists() and any(root.iterdir()):
        if not layout.marker.exists() and state is None:
            leftovers = sorted(entry.name for entry in root.iterdir())
            if leftovers != [".lock"]:
                raise StackError(
                    f"{root} is not empty and is not a redline run directory (no "
                    f"{layout.marker.name}); choose another --run-dir"
                )
        for entry in root.iterdir():
            if entry.name == ".lock":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    for directory in (layout.config_dir, layout.logs_dir, layout.data_dir, layout.rules_dir):
        directory.mkdir(parents=True, exist_ok=True)
    layout.marker.write_text("redline run directory: `redline down` stops it\n")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_configs(
    layout: StackLayout,
    spec: Spec,
    source: str,
    endpoints: Endpoints,
    commands: Sequence[PartCommand],
) -> None:
    """Write the token, the generated rules, Alertmanager config and dashboards, every
    Prometheus config and every settings file."""
    _write(layout.token_file, secrets.token_urlsafe(32) + "\n", 0o600)
    stack_spec = build_stack_spec(spec, endpoints, layout.token_file)
    outputs = build_outputs(stack_spec, source)
    _write(layout.rule_file, outputs[RULES_DIR / RULE_FILE])
    _write(layout.alertmanager_file, outputs[RULES_DIR / ALERTMANAGER_FILE])
    for path, text in outputs.items():
        if path.parent == DASHBOARDS_DIR:
            _write(layout.dashboards_dir / path.name, text)
    for part, config in build_prometheus_configs(stack_spec, endpoints, layout.rule_file).items():
        _write(layout.prometheus_config(part), render_prometheus_config(config))
    for command in commands:
        _write(layout.settings_file(command.part), render_settings(command.settings))


class _Starter:
    """Starts parts one by one, recording each in the state file as soon as it runs."""

    def __init__(
        self, layout: StackLayout, state: StackState, say: Say, guard: InterruptGuard
    ) -> None:
        self.layout = layout
        self.state = state
        self.say = say
        self.guard = guard

    def record(self, part: PartState) -> None:
        """Add a started part to the state file at once."""
        self.state.parts.append(part)
        write_state(self.layout, self.state)

    def service(self, name: str, endpoints: Endpoints) -> PartState:
        """Start one service binary and wait until it is ready."""
        workdir = self.layout.service_dir(name)
        port = endpoints.ports[name]
        service: Service
        if name == "redis":
            service = start_redis(workdir, port)
        elif name.startswith("prometheus"):
            service = start_prometheus(workdir, self.layout.prometheus_config(name), port)
        elif name == "alertmanager":
            service = start_alertmanager(workdir, self.layout.alertmanager_file, port)
        else:
            service = start_milvus_lite(workdir, port)
        url = service.extra.get("url") or service.extra.get("uri") or service.url
        return PartState(
            name=name,
            kind="service",
            pid=service.process.pid,
            start_ticks=start_ticks(service.process.pid),
            port=port,
            url=url,
            log=str(service.log_path),
            argv=[str(a) for a in service.process.args],  # type: ignore[union-attr]
            started_at=time.time(),
        )

    def redline(self, command: PartCommand, endpoints: Endpoints) -> PartState:
        """Spawn one redline part (not waiting for it)."""
        log = self.layout.log_file(command.part)
        port = endpoints.ports.get(command.part)
        with self.guard.hold():
            pid = spawn(command.argv, log, child_env())
            part = PartState(
                name=command.part,
                kind="redline",
                pid=pid,
                start_ticks=start_ticks(pid),
                port=port,
                url=f"http://{endpoints.host}:{port}" if port else None,
                log=str(log),
                argv=list(command.argv),
                started_at=time.time(),
            )
            self.record(part)
        return part


def _log_tail(path: str, lines: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


READY_PATHS = {"gateway": "/healthz", "exporters": "/healthz", "remediation": "/readyz"}
LOG_MARKERS = {
    "replicator": "replicating",
    "session-replica": "session replica:",
}


def wait_ready(part: PartState, timeout: float) -> None:
    """Wait until a redline part answers (HTTP parts) or logged its start line; StackError."""
    deadline = time.monotonic() + timeout
    path = READY_PATHS.get(part.name, "/healthz" if part.name.startswith("simulator-") else None)
    marker = LOG_MARKERS.get(part.name)
    settle = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        if not part_alive(part):
            _reap(part.pid)
            raise StackError(
                f"{part.name} exited during start-up; log {part.log}:\n{_log_tail(part.log)}"
            )
        if path is not None and part.url is not None:
            try:
                if httpx.get(part.url + path, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        elif marker is not None:
            if marker in _log_tail(part.log, 200):
                return
        elif time.monotonic() >= settle:
            return
        time.sleep(0.1)
    raise StackError(
        f"{part.name} not ready after {timeout:g} s; log {part.log}:\n{_log_tail(part.log)}"
    )


def _load(spec_path: Path | None) -> tuple[LoadedSpec, Spec]:
    try:
        loaded = load_spec(spec_path)
    except SpecError as exc:
        raise StackError("\n".join(exc.problems)) from None
    try:
        spec = apply_profile(loaded.spec, "local")
        check_regions(spec)
    except SpecError as exc:
        raise StackError(
            "\n".join(f"{loaded.source}: {problem}" for problem in exc.problems)
            + "\nthe local stack runs the spec's `local` profile (short scrape, evaluation and "
            "`for` intervals); add one under `profiles:`"
        ) from None
    except StackConfigError as exc:
        raise StackError(f"{loaded.source}: {exc}") from None
    return loaded, spec


def _prometheus_regions(spec: Spec, count: int | None) -> tuple[str, ...]:
    if count is None:
        return ()
    try:
        return select_regions(spec, count)
    except MultiRegionError as exc:
        raise StackError(str(exc)) from None


class StartInterruptedError(StackError):
    """`redline up` was interrupted (SIGINT, SIGTERM, SIGHUP) while starting."""


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[InterruptGuard]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise StartInterruptedError."""
    guard = InterruptGuard()
    previous = {sig: signal.signal(sig, guard.handler) for sig in INTERRUPTS}
    try:
        yield guard
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _shield_cleanup() -> None:
    """Ignore further interrupts while the parts already started are being stopped."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


def start_stack(
    options: UpOptions,
    say: Say,
    setup_models: Callable[[StackState, Say], None],
    after_start: Callable[[StackState, Say], None],
    guard: InterruptGuard | None = None,
) -> StackState:
    """Start every part; on any failure stop what was started and raise StackError.

    `setup_models` writes the adapter files and snapshots before the simulators start;
    `after_start` runs once every part is up but the load generator (baselines).
    """
    check_binaries()
    loaded, spec = _load(options.spec_path)
    prometheus_regions = _prometheus_regions(spec, options.prometheus_regions)
    layout = StackLayout(options.run_dir.resolve())
    with run_dir_lock(layout):
        prepare_run_dir(layout, say)
        parts = build_ported_parts(spec.regions, prometheus_regions)
        ports = choose_ports(parts, options.ports)
        endpoints = build_endpoints(ports, spec.regions, prometheus_regions=prometheus_regions)
        spec_path = options.spec_path.resolve() if options.spec_path else None
        commands = build_part_commands(
            spec, endpoints, layout, spec_path, options.rate, options.seed
        )
        source = (
            "slo/specs/default.yaml" if spec_path is None else spec_path.name
        )  # as `redline generate` names it
        write_configs(layout, spec, source, endpoints, commands)
        state = StackState(
            run_dir=str(layout.root),
            spec=str(spec_path) if spec_path else None,
            spec_source=loaded.source,
            host=endpoints.host,
            regions=list(spec.regions),
            prometheus_regions=list(prometheus_regions),
            ports=ports,
            rate=options.rate,
            seed=options.seed,
            started_at=time.time(),
        )
        write_state(layout, state)
        starter = _Starter(layout, state, say, guard or InterruptGuard())
        try:
            _start_all(starter, endpoints, commands, options, setup_models, after_start)
        except BaseException as exc:
            _shield_cleanup()
            say(f"start-up failed ({type(exc).__name__}); stopping the parts already started")
            stop_parts(state.parts, say)
            layout.state_file.unlink(missing_ok=True)
            raise
        state.status = "running"
        write_state(layout, state)
    return state


def _start_all(
    starter: _Starter,
    endpoints: Endpoints,
    commands: Sequence[PartCommand],
    options: UpOptions,
    setup_models: Callable[[StackState, Say], None],
    after_start: Callable[[StackState, Say], None],
) -> None:
    say = starter.say
    services = build_service_parts(endpoints.prometheus_regions)
    prometheus = (
        "Prometheus"
        if not endpoints.federated
        else (f"Prometheus ({', '.join(endpoints.prometheus_regions)} and global)")
    )
    say(f"starting redis-server, Milvus Lite (primary, replica), {prometheus}, Alertmanager")
    pool = ThreadPoolExecutor(max_workers=len(services))
    futures = {name: pool.submit(starter.service, name, endpoints) for name in services}
    errors: list[str] = []
    try:
        for name, future in futures.items():
            try:
                starter.record(future.result())
            except ServiceError as exc:
                errors.append(f"{name}: {exc}")
    finally:
        # Interrupted while a service was still starting: wait for it and record it too, so
        # the clean-up that follows stops it instead of leaving it running.
        pool.shutdown(wait=True)
        recorded = {part.name for part in starter.state.parts}
        for name, future in futures.items():
            if name not in recorded and future.done() and future.exception() is None:
                starter.record(future.result())
    if errors:
        raise StackError("\n".join(errors))
    setup_models(starter.state, say)
    by_name = {command.part: command for command in commands}
    order = [c.part for c in commands if c.part != "loadgen"]
    say(f"starting {', '.join(order)}")
    started = [starter.redline(by_name[name], endpoints) for name in order]
    for part in started:
        wait_ready(part, options.ready_timeout)
    after_start(starter.state, say)
    say("starting the load generator")
    wait_ready(starter.redline(by_name["loadgen"], endpoints), options.ready_timeout)


# ---- down, restart -----------------------------------------------------------------------------


def stop_parts(parts: Sequence[PartState], say: Say, timeout: float = 10.0) -> dict[str, str]:
    """Stop parts in reverse start order; returns each part's outcome."""
    outcomes: dict[str, str] = {}
    for part in reversed(parts):
        outcome = stop_part(part, timeout)
        outcomes[part.name] = outcome
        say(f"{part.name} (pid {part.pid}): {outcome}")
    return outcomes


def stop_stack(run_dir: Path, say: Say) -> dict[str, str]:
    """Stop every part the run directory's state file lists; remove the state file."""
    layout = StackLayout(run_dir.resolve())
    with run_dir_lock(layout):
        state = read_state(layout)
        if state is None:
            raise StackError(f"no stack in {layout.root} (no {layout.state_file.name})")
        outcomes = stop_parts(state.parts, say)
        # A `redline up` killed half-way may have spawned a part it had not recorded yet.
        for stray in find_strays(layout.root):
            outcome = stop_part(stray)
            outcomes[f"stray pid {stray.pid}"] = outcome
            say(f"stray process of this run (pid {stray.pid}, {stray.argv[0]}): {outcome}")
        layout.state_file.unlink(missing_ok=True)
    return outcomes


def restart_part(state: StackState, name: str, timeout: float = 60.0) -> PartState:
    """Start a redline part again with its recorded argv; the state file gets the new pid."""
    part = state.part(name)
    if part is None:
        raise StackError(f"no part {name!r} in this stack")
    if part.kind != "redline":
        raise StackError(f"{name} is a service binary; restart the stack instead")
    if part_alive(part):
        stop_part(part)
    layout = state.layout()
    with InterruptGuard().hold():
        pid = spawn(part.argv, Path(part.log), child_env())
        fresh = part.model_copy(
            update={"pid": pid, "start_ticks": start_ticks(pid), "started_at": time.time()}
        )
        state.parts[state.parts.index(part)] = fresh
        write_state(layout, state)
    wait_ready(fresh, timeout)
    return fresh


def describe_urls(state: StackState) -> list[tuple[str, str]]:
    """(what, where) lines `redline up` prints."""
    e = state.endpoints()
    layout = state.layout()
    regional = [(f"Prometheus {r}", e.regional_prometheus_url(r)) for r in e.prometheus_regions]
    rows = [
        ("Prometheus (global)" if e.federated else "Prometheus", e.prometheus_url),
        *regional,
        ("Alertmanager", e.alertmanager_url),
        ("Remediation receiver", f"{e.receiver_url}  (POST /alerts, GET /jobs)"),
        ("Gateway (OpenAI API)", f"{e.gateway_url}/v1/chat/completions"),
        ("Exporters", f"{e.exporters_url}/metrics"),
        *((f"Simulator {r}", e.simulator_url(r) + "  (/admin/faults)") for r in e.regions),
        ("Redis", e.redis_url),
        ("Milvus Lite primary", e.milvus_primary_uri),
        ("Milvus Lite replica", e.milvus_replica_uri),
        ("Run directory", str(layout.root)),
        ("Logs", str(layout.logs_dir)),
        ("Webhook token file", str(layout.token_file)),
    ]
    return rows


def state_json(state: StackState, health: Mapping[str, object] | None = None) -> str:
    """The state (and each part's health) as pretty JSON, for `status --json`."""
    data = state.model_dump(mode="json")
    if health is not None:
        data["health"] = dict(health)
    return json.dumps(data, indent=2)
