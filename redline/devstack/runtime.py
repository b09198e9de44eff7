"""`redline up` and `redline down`: prepare the run directory, start every part, stop them all.

`start_stack` checks the binaries, loads the spec (local profile), picks ports, writes every
configuration file, then starts the service binaries (in parallel), the simulators and the
redline parts, recording each in the state file (`redline.devstack.state`) as soon as it runs;
on any failure or interrupt it stops what it started. `stop_stack` stops exactly the recorded
processes (`redline.devstack.parts`), and any a killed `up` had spawned but not yet recorded.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from redline.core.locks import exclusive_lock
from redline.dashboards.render import DASHBOARDS_DIR
from redline.devstack.config import (
    PartCommand,
    add_receiver_replicas,
    build_part_commands,
    build_prometheus_configs,
    build_stack_spec,
    render_settings,
)
from redline.devstack.errors import (
    BinaryMissingError,
    PortInUseError,
    StackError,
    StackRunningError,
)
from redline.devstack.interrupts import InterruptGuard, shield_cleanup
from redline.devstack.layout import (
    DEFAULT_PODS,
    GATEWAY_SOURCE,
    HOST,
    REDIS_REPLICA_PART,
    SENTINEL_MASTER,
    SENTINEL_PARTS,
    SENTINEL_QUORUM,
    STACK_SOURCES,
    Endpoints,
    StackConfigError,
    StackLayout,
    build_endpoints,
    build_ported_parts,
    build_redis_ha_parts,
    build_service_parts,
    check_pods,
    check_redis_topology,
    check_regions,
    check_replicas,
    check_source,
)
from redline.devstack.multiregion import (
    MultiRegionError,
    render_prometheus_config,
    select_regions,
)
from redline.devstack.parts import (
    Say,
    find_strays,
    part_alive,
    spawn_part,
    stop_part,
    stop_parts,
    wait_ready,
)
from redline.devstack.processes import (
    Service,
    ServiceError,
    find_binary,
    free_port,
    milvus_lite_binary,
    start_alertmanager,
    start_milvus_lite,
    start_prometheus,
    start_redis,
    start_redis_replica,
    start_sentinel,
)
from redline.devstack.state import PartState, StackState, read_state, write_state
from redline.devstack.tether import reap_orphans
from redline.generate.outputs import ALERTMANAGER_FILE, RULE_FILE, RULES_DIR, build_outputs
from redline.slo.load import LoadedSpec, SpecError, apply_profile, load_spec
from redline.slo.spec import Spec


def run_dir_lock(layout: StackLayout) -> contextlib.AbstractContextManager[None]:
    """Serialize `up` and `down` on one run directory."""
    busy = StackRunningError(
        f"{layout.root}: another `redline up` or `down` is working on this directory"
    )
    return exclusive_lock(layout.root / ".lock", busy)


RATE_PER_CORE = 10.0
MAX_RATE = 50.0


def default_rate() -> float:
    """The load generator's requests/s sized to the machine: 10 per core, at most 50.

    The stack's own parts cost about 15 ms of CPU per request end to end (load generator,
    gateway, service fronts, simulators): at 50 requests/s that is 0.8 of a core on their
    own, which leaves a two-core laptop running anything else no room, and the stack's P99
    over the red line before any fault (20 requests/s on two cores: 0.3 of a core).
    """
    return min(MAX_RATE, RATE_PER_CORE * (os.cpu_count() or 1))


@dataclass(frozen=True)
class UpOptions:
    """What `redline up` was asked for."""

    run_dir: Path
    spec_path: Path | None = None
    ports: Mapping[str, int] = field(default_factory=dict)
    rate: float = field(default_factory=default_rate)
    seed: int = 7
    baseline_requests: int = 200
    ready_timeout: float = 90.0
    prometheus_regions: int | None = None
    """`--regions N`: a Prometheus for each of the spec's first N regions and a global one."""
    source: str | None = None
    """`--source`: redline-gateway or an engine profile (vllm: no gateway); None follows the
    spec's `sources.profile`."""
    pods: int = DEFAULT_PODS
    """`--pods N`: simulator pods per region, behind the region's service front."""
    redis: str = "single"
    """`--redis`: one redis-server, or `sentinel` (a primary, a replica, three Sentinels)."""
    replicas: int = 1
    """`--replicas N`: N gateways, receivers and exporters (Alertmanager notifies every
    receiver, Prometheus scrapes every replica, the load generator spreads over the gateways)."""


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
    try:
        milvus_lite_binary()
    except ServiceError:
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
        say(
            f"{root}: stale run directory from a run that is no longer running "
            f"({len(state.parts)} recorded parts, none alive); cleaning up"
        )
    orphans = reap_orphans()
    if orphans:
        say(f"stopped {len(orphans)} process(es) of earlier runs whose owner is gone: {orphans}")
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
    alertmanager = outputs[RULES_DIR / ALERTMANAGER_FILE]
    if endpoints.replicas > 1:
        config = add_receiver_replicas(
            yaml.safe_load(alertmanager), [f"{url}/alerts" for url in endpoints.receiver_urls]
        )
        header = "".join(line + "\n" for line in alertmanager.splitlines() if line.startswith("#"))
        alertmanager = header + yaml.safe_dump(config, sort_keys=False)
    _write(layout.alertmanager_file, alertmanager)
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
        primary = (endpoints.hosts.get("redis", endpoints.host), endpoints.ports["redis"])
        if name == "redis":
            service = start_redis(workdir, port)
        elif name == REDIS_REPLICA_PART:
            service = start_redis_replica(workdir, primary, port)
        elif name in SENTINEL_PARTS:
            service = start_sentinel(
                workdir, SENTINEL_MASTER, primary, port, quorum=SENTINEL_QUORUM
            )
        elif name.startswith("prometheus"):
            # Exemplar storage: the gateway's latency histogram carries trace ids (OpenMetrics
            # scrape, which Prometheus asks for first), read back by the dashboards' P99 panel.
            service = start_prometheus(
                workdir,
                self.layout.prometheus_config(name),
                port,
                extra_args=("--enable-feature=exemplar-storage",),
            )
        elif name == "alertmanager":
            service = start_alertmanager(workdir, self.layout.alertmanager_file, port)
        else:
            service = start_milvus_lite(workdir, port)
        url = service.extra.get("url") or service.extra.get("uri") or service.url
        return PartState(
            name=name,
            kind="service",
            pid=service.process.pid,
            start_ticks=service.process.start_ticks,
            port=port,
            url=url,
            log=str(service.log_path),
            argv=list(service.process.argv),
            started_at=time.time(),
        )

    def redline(self, command: PartCommand, endpoints: Endpoints) -> PartState:
        """Spawn one redline part (not waiting for it)."""
        log = self.layout.log_file(command.part)
        port = endpoints.ports.get(command.part)
        with self.guard.hold():
            part = spawn_part(command.part, command.argv, log, port, endpoints.host, command.env)
            self.record(part)
        return part


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


