"""`redline gateway`, `redline simulate upstream` and `redline simulate traces`: the
serving-side long-running commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from redline.cli.common import ConfigOpt, HostOpt, PortOpt, fail, serve
from redline.cli.spot import simulate_metadata
from redline.core.settings import SettingsError, load_settings
from redline.devstack.fakes.simulator import (
    DEFAULT_SIMULATOR_PORT,
    SimulatorError,
    SimulatorSettings,
    build_simulator_app,
)
from redline.gateway import (
    DEFAULT_GATEWAY_PORT,
    GatewayConfigError,
    GatewaySettings,
    build_gateway_app,
)
from redline.slo.load import SpecError, apply_profile, load_spec
from redline.slo.spec import Spec

simulate_app = typer.Typer(
    help="Simulated components for tests, the demo and the drills.", no_args_is_help=True
)


def _spec(path: Path | None, profile: str | None) -> Spec:
    try:
        loaded = load_spec(path)
        return apply_profile(loaded.spec, profile)
    except SpecError as exc:
        raise fail("\n".join(exc.problems)) from None


def parse_upstreams(values: list[str]) -> dict[str, str]:
    """`region=url` flags as an ordered mapping; typer.BadParameter on a malformed one."""
    upstreams: dict[str, str] = {}
    for value in values:
        region, sep, url = value.partition("=")
        if not sep or not region or not url:
            raise typer.BadParameter(f"{value!r}: expected REGION=URL", param_hint="--upstream")
        if region in upstreams:
            raise typer.BadParameter(f"region {region!r} given twice", param_hint="--upstream")
        upstreams[region] = url
    return upstreams


@simulate_app.command("upstream")
def simulate_upstream(
    region: Annotated[str | None, typer.Option("--region", help="Region served.")] = None,
    host: HostOpt = None,
    port: PortOpt = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the fault dice.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Serve an OpenAI-compatible upstream (vLLM-like, with fault knobs at /admin/faults)."""
    try:
        settings = load_settings(
            SimulatorSettings, config, region=region, host=host, port=port, seed=seed
        )
        app = build_simulator_app(settings)
    except (SettingsError, SimulatorError) as exc:
        raise fail(str(exc)) from None
    listen = settings.port or DEFAULT_SIMULATOR_PORT
    banner = f"upstream simulator for region {settings.region} on http://{settings.host}:{listen}"
    serve(app, settings, listen, banner)


def gateway(
    host: HostOpt = None,
    port: PortOpt = None,
    redis_url: Annotated[
        str | None, typer.Option("--redis-url", help="Redis of the routing store.")
    ] = None,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Spec YAML; the embedded default when omitted.")
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="Spec timing profile.")] = None,
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream", help="REGION=URL, repeated in failover order (first is primary)."
        ),
    ] = None,
    first_byte_budget: Annotated[
        float | None,
        typer.Option("--first-byte-budget", help="Seconds before rerouting a silent upstream."),
    ] = None,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            "--admin-token-file",
            help="File with the bearer token /admin requires (or env REDLINE_ADMIN_TOKEN).",
        ),
    ] = None,
    admin_open: Annotated[
        bool,
        typer.Option(
            "--admin-open",
            help="Serve /admin without a token (a warning; trusted networks and tests only).",
        ),
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Serve the OpenAI-compatible gateway with cross-region reroute and /metrics."""
    try:
        settings = load_settings(
            GatewaySettings,
            config,
            host=host,
            port=port,
            redis_url=redis_url,
            spec=spec,
            profile=profile,
            upstreams=parse_upstreams(upstream) if upstream else None,
            first_byte_budget_seconds=first_byte_budget,
            admin_token_file=admin_token_file,
            admin_open=admin_open or None,  # unset: the config file or env decides
        )
    except SettingsError as exc:
        raise fail(str(exc)) from None
    loaded = _spec(settings.spec, settings.profile)
    try:
        app = build_gateway_app(settings, loaded)
    except GatewayConfigError as exc:
        raise fail(str(exc)) from None
    listen = settings.port or DEFAULT_GATEWAY_PORT
    routes = ", ".join(f"{r}={u}" for r, u in settings.upstreams.items())
    banner = f"gateway on http://{settings.host}:{listen} (metrics at /metrics) -> {routes}"
    serve(app, settings, listen, banner)


@simulate_app.command("traces")
def simulate_traces(
    host: HostOpt = None,
    port: PortOpt = None,
    max_traces: Annotated[
        int | None, typer.Option("--max-traces", help="Traces kept (least recently written go).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Serve a trace backend: OTLP/HTTP at /v1/traces, spans read back at /api/traces/{id}."""
    # Imported here: protobuf and the OTLP messages are only needed by this command.
    from redline.devstack.tracestore import (
        DEFAULT_TRACE_STORE_PORT,
        TraceStoreSettings,
        banner,
        build_trace_store_app,
    )

    try:
        settings = load_settings(
            TraceStoreSettings, config, host=host, port=port, max_traces=max_traces
        )
    except SettingsError as exc:
        raise fail(str(exc)) from None
    listen = settings.port or DEFAULT_TRACE_STORE_PORT
    serve(build_trace_store_app(settings), settings, listen, banner(settings, listen))


simulate_app.command("metadata")(simulate_metadata)


def register(app: typer.Typer) -> None:
    """Add `gateway`, `simulate upstream`, `simulate traces` and `simulate metadata` to the
    `redline` app."""
    app.command("gateway")(gateway)
    app.add_typer(simulate_app, name="simulate")
