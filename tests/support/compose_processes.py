"""compose/docker-compose.yml run as local processes, as Docker would run it but without Docker.

`redline compose init --demo` writes the installation's config into a copy of the compose folder;
then every active service (its profiles as compose/.env selects them) starts in dependency order:

- a redline service runs its exact `command` with the installed `redline` (the image's
  entrypoint), its `environment`, and its mounted config files;
- Redis, Prometheus and Alertmanager run as the Debian binaries with the compose command's
  flags, Milvus as Milvus Lite (no etcd or MinIO needed); a Sentinel (`--sentinel` in its
  command) as `redis-server <its config> --sentinel`, its config seeded from the mounted
  template into its volume, as the container's command does;
- Grafana, Thanos, MinIO and etcd have no local binary: they are listed as not run, and the test
  checks that list, so a service added to the file cannot slip through unrun.

What Docker gives a container is reproduced by rewriting text, never by changing a command:
each service gets a loopback address of its own (127.X.Y.n), so its container ports stay as
they are; a service name followed by a port (`redis:6379`) becomes that address; `0.0.0.0`,
`127.0.0.1` and `localhost` inside a service become its own address; a container path under a
mount (`/etc/redline/...`, `/run/secrets/...`, a named volume, the image's home) becomes the
host directory standing for it; for Redis and its Sentinels, whose commands and config files
name hosts without a port (`--replicaof redis 6379`, `sentinel monitor redline redis 6379 2`),
a service name standing as a word of its own becomes that address too. Mounted files are copied
with the same rewriting. A service is
ready when its own compose healthcheck passes (redline's run as written, with the installed
Python and CLI); Debian's services by their HTTP readiness or a PING.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from redline.devstack.layout import MARKER_FILE, StackLayout, service_part, simulator_part
from redline.devstack.processes import (
    Service,
    find_binary,
    milvus_lite_binary,
    spawn,
    wait_service,
)
from redline.devstack.state import StackState, write_state
from tests.support.compose import COMPOSE, ROOT

PYTHON = sys.executable
REDLINE = str(Path(PYTHON).with_name("redline"))
IMAGE_HOME = "/var/lib/redline"
"""The redline image's WORKDIR and home (compose/Dockerfile)."""
NOT_RUNNABLE = ("grafana/", "quay.io/thanos/", "minio/", "quay.io/coreos/etcd", "jaegertracing/")
"""Images with no local binary: their services are reported as not run."""
READY_TIMEOUT = 90.0
SENTINEL_PORT = 26379
SENTINEL_TEMPLATE = "/etc/redis/sentinel.conf"
"""Where a Sentinel's container finds its config template (copied to /data on first start)."""


class ComposeRunError(Exception):
    """A compose service did not start or did not become healthy (its log tail attached)."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable substitution: `${V}`, `${V:-default}`, `${V-default}`, `${V:?msg}`,
    `$$`; an unset variable without a default is empty, as in compose."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op") or "", match.group("arg") or ""
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return value if value is not None else arg
        if op == ":?" and not value:
            raise ComposeRunError(f"${{{name}}} is required: {arg}")
        return value or ""

    pattern = r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:\?)(?P<arg>[^}]*))?\}"
    return re.sub(pattern, substitute, text)


def read_env_file(path: Path) -> dict[str, str]:
    """compose/.env: KEY=VALUE lines (comments and blanks skipped)."""
    env = {}
    for line in path.read_text("utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def start_order(services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Services ordered so each comes after what it `depends_on` (compose's order)."""
    ordered: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in ordered:
            return
        if name in path:
            raise ComposeRunError(f"dependency cycle: {' -> '.join((*path, name))}")
        for dependency in services[name].get("depends_on", {}):
            if dependency in services:
                visit(dependency, (*path, name))
        ordered.append(name)

    for name in services:
        visit(name, ())
    return ordered


def pick_subnet() -> str:
    """A 127.X.Y prefix whose .2 address nobody listens on (one per run: parallel runs differ)."""
    rng = random.Random()
    for _ in range(50):
        prefix = f"127.{rng.randint(100, 250)}.{rng.randint(1, 250)}"
        with socket.socket() as probe:
            probe.settimeout(0.2)
            if probe.connect_ex((f"{prefix}.2", 6379)) != 0:
                return prefix
    raise ComposeRunError("no free 127.X.Y subnet found")


