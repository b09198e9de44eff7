"""`redline spot-agent run|trigger|status` and `redline simulate metadata`: spot preemption.

Thin: parses options, builds the agent (`redline.agents.spot`) or the local metadata server
(`redline.devstack.fakes.metadata_server`), serves.
Exit codes: 0 ok; 1 the agent or node answered an error; 2 bad settings or arguments.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import httpx
import redis
import typer
from pydantic import SecretStr

from redline.agents.spot import DEFAULT_AGENT_PORT, SpotAgentSettings, build_agent_app
from redline.cli.common import ConfigOpt, HostOpt, PortOpt, err, fail, out, serve
from redline.core.settings import SettingsError, load_settings, read_secret
from redline.devstack.fakes.metadata_server import (
    DEFAULT_METADATA_PORT,
    MetadataSettings,
    build_metadata_app,
)
from redline.platform.spot import (
    DEFAULT_STATE_PREFIX,
    SpotAgentError,
    SpotError,
    SpotStateStore,
    scale_spot,
)
from redline.slo.load import SpecError, apply_profile, load_spec

spot_app = typer.Typer(
    help="Spot GPU preemption: notice -> drain -> triage -> replacement readiness.",
    no_args_is_help=True,
)


@spot_app.command("run")
def run(
    node: Annotated[
        str | None, typer.Option("--node", help="The node (its upstream's name).")
    ] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="aws, gcp or manual.")] = None,
    metadata_url: Annotated[
        str | None, typer.Option("--metadata-url", help="Instance metadata base URL.")
    ] = None,
    upstream_url: Annotated[
        str | None, typer.Option("--upstream-url", help="Where the replacement is checked.")
    ] = None,
    gateway: Annotated[
        list[str] | None, typer.Option("--gateway", help="Gateway base URL (repeatable).")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option("--redis-url", help="Redis of the routing and state stores.")
    ] = None,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Spec YAML (default: embedded).")
    ] = None,
    time_scale: Annotated[
        float | None, typer.Option("--time-scale", help="Scale the spec's spot durations.")
    ] = None,
    gateway_token_file: Annotated[
        Path | None,
        typer.Option(
            "--gateway-token-file",
            help="File with the gateways' admin token (or env REDLINE_GATEWAY_TOKEN).",
        ),
    ] = None,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            "--admin-token-file",
            help="File with the token POST /notice requires (or env REDLINE_ADMIN_TOKEN; "
            "default: the gateways' token).",
        ),
    ] = None,
    admin_open: Annotated[
        bool,
        typer.Option(
            "--admin-open",
            help="Serve POST /notice without a token (a warning; trusted networks and tests).",
        ),
    ] = False,
    host: HostOpt = None,
    port: PortOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Watch the node's notices and drain it: admission, triage, readiness of the replacement.

    On Kubernetes, the `kubernetes:` and `replacement:` blocks of --config taint the node, take
    its serving pods out of their Services and ask for a replacement at notice time."""
    try:
        settings = load_settings(
            SpotAgentSettings,
            config,
            node=node,
            provider=provider,
            metadata_url=metadata_url,
            upstream_url=upstream_url,
            gateway_urls=gateway or None,
            redis_url=redis_url,
            spec=spec,
            time_scale=time_scale,
            gateway_token_file=gateway_token_file,
            admin_token_file=admin_token_file,
            admin_open=admin_open or None,  # unset: the config file or env decides
            host=host,
            port=port,
        )
        loaded = apply_profile(load_spec(settings.spec).spec, settings.profile)
        spot = (
            loaded.spot
            if settings.time_scale == 1
            else scale_spot(loaded.spot, settings.time_scale)
        )
        app = build_agent_app(settings, spot)
    except (SettingsError, SpecError, SpotError) as exc:
        message = "\n".join(exc.problems) if isinstance(exc, SpecError) else str(exc)
        raise fail(message) from None
    listen = settings.port or DEFAULT_AGENT_PORT
    banner = (
        f"spot agent for node {settings.node} ({settings.provider}) on "
        f"http://{settings.host}:{listen}; budget aws {spot.drain_budget('aws'):g} s, "
        f"gcp {spot.drain_budget('gcp'):g} s"
    )
    if settings.kubernetes.enabled:
        banner += f"; kubernetes: taint {settings.kubernetes.taint_key}, pods not ready"
    if settings.replacement.kind != "none":
        banner += f"; replacement via {settings.replacement.kind} at notice time"
    serve(app, settings, listen, banner)


