"""`redline up`, `down`, `status`, `drill` and the load generator: the local stack from the CLI.

Thin: parses options, calls `redline.devstack`, prints. Exit codes: 0 ok; 1 a part or drill
failed; 2 bad input (spec, options); 3 a binary is missing; 4 the run directory is busy (a stack
already runs there).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from redline.cli.common import RegionsOpt, err, fail, out
from redline.core.settings import SettingsError, load_settings
from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.registry import DRILL_ORDER, resolve_names
from redline.devstack.drills.run import run_drills
from redline.devstack.drills.spot.scenarios import SPOT_DRILL_ORDER
from redline.devstack.errors import (
    BinaryMissingError,
    PortInUseError,
    StackError,
    StackRunningError,
)
from redline.devstack.health import check_stack
from redline.devstack.interrupts import (
    InterruptGuard,
    interrupt_as_keyboard,
    interrupt_on_signals,
    shield_cleanup,
)
from redline.devstack.layout import (
    ADAPTER_VERSIONS,
    DEFAULT_PODS,
    MAX_PODS,
    MAX_REPLICAS,
    STACK_SOURCES,
)
from redline.devstack.loadgen import LoadGenerator, LoadgenSettings, write_reference
from redline.devstack.models import (
    BaselineError,
    create_snapshots,
    describe,
    record_baselines,
    wait_for_active_version,
    write_adapters,
)
from redline.devstack.parts import Say, part_alive
from redline.devstack.report import TABLE_WIDTH, DrillBoard, build_report, render_json, write_json
from redline.devstack.runtime import UpOptions, default_rate, start_stack, stop_stack
from redline.devstack.state import StackState, describe_urls, load_running, state_json
from redline.devstack.tether import claim_ownership

DEFAULT_RUN_DIR = Path(".redline/run")
DEFAULT_ARTIFACT = Path(".redline/artifacts/drills.json")
RunDirOpt = Annotated[
    Path, typer.Option("--run-dir", help="Run directory (logs, config, data, state).")
]
SpecOpt = Annotated[
    Path | None, typer.Option("--spec", help="Spec YAML file; the embedded default when omitted.")
]


SourceOpt = Annotated[
    str | None,
    typer.Option(
        "--source",
        help=f"Whose metrics feed the rules: {' or '.join(STACK_SOURCES)} (the simulators "
        "publish vLLM's exposition and no gateway runs; clients talk to them directly). "
        "Default: the spec's sources.profile.",
        show_default=False,
    ),
]


_STARTED = time.monotonic()


def _say(line: str) -> None:
    err.print(f"[{time.monotonic() - _STARTED:5.1f} s] {line}", markup=False)


def _fail(exc: Exception) -> typer.Exit:
    """The exit for a stack error: 3 binary missing, 4 already running, 2 port taken, else 1."""
    codes: list[tuple[type[Exception], int]] = [
        (BinaryMissingError, 3),
        (StackRunningError, 4),
        (PortInUseError, 2),
    ]
    return fail(str(exc), next((code for kind, code in codes if isinstance(exc, kind)), 1))


def parse_ports(values: list[str] | None) -> dict[str, int]:
    """`PART=PORT` options as a mapping; typer.BadParameter on a malformed one."""
    ports: dict[str, int] = {}
    for value in values or []:
        part, sep, port = value.partition("=")
        if not sep or not part or not port.isdigit() or not 0 < int(port) < 65536:
            raise typer.BadParameter(
                f"{value!r}: expected PART=PORT (1-65535)", param_hint="--port"
            )
        ports[part] = int(port)
    return ports


def _setup_models(state: StackState, say: Say) -> None:
    layout = state.layout()
    write_adapters(layout)
    snapshots = create_snapshots(layout)
    write_reference(layout.drift_reference, count=4000, seed=state.seed + 1000)
    say(
        f"snapshots: {', '.join(f'{s.version}={s.snapshot_id}' for s in snapshots)} "
        f"(active {ADAPTER_VERSIONS[0]}); drift reference {layout.drift_reference.name}"
    )


def bring_up(options: UpOptions, guard: InterruptGuard | None = None) -> StackState:
    """Start the stack, measuring the adapter versions' baselines before the load starts."""

    def setup(state: StackState, say: Say) -> None:
        _setup_models(state, say)

    def baselines(state: StackState, say: Say) -> None:
        endpoints = state.endpoints()
        spec = state.load_spec()
        where = "the gateway" if endpoints.has_gateway else f"{state.regions[0]}'s engine"
        say(f"measuring each adapter version's baselines through {where}")
        try:
            measurements = record_baselines(
                state.layout(),
                endpoints.client_url,
                # Every pod: a load through a region's service reaches only one of them.
                [url for region in endpoints.regions for url in endpoints.pod_urls(region)],
                spec.sources.buckets,
                options.baseline_requests,
            )
        except BaselineError as exc:
            raise StackError(f"baselines: {exc}") from None
        for measurement in measurements:
            say(describe(measurement))
        if endpoints.has_gateway:
            return  # the gateway stamps the version itself; no join to wait for
        try:
            took = wait_for_active_version(endpoints.prometheus_url)
        except BaselineError as exc:
            raise StackError(f"baselines: {exc}") from None
        say(f"Prometheus joins requests to {ADAPTER_VERSIONS[0]} again after {took:.1f} s")

    return start_stack(options, _say, setup, baselines, guard)