@dataclass
class Rewriter:
    """The text rewriting that stands for Docker's network and mounts, for one service."""

    own_address: str
    addresses: Mapping[str, str]
    paths: Mapping[str, Path]
    """Container path -> host path (longest first when applied)."""
    words: bool = False
    """Also a service name standing alone as a word (Redis' `--replicaof redis 6379`)."""

    def __call__(self, text: str) -> str:
        names = sorted(self.addresses, key=len, reverse=True)
        if names:
            hosts = r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")(?=:\d)"
            text = re.sub(hosts, lambda m: self.addresses[m.group(1)], text)
        if names and self.words:
            alone = r"(?<![\w./:-])(" + "|".join(map(re.escape, names)) + r")(?![\w./:-])"
            text = re.sub(alone, lambda m: self.addresses[m.group(1)], text)
        text = re.sub(
            r"(?<![\w.])(0\.0\.0\.0|127\.0\.0\.1|localhost)(?![\w.])", self.own_address, text
        )
        targets = sorted(self.paths, key=len, reverse=True)
        if targets:
            paths = "(" + "|".join(map(re.escape, targets)) + r")(?=/|\b|$)"
            text = re.sub(paths, lambda m: str(self.paths[m.group(1)]), text)
        return text


@dataclass
class ComposeRun:
    """The compose stack as processes: where each service runs and what was not run."""

    root: Path
    compose_dir: Path
    services: dict[str, dict[str, Any]]
    addresses: dict[str, str]
    started: dict[str, Service] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)

    def url(self, service: str, port: int) -> str:
        """http://address:port of a service."""
        return f"http://{self.addresses[service]}:{port}"

    def stop(self) -> None:
        """Stop every started service, last started first."""
        for service in reversed(list(self.started.values())):
            service.stop(15.0)


def prepare(root: Path, init_args: Sequence[str] = ()) -> tuple[Path, dict[str, str]]:
    """A copy of compose/ (the repo's other folders linked beside it), configured by the real
    `redline compose init --demo` (and `init_args`); returns the copy and its .env variables."""
    compose_dir = root / "compose"
    shutil.copytree(
        COMPOSE, compose_dir, ignore=shutil.ignore_patterns("config", "secrets", ".env")
    )
    for sibling in ("dashboards", "rules", "slo"):
        (root / sibling).symlink_to(ROOT / sibling)
    init = subprocess.run(
        [REDLINE, "compose", "init", "--dir", str(compose_dir), "--demo", *init_args],
        capture_output=True,
        text=True,
        check=False,
    )
    if init.returncode != 0:
        raise ComposeRunError(f"redline compose init --demo failed:\n{init.stdout}\n{init.stderr}")
    return compose_dir, read_env_file(compose_dir / ".env")