@spot_app.command("trigger")
def trigger(
    agent_url: Annotated[str, typer.Option("--agent-url", help="The agent's base URL.")],
    in_seconds: Annotated[
        float, typer.Option("--in-seconds", help="Seconds until the node goes away.")
    ] = 120.0,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")] = "manual trigger",
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file", help="File with the agent's bearer token (or env REDLINE_ADMIN_TOKEN)."
        ),
    ] = None,
) -> None:
    """Hand the agent a manual interruption notice (drills, tests, planned maintenance)."""
    env_token = os.environ.get("REDLINE_ADMIN_TOKEN")
    try:
        token = read_secret(token_file, SecretStr(env_token) if env_token else None, "token")
    except SettingsError as exc:
        raise fail(str(exc)) from None
    headers = {} if token is None else {"authorization": f"Bearer {token.get_secret_value()}"}
    try:
        response = httpx.post(
            f"{agent_url.rstrip('/')}/notice",
            json={"in_seconds": in_seconds, "reason": reason},
            headers=headers,
            timeout=10.0,
        )
    except httpx.HTTPError as exc:
        err.print(f"{agent_url}: {type(exc).__name__}: {exc}", markup=False)
        raise typer.Exit(1) from None
    if response.status_code != 200:
        err.print(f"{agent_url}: HTTP {response.status_code}: {response.text}", markup=False)
        raise typer.Exit(1)
    out.print(json.dumps(response.json()), markup=False)


@spot_app.command("status")
def status(
    node: Annotated[list[str], typer.Option("--node", help="Node to show (repeatable).")],
    redis_url: Annotated[
        str, typer.Option("--redis-url", help="Redis of the state store.")
    ] = "redis://127.0.0.1:6379/0",
    prefix: Annotated[str, typer.Option("--prefix", help="State key prefix.")] = (
        DEFAULT_STATE_PREFIX
    ),
) -> None:
    """Print the nodes' states and the times of their last preemption (JSON lines)."""
    store = SpotStateStore.from_url(redis_url, prefix)
    try:
        for name in node:
            record = store.get(name)
            line = {**record.to_fields(), "notice_to_draining": record.notice_to_draining}
            out.print(json.dumps(line, sort_keys=True), markup=False)
    except (redis.RedisError, SpotError) as exc:
        err.print(f"{redis_url}: {type(exc).__name__}: {exc}", markup=False)
        raise typer.Exit(1) from None
    finally:
        store.close()


def simulate_metadata(
    provider: Annotated[str | None, typer.Option("--provider", help="aws or gcp.")] = None,
    host: HostOpt = None,
    port: PortOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Serve a local AWS IMDSv2 or GCP metadata server with a spot notice knob (/admin)."""
    try:
        settings = load_settings(MetadataSettings, config, provider=provider, host=host, port=port)
    except SettingsError as exc:
        raise fail(str(exc)) from None
    listen = settings.port or DEFAULT_METADATA_PORT
    banner = f"{settings.provider} metadata server on http://{settings.host}:{listen}"
    serve(build_metadata_app(settings), settings, listen, banner)


def register(app: typer.Typer) -> None:
    """Add `spot-agent` to the `redline` app."""
    app.add_typer(spot_app, name="spot-agent")


__all__ = ["SpotAgentError", "register", "simulate_metadata", "spot_app"]