def print_urls(state: StackState) -> None:
    """The table of where everything is."""
    table = Table(title=f"redline local stack ({state.run_dir})", show_lines=False)
    table.add_column("part")
    table.add_column("where")
    for what, where in describe_urls(state):
        table.add_row(what, where)
    out.print(table)


def up(
    run_dir: RunDirOpt = DEFAULT_RUN_DIR,
    spec: SpecOpt = None,
    port: Annotated[
        list[str] | None,
        typer.Option("--port", help="PART=PORT to pin a part's port (repeatable)."),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate",
            min=8.0,
            help="Load generator requests per second (default: 10 per core, at most 50).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the load and the faults.")] = 7,
    regions: RegionsOpt = None,
    source: SourceOpt = None,
    pods: Annotated[
        int,
        typer.Option(
            "--pods",
            min=1,
            max=MAX_PODS,
            help="Simulator pods per region, each its own process, behind the region's "
            "round-robin service front (a Kubernetes Service stand-in).",
        ),
    ] = DEFAULT_PODS,
    redis: Annotated[
        str,
        typer.Option(
            "--redis",
            help="Redis topology: single (one redis-server) or sentinel (a primary, a replica "
            "and three Sentinels; every part gets the Sentinel URL).",
        ),
    ] = "single",
    replicas: Annotated[
        int,
        typer.Option(
            "--replicas",
            min=1,
            max=MAX_REPLICAS,
            help="Replicas of the gateway, the remediation receiver and the exporter: "
            "Alertmanager notifies every receiver, Prometheus scrapes every replica, the load "
            "generator spreads over the gateways, one exporter runs the canaries (a lease).",
        ),
    ] = 1,
) -> None:
    """Start the local stack (every part detached) and print where everything is."""
    options = UpOptions(
        run_dir,
        spec,
        parse_ports(port),
        default_rate() if rate is None else rate,
        seed,
        prometheus_regions=regions,
        source=source,
        pods=pods,
        redis=redis,
        replicas=replicas,
    )
    try:
        with interrupt_on_signals() as guard:
            state = bring_up(options, guard)
    except StackError as exc:
        raise _fail(exc) from None
    print_urls(state)
    out.print(f"stop it with: redline down --run-dir {run_dir}", markup=False)


def down(run_dir: RunDirOpt = DEFAULT_RUN_DIR) -> None:
    """Stop every process `redline up` started from this run directory (by pid)."""
    try:
        outcomes = stop_stack(run_dir, _say)
    except StackError as exc:
        raise _fail(exc) from None
    stopped = sum(1 for o in outcomes.values() if o != "not running")
    out.print(f"stopped {stopped} of {len(outcomes)} parts", markup=False)


def status(
    run_dir: RunDirOpt = DEFAULT_RUN_DIR,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the state and each part's health as JSON.")
    ] = False,
) -> None:
    """Each part's process and health; exit 1 when one is down or unhealthy."""
    try:
        state = load_running(run_dir)
    except StackError as exc:
        raise _fail(exc) from None
    health = check_stack(state)
    healthy = all(item.healthy for item in health)
    if as_json:
        typer.echo(state_json(state, {item.name: vars(item) for item in health}))
        if not healthy:
            raise typer.Exit(1)
        return
    table = Table(title=f"redline stack in {state.run_dir}")
    for column in ("part", "pid", "state", "health", "detail"):
        table.add_column(column)
    for item in health:
        table.add_row(
            item.name,
            str(item.pid),
            "running" if item.alive else "[red]stopped[/red]",
            "[green]ok[/green]" if item.healthy else "[red]unhealthy[/red]",
            item.detail,
        )
    out.print(table, width=None if out.is_terminal else TABLE_WIDTH)
    if not healthy:
        raise typer.Exit(1)


def loadgen(
    config: Annotated[
        Path | None, typer.Option("--config", help="Load generator settings YAML.")
    ] = None,
    gateway_url: Annotated[
        str | None, typer.Option("--gateway-url", help="The gateway's base URL.")
    ] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Requests per second.")] = None,
) -> None:
    """Send realistic chat traffic through the gateway (or to an engine) until SIGTERM/Ctrl-C."""
    try:
        settings = load_settings(LoadgenSettings, config, gateway_url=gateway_url, rate=rate)
    except SettingsError as exc:
        raise _fail(exc) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await LoadGenerator(settings).run(stop)

    asyncio.run(main())