def active_services(compose_dir: Path, env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The services the .env's COMPOSE_PROFILES start, after variable substitution."""
    text = interpolate((compose_dir / "docker-compose.yml").read_text("utf-8"), env)
    data: dict[str, Any] = yaml.safe_load(text)
    profiles = set(filter(None, env.get("COMPOSE_PROFILES", "").split(",")))
    services: dict[str, dict[str, Any]] = data["services"]
    active = {
        name: service
        for name, service in services.items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }
    for service in active.values():
        service["_secrets"] = {
            name: (compose_dir / data["secrets"][name]["file"]).resolve()
            for name in service.get("secrets", [])
        }
    return active


def _mounts(
    name: str, service: Mapping[str, Any], compose_dir: Path, root: Path
) -> tuple[dict[str, Path], dict[str, Path]]:
    """(container path -> host path of named volumes and the home, bind mounts to copy)."""
    volumes_dir = root / "volumes"
    direct: dict[str, Path] = {}
    binds: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            binds[target] = (compose_dir / source).resolve()
        else:
            direct[target] = volumes_dir / source
            direct[target].mkdir(parents=True, exist_ok=True)
    for secret, path in service["_secrets"].items():
        binds[f"/run/secrets/{secret}"] = path
    if service["image"].startswith("redline:"):
        home = root / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        direct.setdefault(IMAGE_HOME, home)
    return direct, binds


def _copy_rewritten(source: Path, target: Path, rewrite: Callable[[str], str]) -> None:
    """Copy a mounted file or folder, rewriting text files (0600 secrets keep their mode)."""
    if source.is_dir():
        for child in sorted(source.rglob("*")):
            if child.is_file():
                _copy_rewritten(child, target / child.relative_to(source), rewrite)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        target.write_text(rewrite(source.read_text("utf-8")), "utf-8")
    except UnicodeDecodeError:
        shutil.copyfile(source, target)
    os.chmod(target, source.stat().st_mode & 0o777)


def _argv(service: Mapping[str, Any], address: str, volumes: Mapping[str, Path]) -> list[str]:
    """The local argv of a service: its compose command with the image's entrypoint (redline's
    CLI, Debian's binaries), listening on its own address; Milvus Lite for Milvus."""
    image: str = service["image"]
    command = [str(word) for word in service.get("command", [])]
    if image.startswith("redline:"):
        return [REDLINE, *command]
    if image.startswith("redis:") and is_sentinel(service):
        # The container copies its template to /data and runs it there (Sentinel rewrites it).
        config = str(volumes["/data"] / "sentinel.conf")
        return [find_binary("redis-server"), config, "--sentinel", "--bind", address,
                "--port", str(SENTINEL_PORT)]  # fmt: skip
    if image.startswith("redis:"):
        # The image's WORKDIR /data (a volume) is where redis-server keeps its AOF.
        return [find_binary("redis-server"), *command[1:], "--bind", address, "--port", "6379",
                "--dir", str(volumes["/data"]), "--daemonize", "no"]  # fmt: skip
    if image.startswith("prom/prometheus:"):
        return [find_binary("prometheus"), *command, f"--web.listen-address={address}:9090"]
    if image.startswith("prom/alertmanager:"):
        binary = find_binary("prometheus-alertmanager", "alertmanager")
        return [binary, *command, f"--web.listen-address={address}:9093"]
    if image.startswith("milvusdb/milvus:"):
        return [milvus_lite_binary(), "server", "--data-dir", str(volumes["/var/lib/milvus"]),
                "--host", address, "--port", "19530"]  # fmt: skip
    raise ComposeRunError(f"no local binary for image {image}")


def _healthcheck(service: Mapping[str, Any], rewrite: Callable[[str], str]) -> Callable[[], bool]:
    """Readiness: a redline service's own compose healthcheck; Debian's by HTTP or PING."""
    image: str = service["image"]
    if image.startswith("redline:"):
        test = [rewrite(str(word)) for word in service["healthcheck"]["test"]]
        assert test[0] == "CMD", f"healthcheck form {test[0]} is not CMD"
        local = {"python": PYTHON, "redline": REDLINE}
        argv = [local.get(test[1], test[1]), *test[2:]]

        def run() -> bool:
            done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
            return done.returncode == 0

        return run
    wget = service.get("healthcheck", {}).get("test", [])
    url = next((rewrite(str(w)) for w in wget if str(w).startswith("http")), None)
    if url is not None:
        return lambda: httpx.get(url, timeout=2.0).status_code == 200
    raise ComposeRunError(f"no local readiness check for image {image}")


def is_sentinel(service: Mapping[str, Any]) -> bool:
    """A Redis image run as a Sentinel (`--sentinel` in its command)."""
    return str(service["image"]).startswith("redis:") and "--sentinel" in " ".join(
        map(str, service.get("command", []))
    )


def _redis_ready(address: str, port: int = 6379) -> Callable[[], bool]:
    def ping() -> bool:
        with socket.create_connection((address, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")

    return ping


def _tcp_ready(address: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.create_connection((address, port), timeout=0.5):
            return True

    return check


def start(run: ComposeRun, name: str) -> None:
    """Start one service as a local process and wait until it is healthy."""
    service = run.services[name]
    address = run.addresses[name]
    workdir = run.root / "services" / name
    workdir.mkdir(parents=True, exist_ok=True)
    direct, binds = _mounts(name, service, run.compose_dir, run.root)
    argv = _argv(service, address, direct)
    mounts_dir = workdir / "mounts"
    paths = {**direct, **{target: mounts_dir / target.lstrip("/") for target in binds}}
    image: str = service["image"]
    rewrite = Rewriter(address, run.addresses, paths, words=image.startswith("redis:"))
    for target, source in binds.items():
        _copy_rewritten(source, paths[target], rewrite)
    if is_sentinel(service):
        seeded = direct["/data"] / "sentinel.conf"
        if not seeded.exists():  # `[ -f /data/sentinel.conf ] || cp ...`, as the container
            shutil.copyfile(paths[SENTINEL_TEMPLATE], seeded)
    argv = [argv[0], *(rewrite(arg) for arg in argv[1:])]
    environment = service.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    env = {**os.environ, **{k: rewrite(str(v)) for k, v in environment.items()}}
    env["HOME"] = str(direct.get(IMAGE_HOME, workdir))
    if is_sentinel(service):
        ready = _redis_ready(address, SENTINEL_PORT)
    elif image.startswith("redis:"):
        ready = _redis_ready(address)
    elif image.startswith("milvusdb/"):
        ready = _tcp_ready(address, 19530)
    else:
        ready = _healthcheck(service, rewrite)
    cwd = direct.get(IMAGE_HOME, workdir)
    process = spawn_in(argv, workdir / f"{name}.log", env, cwd)
    started = Service(name, process, address, 0, workdir, workdir / f"{name}.log")
    run.argv[name] = argv
    try:
        wait_service(started, _quiet(ready), READY_TIMEOUT)
    except Exception as exc:
        raise ComposeRunError(f"{name}: {exc}\n{started.log_tail(40)}") from None
    run.started[name] = started


def spawn_in(argv: list[str], log: Path, env: Mapping[str, str], cwd: Path) -> Any:
    """`spawn` from a working directory (the container's WORKDIR stands for it)."""
    before = Path.cwd()
    os.chdir(cwd)
    try:
        return spawn(argv, log, env)
    finally:
        os.chdir(before)


def _quiet(check: Callable[[], bool]) -> Callable[[], bool]:
    """A readiness check that answers False instead of raising while a service comes up."""

    def run() -> bool:
        try:
            return check()
        except (OSError, httpx.HTTPError, subprocess.SubprocessError):
            return False

    return run


def with_dependencies(
    services: Mapping[str, Mapping[str, Any]], wanted: Collection[str]
) -> set[str]:
    """`wanted` and everything they depend on, transitively (among `services`)."""
    found: set[str] = set()
    todo = [name for name in wanted if name in services]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += [d for d in services[name].get("depends_on", {}) if d in services]
    return found


def run_compose(
    root: Path, init_args: Sequence[str] = (), only: Collection[str] | None = None
) -> Iterator[ComposeRun]:
    """Configure (`redline compose init --demo` + `init_args`), start every active service in
    order (or only those of `only` and their dependencies), yield the run, stop everything."""
    compose_dir, env = prepare(root, init_args)
    services = active_services(compose_dir, {**os.environ, **env})
    if only is not None:
        missing = set(only) - set(services)
        if missing:
            raise ComposeRunError(f"not active services: {', '.join(sorted(missing))}")
        keep = with_dependencies(services, only)
        services = {name: service for name, service in services.items() if name in keep}
    prefix = pick_subnet()
    addresses = {name: f"{prefix}.{i + 2}" for i, name in enumerate(sorted(services))}
    run = ComposeRun(root, compose_dir, services, addresses)
    try:
        for name in start_order(services):
            if any(services[name]["image"].startswith(p) for p in NOT_RUNNABLE):
                run.not_run[name] = f"no local binary for {services[name]['image']}"
                continue
            start(run, name)
        yield run
    finally:
        run.stop()


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until true; ComposeRunError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _quiet(check)():
            return
        time.sleep(0.5)
    raise ComposeRunError(f"timed out after {timeout:.0f} s waiting for {what}")


PARTS = {
    "redis": ("redis", 6379),
    "milvus-primary": ("milvus-primary", 19530),
    "milvus-replica": ("milvus-replica", 19530),
    "prometheus": ("prometheus", 9090),
    "alertmanager": ("alertmanager-1", 9093),
    "gateway": ("gateway", 8080),
    "remediation": ("remediation", 9095),
    "exporters": ("exporters", 9109),
}
"""The local stack's part -> the compose service standing for it and its port."""


def write_drill_state(run: ComposeRun, run_dir: Path, regions: list[str]) -> StackState:
    """A state file through which `redline drill` reaches the compose services: every part at
    its service's address, each region's pod and service front at its simulator, the webhook
    token and the receiver's audit file where the drills read them."""
    parts = {part: (run.addresses[name], port) for part, (name, port) in PARTS.items()}
    for region, simulator in zip(
        regions, ("simulator-primary", "simulator-secondary"), strict=True
    ):
        for part in (simulator_part(region, 0), service_part(region)):
            parts[part] = (run.addresses[simulator], 8000)
    layout = StackLayout(run_dir)
    layout.config_dir.mkdir(parents=True, exist_ok=True)
    layout.data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run.compose_dir / "secrets" / "webhook-token", layout.token_file)
    layout.audit_file.symlink_to(run.root / "volumes" / "remediation-audit" / "audit.jsonl")
    state = StackState(
        status="running",
        run_dir=str(run_dir),
        spec=str(run.compose_dir / "config" / "spec.yaml"),
        spec_source="compose/config/spec.yaml",
        host="127.0.0.1",
        regions=regions,
        pods=1,
        ports={part: port for part, (_, port) in parts.items()},
        hosts={part: address for part, (address, _) in parts.items()},
        rate=20.0,
        seed=0,
        started_at=time.time(),
    )
    write_state(layout, state)
    (run_dir / MARKER_FILE).touch()
    return state