def resolve_source(spec: Spec, source: str | None) -> str:
    """The stack's source: `--source` when given, else the spec's `sources.profile` (the
    embedded default's is redline-gateway); StackError when the stack cannot simulate it."""
    chosen = source if source is not None else spec.sources.profile
    try:
        check_source(chosen)
    except StackConfigError as exc:
        if source is not None:
            raise StackError(str(exc)) from None
        raise StackError(
            f"sources.profile: {chosen}: the local stack simulates {', '.join(STACK_SOURCES)}; "
            f"run it with --source {GATEWAY_SOURCE} or another of those"
        ) from None
    return chosen


def _prometheus_regions(spec: Spec, count: int | None) -> tuple[str, ...]:
    if count is None:
        return ()
    try:
        return select_regions(spec, count)
    except MultiRegionError as exc:
        raise StackError(str(exc)) from None


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
    try:
        check_pods(options.pods)
        check_redis_topology(options.redis)
        check_replicas(options.replicas)
    except StackConfigError as exc:
        raise StackError(str(exc)) from None
    check_binaries()
    loaded, spec = _load(options.spec_path)
    source = resolve_source(spec, options.source)
    prometheus_regions = _prometheus_regions(spec, options.prometheus_regions)
    layout = StackLayout(options.run_dir.resolve())
    with run_dir_lock(layout):
        prepare_run_dir(layout, say)
        parts = build_ported_parts(
            spec.regions, prometheus_regions, source, options.pods, options.redis, options.replicas
        )
        ports = choose_ports(parts, options.ports)
        endpoints = build_endpoints(
            ports,
            spec.regions,
            prometheus_regions=prometheus_regions,
            source=source,
            pods=options.pods,
            redis=options.redis,
            replicas=options.replicas,
        )
        spec_path = options.spec_path.resolve() if options.spec_path else None
        commands = build_part_commands(
            spec, endpoints, layout, spec_path, options.rate, options.seed
        )
        spec_name = (
            "slo/specs/default.yaml" if spec_path is None else spec_path.name
        )  # as `redline generate` names it
        write_configs(layout, spec, spec_name, endpoints, commands)
        state = StackState(
            run_dir=str(layout.root),
            spec=str(spec_path) if spec_path else None,
            spec_source=loaded.source,
            host=endpoints.host,
            regions=list(spec.regions),
            prometheus_regions=list(prometheus_regions),
            source=source,
            pods=options.pods,
            redis=options.redis,
            replicas=options.replicas,
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
            shield_cleanup()
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
    ha_parts = build_redis_ha_parts(endpoints.redis)
    if ha_parts:
        # After the primary, one by one: the replica syncs from it, the Sentinels find both.
        say(f"starting the Redis replica and {len(ha_parts) - 1} Sentinels")
        for name in ha_parts:
            try:
                starter.record(starter.service(name, endpoints))
            except ServiceError as exc:
                raise StackError(f"{name}: {exc}") from None
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