def register(app: typer.Typer) -> None:
    """Add `up`, `down`, `status`, `drill` and the hidden `loadgen` to the main CLI."""
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
    app.command("drill")(drill)
    app.command("loadgen", hidden=True)(loadgen)


DRILL_HELP = (
    f"Drill name(s): all ({', '.join(DRILL_ORDER)}), each of those, or a spot drill: "
    f"{', '.join(SPOT_DRILL_ORDER)}; or redis-failover (a stack started with --redis sentinel); "
    "or saturation (an engine stack: --source vllm, sglang, tgi or nim); or gpu-node-failure "
    "(cold against warm recovery of a GPU node, on a rig of its own beside the stack)."
)


def run_drills_live(
    state: StackState, names: list[str], artifact: Path | None, as_json: bool = False
) -> list[DrillResult]:
    """Run drills with a live board on stderr; print the table; write the JSON results."""
    spec = state.load_spec()
    wanted = resolve_names(names)
    board = DrillBoard(wanted)
    if err.is_terminal:
        with Live(board, console=err, refresh_per_second=4):
            results = run_drills(wanted, state, spec, board.progress, board.done)
    else:
        printed: set[str] = set()

        def plain(drill: str, message: str) -> None:
            board.progress(drill, message)
            key = f"{drill}:{message.split(' (')[0]}"
            if key not in printed:
                printed.add(key)
                err.print(f"[{drill}] {message}", markup=False)

        results = run_drills(wanted, state, spec, plain, board.done)
    text = render_json(results, {"run_dir": state.run_dir, "rate": state.rate})
    if as_json:
        typer.echo(text)
    else:
        out.print(build_report(results, out.width))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    write_json(state.layout().drills_dir / f"drills-{stamp}.json", text)
    if artifact is not None:
        write_json(artifact, text)
        err.print(f"drill results written to {artifact}", markup=False)
    for result in results:
        for check in result.checks:
            if not check.ok:
                err.print(f"{result.drill}: check failed: {check.name}: {check.detail}",
                          markup=False)  # fmt: skip
        if result.error:
            err.print(f"{result.drill}: {result.error}", markup=False)
    return results


def drill(
    names: Annotated[list[str], typer.Argument(help=DRILL_HELP, show_default=False)],
    run_dir: RunDirOpt = DEFAULT_RUN_DIR,
    json_out: Annotated[
        Path | None, typer.Option("--json-out", help="Also write the results JSON here.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the results as JSON instead of the table.")
    ] = False,
) -> None:
    """Inject a fault into the running stack and time detect, notify, remediate, recover."""
    try:
        resolve_names(names)
        state = load_running(run_dir)
    except (DrillError, StackError) as exc:
        raise _fail(exc) from None
    try:
        results = run_drills_live(state, names, json_out, as_json)
    except DrillError as exc:
        raise _fail(exc) from None
    if not all(result.ok for result in results):
        raise typer.Exit(1)


def run_demo(
    run_dir: Path,
    spec: Path | None,
    keep: bool,
    rate: float | None,
    regions: int | None = None,
    source: str | None = None,
) -> None:
    """Stack up (or reuse the one running there) -> every drill -> timings -> down (or URLs).

    Without `keep`, this process owns the stack it starts (`devstack.tether`): the stack stops
    when the demo ends, fails or is interrupted (Ctrl-C, SIGTERM, a closed terminal), and a
    demo killed outright is reaped by its tether within a second.
    """
    started_here = False
    try:
        state = load_running(run_dir)
        if state.status != "running" or not all(part_alive(p) for p in state.parts):
            raise StackError("not running")
        err.print(f"reusing the stack running in {run_dir}", markup=False)
    except StackError:
        if not keep:
            claim_ownership()
        try:
            with interrupt_on_signals() as guard:
                chosen = default_rate() if rate is None else rate
                options = UpOptions(
                    run_dir, spec, {}, chosen, prometheus_regions=regions, source=source
                )
                state = bring_up(options, guard)
        except StackError as exc:
            raise _fail(exc) from None
        started_here = True
    try:
        with interrupt_as_keyboard():
            results = run_drills_live(state, ["all"], DEFAULT_ARTIFACT)
    except KeyboardInterrupt as exc:
        if started_here and not keep:
            err.print(f"{exc or 'interrupted'}: stopping the stack", markup=False)
            shield_cleanup()
            down(run_dir)
        raise typer.Exit(130) from None
    if started_here and not keep:
        down(run_dir)
    else:
        print_urls(state)
        out.print(
            f"the stack keeps running; try `redline status --run-dir {run_dir}`, "
            f"`redline drill latency --run-dir {run_dir}`; stop it with "
            f"`redline down --run-dir {run_dir}`",
            markup=False,
        )
    if not all(result.ok for result in results):
        raise typer.Exit(1)
