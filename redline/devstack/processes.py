"""Start and stop the real services redline runs beside: redis-server, Prometheus, Alertmanager,
Milvus Lite. Each runs on loopback, on a free port, in a directory of its own."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

APT_PACKAGES = {
    "redis-server": "redis-server",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
}


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


@dataclass
class Service:
    """A running service process and how to reach it."""

    name: str
    process: subprocess.Popen[bytes]
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
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) and reap it."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the process, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the service's log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _spawn(
    name: str, argv: Sequence[str], workdir: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    log = log_path.open("ab")
    try:
        process = subprocess.Popen(
            list(argv),
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    finally:
        log.close()
    return process, log_path


def wait_until(
    service: Service, ready: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05
) -> Service:
    """Poll `ready` until it holds; stop the service and raise ServiceError on exit or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise ServiceError(
                f"{service.name} exited with code {service.process.returncode} during start-up; "
                f"log {service.log_path}:\n{service.log_tail()}"
            )
        try:
            if ready():
                return service
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(interval)
    service.stop()
    raise ServiceError(
        f"{service.name} not ready on {service.host}:{service.port} after {timeout:g} s; "
        f"log {service.log_path}:\n{service.log_tail()}"
    )


def _http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        return httpx.get(url, timeout=1.0).status_code == 200

    return check


def _tcp_open(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.create_connection((host, port), timeout=0.5):
            return True

    return check


def start_redis(workdir: Path, port: int | None = None, host: str = "127.0.0.1") -> Service:
    """redis-server with keyspace notifications for expired/evicted keys, AOF on, in `workdir`."""
    binary = find_binary("redis-server")
    port = port or free_port(host)
    argv = [
        binary,
        "--bind", host,
        "--port", str(port),
        "--dir", str(workdir),
        "--save", "",
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--notify-keyspace-events", "Exge",
        "--daemonize", "no",
    ]  # fmt: skip
    process, log = _spawn("redis", argv, workdir)
    service = Service("redis", process, host, port, workdir, log)
    service.extra["url"] = f"redis://{host}:{port}/0"
    return wait_until(service, _redis_ping(host, port))


def _redis_ping(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")

    return check


def start_prometheus(
    workdir: Path, config: Path, port: int | None = None, host: str = "127.0.0.1"
) -> Service:
    """Prometheus with `config`, lifecycle API on, its TSDB in `workdir/data`."""
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
        "--log.level=warn",
    ]
    process, log = _spawn("prometheus", argv, workdir)
    service = Service("prometheus", process, host, port, workdir, log)
    return wait_until(service, _http_ok(f"{service.url}/-/ready"))


def start_alertmanager(
    workdir: Path, config: Path, port: int | None = None, host: str = "127.0.0.1"
) -> Service:
    """Alertmanager with `config`, no gossip cluster, its state in `workdir/data`."""
    binary = find_binary("prometheus-alertmanager", "alertmanager")
    port = port or free_port(host)
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address={host}:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    process, log = _spawn("alertmanager", argv, workdir)
    service = Service("alertmanager", process, host, port, workdir, log)
    return wait_until(service, _http_ok(f"{service.url}/-/ready"))


def start_milvus_lite(workdir: Path, port: int | None = None, host: str = "127.0.0.1") -> Service:
    """A Milvus Lite gRPC server over `workdir/data`; clients use `service.extra['uri']`."""
    binary = str(Path(sys.executable).with_name("milvus-lite"))
    if not Path(binary).exists():
        binary = find_binary("milvus-lite")
    port = port or free_port(host)
    argv = [
        binary,
        "server",
        "--data-dir",
        str(workdir / "data"),
        "--host",
        host,
        "--port",
        str(port),
    ]
    process, log = _spawn("milvus", argv, workdir)
    service = Service("milvus", process, host, port, workdir, log)
    service.extra["uri"] = f"http://{host}:{port}"
    return wait_until(service, _tcp_open(host, port), timeout=60.0)
