"""Start and stop processes: the one spawner of the devstack, and the real services redline runs
beside (redis-server, Prometheus, Alertmanager, Milvus Lite) on loopback, on free ports.

Every process (a service, a part of the local stack, a node of the spot drills' fleet) is started
by `spawn`: detached in a session of its own, stdin from /dev/null, stdout and stderr appended to
its log file, so nothing it prints (a gRPC library's logging included) reaches the terminal. A
`Process` remembers the kernel's start time of its pid, so a pid reused by another program is
never signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from redline.devstack.tether import OWNER_ENV, record_spawned

APT_PACKAGES = {
    "redis-server": "redis-server",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
}
INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
StopOutcome = Literal["stopped", "killed", "not running"]


class ServiceError(Exception):
    """A service binary is missing or did not become ready."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def find_binary(*names: str) -> str:
    """The path of the first of `names` on PATH; ServiceError with the install command if none."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    package = APT_PACKAGES.get(names[0], names[0])
    raise ServiceError(
        f"{' or '.join(names)} not found on PATH; install it with: "
        f"apt-get update && apt-get install -y {package}"
    )


# ---- processes ---------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot); None if gone or a zombie."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def session_leader(pid: int) -> bool:
    """True when `pid` leads its own session, as every process `spawn` starts does."""
    fields = _stat_fields(pid)
    return fields is not None and len(fields) > 3 and fields[3] == str(pid)


def reap(pid: int) -> int | None:
    """Collect the exit status of our own exited child so it does not linger as a zombie;
    its exit code (negative: killed by that signal), or None if it runs or is not our child."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
    return None


@dataclass
class Process:
    """A started process: its pid and the kernel's start time of that pid."""

    pid: int
    start_ticks: int | None
    argv: tuple[str, ...] = ()
    log_path: Path | None = None
    returncode: int | None = None
    """The exit code once this process (our child) has been reaped."""

    def poll(self) -> int | None:
        """Reap the process if it is our child and has exited; its exit code, else None."""
        if self.returncode is None:
            self.returncode = reap(self.pid)
        return self.returncode

    def alive(self) -> bool:
        """True while the pid still runs the process that was started (not a reused pid)."""
        if self.poll() is not None:
            return False
        ticks = start_ticks(self.pid)
        return ticks is not None and (self.start_ticks is None or ticks == self.start_ticks)

    def signal(self, sig: int) -> None:
        """Send `sig` to the process's group (it leads its session), or to it alone."""
        try:
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 10.0) -> StopOutcome:
        """SIGTERM, SIGKILL after `timeout`; returns stopped, killed or not running."""
        if not self.alive():
            return "not running"
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return "stopped"
            time.sleep(0.05)
        self.kill()
        return "killed"

    def kill(self) -> None:
        """SIGKILL the process, as a crash would, and wait (up to 5 s) until it is gone."""
        if not self.alive():
            return
        self.signal(signal.SIGKILL)
        for _ in range(100):
            if not self.alive():
                return
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the process's log, for error messages."""
        return "" if self.log_path is None else log_tail(self.log_path, lines)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> Process:
    """Start `argv` detached (its own session), output appended to `log_path`.

    `env` is the whole environment (None: ours). The child starts with no blocked signals and
    default handlers for SIGINT, SIGTERM and SIGHUP, whatever the parent is masking or ignoring
    right now (a `redline up` catching interrupts, a shell that started us with SIGINT ignored).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        pid = os.posix_spawn(
            argv[0],
            list(argv),
            dict(os.environ if env is None else env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=INTERRUPTS,
        )
    finally:
        os.close(fd)
    process = Process(pid, start_ticks(pid), tuple(argv), log_path)
    chain = (os.environ if env is None else env).get(OWNER_ENV)
    record_spawned(pid, process.start_ticks, chain)
    return process


def wait_until(
    process: Process,
    name: str,
    ready: Callable[[], bool],
    timeout: float = 30.0,
    interval: float = 0.05,
    where: str = "",
) -> None:
    """Poll `ready` until it holds; ServiceError (with the log's tail) when the process exits or
    `timeout` passes first. Errors of `ready` (connection refused, say) count as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            code = process.poll()
            status = "" if code is None else f" with code {code}"
            raise ServiceError(
                f"{name} exited{status} during start-up; log {process.log_path}:\n"
                f"{process.log_tail()}"
            )
        try:
            if ready():
                return
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(interval)
    raise ServiceError(
        f"{name} not ready{where} after {timeout:g} s; log {process.log_path}:\n"
        f"{process.log_tail()}"
    )


def http_ok(url: str, timeout: float = 1.0) -> Callable[[], bool]:
    """A readiness check: GET `url` answers 200."""

    def check() -> bool:
        return httpx.get(url, timeout=timeout).status_code == 200

    return check


# ---- services ----------------------------------------------------------------------------------


@dataclass
class Service:
    """A running service process and how to reach it."""

    name: str
    process: Process
    host: str
    port: int
    workdir: Path
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """Base URL (http) of the service."""
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.process.alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) and reap it."""
        self.process.stop(timeout)

    def kill(self) -> None:
        """SIGKILL the process, as a crash would."""
        self.process.kill()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the service's log, for error messages."""
        return self.process.log_tail(lines)


def start_service(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    port: int,
    ready: Callable[[], bool],
    timeout: float = 30.0,
    host: str = "127.0.0.1",
    workdir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Service:
    """Spawn a service and wait until `ready` holds; on failure stop it and raise ServiceError."""
    process = spawn(argv, log_path, env)
    service = Service(name, process, host, port, workdir or log_path.parent, log_path)
    return wait_service(service, ready, timeout)


def wait_service(service: Service, ready: Callable[[], bool], timeout: float = 30.0) -> Service:
    """Wait until a started service is ready; stop it and raise ServiceError if it is not."""
    where = f" on {service.host}:{service.port}"
    try:
        wait_until(service.process, service.name, ready, timeout, where=where)
    except ServiceError:
        service.stop()
        raise
    return service


def _tcp_open(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.create_connection((host, port), timeout=0.5):
            return True

    return check


def _redis_ping(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")

    return check


def _service_dir(workdir: Path, name: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir / f"{name}.log"


def _redis_argv(workdir: Path, host: str, port: int, *extra: str) -> list[str]:
    """redis-server on `host:port` in `workdir`: AOF on (fsync every second), no RDB snapshots,
    keyspace notifications for expired/evicted keys, in the foreground."""
    return [
        find_binary("redis-server"),
        "--bind", host,
        "--port", str(port),
        "--dir", str(workdir),
        "--save", "",
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--notify-keyspace-events", "Exge",
        *extra,
        "--daemonize", "no",
    ]  # fmt: skip


def start_redis(workdir: Path, port: int | None = None, host: str = "127.0.0.1") -> Service:
    """redis-server with keyspace notifications for expired/evicted keys, AOF on, in `workdir`."""
    port = port or free_port(host)
    argv = _redis_argv(workdir, host, port)
    log = _service_dir(workdir, "redis")
    service = start_service("redis", argv, log, port, _redis_ping(host, port), host=host)
    service.extra["url"] = f"redis://{host}:{port}/0"
    return service


def start_redis_replica(
    workdir: Path, primary: tuple[str, int], port: int | None = None, host: str = "127.0.0.1"
) -> Service:
    """redis-server replicating `primary` (host, port), configured as `start_redis`; ready once
    its first sync is done (`master_link_status:up`)."""
    port = port or free_port(host)
    replica = ("--replicaof", primary[0], str(primary[1]), "--replica-announce-ip", host)
    argv = _redis_argv(workdir, host, port, *replica)
    log = _service_dir(workdir, "redis-replica")
    service = start_service(
        "redis-replica", argv, log, port, _replica_synced(host, port), host=host
    )
    service.extra["url"] = f"redis://{host}:{port}/0"
    return service


def _replica_synced(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"INFO replication\r\n")
            return b"master_link_status:up" in sock.recv(4096)

    return check


def render_sentinel_config(
    workdir: Path,
    master: str,
    primary: tuple[str, int],
    port: int,
    host: str = "127.0.0.1",
    quorum: int = 2,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 10000,
) -> str:
    """A sentinel.conf monitoring `primary` as `master`; short timeouts for a local stack."""
    return "\n".join(
        [
            f"bind {host}",
            f"port {port}",
            f"dir {workdir}",
            "daemonize no",
            f"sentinel announce-ip {host}",
            f"sentinel monitor {master} {primary[0]} {primary[1]} {quorum}",
            f"sentinel down-after-milliseconds {master} {down_after_ms}",
            f"sentinel failover-timeout {master} {failover_timeout_ms}",
            f"sentinel parallel-syncs {master} 1",
            "",
        ]
    )


def start_sentinel(
    workdir: Path,
    master: str,
    primary: tuple[str, int],
    port: int | None = None,
    host: str = "127.0.0.1",
    quorum: int = 2,
) -> Service:
    """A Redis Sentinel (`redis-server sentinel.conf --sentinel`: Debian ships no separate
    binary) monitoring `primary`; its config file lives (and is rewritten by it) in `workdir`."""
    binary = find_binary("redis-sentinel", "redis-server")
    port = port or free_port(host)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "sentinel.conf"
    config.write_text(render_sentinel_config(workdir, master, primary, port, host, quorum))
    argv = [binary, str(config), "--sentinel"]
    log = _service_dir(workdir, "sentinel")
    service = start_service(f"sentinel:{port}", argv, log, port, _redis_ping(host, port), host=host)
    service.extra["url"] = f"redis://{host}:{port}"
    return service


def start_prometheus(
    workdir: Path,
    config: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
) -> Service:
    """Prometheus with `config`, lifecycle API on, its TSDB in `workdir/data`; `extra_args`
    after the usual flags (e.g. a `--query.lookback-delta`)."""
    binary = find_binary("prometheus")
    port = port or free_port(host)
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={host}:{port}",
        "--web.enable-lifecycle",
        "--web.enable-admin-api",
        "--storage.tsdb.retention.time=400d",
        *extra_args,
        "--log.level=warn",
    ]
    log = _service_dir(workdir, "prometheus")
    ready = http_ok(f"http://{host}:{port}/-/ready")
    return start_service("prometheus", argv, log, port, ready, host=host)


def start_alertmanager(
    workdir: Path,
    config: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    cluster_port: int | None = None,
    peers: Sequence[str] = (),
) -> Service:
    """Alertmanager with `config`, its state in `workdir/data`; no gossip cluster unless
    `cluster_port` is given (then it gossips there with `peers`, an HA pair's `host:port`s)."""
    binary = find_binary("prometheus-alertmanager", "alertmanager")
    port = port or free_port(host)
    if cluster_port is None:
        cluster = ["--cluster.listen-address="]
    else:
        gossip = f"{host}:{cluster_port}"
        cluster = [
            f"--cluster.listen-address={gossip}",
            f"--cluster.advertise-address={gossip}",
            # A peer waits this long per position before it sends what its elders may have
            # sent: short here, so a test's pair notifies in seconds.
            "--cluster.peer-timeout=1s",
            "--cluster.gossip-interval=50ms",
            "--cluster.pushpull-interval=2s",
            *(f"--cluster.peer={peer}" for peer in peers),
        ]
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address={host}:{port}",
        *cluster,
        "--log.level=warn",
    ]
    log = _service_dir(workdir, "alertmanager")
    ready = http_ok(f"http://{host}:{port}/-/ready")
    return start_service("alertmanager", argv, log, port, ready, host=host)


def milvus_lite_binary() -> str:
    """The milvus-lite command next to this Python, else on PATH (ServiceError if neither)."""
    beside = Path(sys.executable).with_name("milvus-lite")
    return str(beside) if beside.exists() else find_binary("milvus-lite")


def start_milvus_lite(workdir: Path, port: int | None = None, host: str = "127.0.0.1") -> Service:
    """A Milvus Lite gRPC server over `workdir/data`; clients use `service.extra['uri']`."""
    binary = milvus_lite_binary()
    port = port or free_port(host)
    argv = [binary, "server", "--data-dir", str(workdir / "data"), "--host", host,
            "--port", str(port)]  # fmt: skip
    log = _service_dir(workdir, "milvus")
    service = start_service("milvus", argv, log, port, _tcp_open(host, port), 60.0, host=host)
    service.extra["uri"] = f"http://{host}:{port}"
    return service
