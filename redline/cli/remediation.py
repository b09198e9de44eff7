"""`redline remediation` (receiver + workers), `redline remediation worker`, `redline audit verify`.

Thin: parses options, loads settings (flags > `REDLINE_*` env > `--config` file > defaults) and
calls `redline.remediation`. Secrets come from `--token-file` or `REDLINE_WEBHOOK_TOKEN`.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import redis
import typer
import uvicorn
from rich.console import Console

from redline.cli.common import err, fail, out
from redline.core.settings import SettingsError, load_settings
from redline.remediation.app import build_receiver_app
from redline.remediation.audit import (
    AuditError,
    AuditLog,
    VerifyResult,
    compare_mirrors,
    read_file_records,
    verify_records,
)
from redline.remediation.catalog import load_registry
from redline.remediation.playbook import PlaybookRegistry, RegistryError
from redline.remediation.settings import DEFAULT_PORT, RemediationSettings
from redline.remediation.worker import start_workers
from redline.slo.load import SpecError, load_spec

remediation_app = typer.Typer(
    name="remediation",
    help="The Alertmanager webhook receiver and its remediation workers.",
    add_completion=False,
    pretty_exceptions_enable=False,
)
audit_app = typer.Typer(
    name="audit",
    help="The hash-chained audit trail of remediation jobs and steps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
HostOpt = Annotated[str | None, typer.Option("--host", help="Address to listen on.")]
PortOpt = Annotated[int | None, typer.Option("--port", help=f"Port (default {DEFAULT_PORT}).")]
RedisOpt = Annotated[str | None, typer.Option("--redis-url", help="Redis of the job store.")]
SpecOpt = Annotated[Path | None, typer.Option("--spec", help="Spec YAML (default: embedded).")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Settings YAML file.")]
TokenOpt = Annotated[
    Path | None, typer.Option("--token-file", help="File holding the webhook bearer token.")
]
WorkersOpt = Annotated[int | None, typer.Option("--workers", help="Worker threads to run.")]
PlaybooksOpt = Annotated[
    str | None, typer.Option("--playbooks", help="Registry factory, module:function.")
]
AuditFileOpt = Annotated[Path | None, typer.Option("--audit-file", help="JSONL audit mirror.")]
DryRunOpt = Annotated[
    bool | None, typer.Option("--dry-run/--no-dry-run", help="Plan only; change nothing.")
]


def register(app: typer.Typer) -> None:
    """Add the `remediation` and `audit` command groups to the main CLI."""
    app.add_typer(remediation_app, name="remediation")
    app.add_typer(audit_app, name="audit")


def _print(console_: Console, line: str) -> None:
    console_.print(line, markup=False, highlight=False)


def _settings(config: Path | None, **overrides: Any) -> RemediationSettings:
    try:
        return load_settings(RemediationSettings, config, **overrides)
    except SettingsError as exc:
        raise fail(str(exc)) from None


def _registry(settings: RemediationSettings) -> PlaybookRegistry:
    try:
        return load_registry(settings.playbooks, settings)
    except RegistryError as exc:
        raise fail(str(exc)) from None


def _spec_playbooks(value: Any) -> set[str]:
    # Every `playbook:` value anywhere in the spec (red lines, RPO targets, rollback gate).
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "playbook" and isinstance(item, str):
                found.add(item)
            else:
                found |= _spec_playbooks(item)
    elif isinstance(value, list | tuple):
        for item in value:
            found |= _spec_playbooks(item)
    return found


def _check_spec(settings: RemediationSettings, registry: PlaybookRegistry) -> None:
    try:
        loaded = load_spec(settings.spec)
    except SpecError as exc:
        raise fail("\n".join(exc.problems)) from None
    missing = sorted(_spec_playbooks(loaded.spec.model_dump()) - set(registry.names()))
    if missing:
        _print(
            err,
            f"{loaded.source}: warning: playbooks named by the spec but not registered "
            f"(their jobs will fail): {', '.join(missing)}",
        )


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _on_signals(stop: threading.Event) -> None:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


@remediation_app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    host: HostOpt = None,
    port: PortOpt = None,
    redis_url: RedisOpt = None,
    spec: SpecOpt = None,
    config: ConfigOpt = None,
    token_file: TokenOpt = None,
    workers: WorkersOpt = None,
    playbooks: PlaybooksOpt = None,
    audit_file: AuditFileOpt = None,
    dry_run: DryRunOpt = None,
) -> None:
    """Run the webhook receiver (POST /alerts) with `--workers` worker threads beside it."""
    if ctx.invoked_subcommand is not None:
        return
    settings = _settings(
        config, host=host, port=port, redis_url=redis_url, spec=spec, token_file=token_file,
        workers=workers, playbooks=playbooks, audit_file=audit_file, dry_run=dry_run,
    )  # fmt: skip
    _logging(settings.log_level)
    registry = _registry(settings)
    _check_spec(settings, registry)
    try:
        app = build_receiver_app(settings)
    except SettingsError as exc:
        raise fail(str(exc)) from None
    stop = threading.Event()
    # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown; with these handlers in
    # place that ends here (workers stopped and joined) instead of killing the process.
    _on_signals(stop)
    threads = start_workers(settings, registry, settings.workers, stop)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port or DEFAULT_PORT,
            log_level=settings.log_level.lower(),
            lifespan="on",
        )
    )
    try:
        server.run()
    finally:
        stop.set()
        for thread in threads:
            thread.join()


@remediation_app.command("worker")
def worker(
    redis_url: RedisOpt = None,
    config: ConfigOpt = None,
    workers: WorkersOpt = None,
    playbooks: PlaybooksOpt = None,
    audit_file: AuditFileOpt = None,
) -> None:
    """Run worker(s) only: more capacity beside the receiver, in another process or machine."""
    settings = _settings(
        config, redis_url=redis_url, workers=workers, playbooks=playbooks, audit_file=audit_file
    )
    _logging(settings.log_level)
    registry = _registry(settings)
    stop = threading.Event()
    _on_signals(stop)
    threads = start_workers(settings, registry, max(settings.workers, 1), stop)
    while any(thread.is_alive() for thread in threads):
        for thread in threads:
            thread.join(timeout=0.2)


@audit_app.callback()
def audit() -> None:
    """The hash-chained audit trail of remediation jobs and steps."""


@audit_app.command("verify")
def verify(
    redis_url: RedisOpt = None,
    file: Annotated[Path | None, typer.Option("--file", help="JSONL audit file.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Verify the chain: exit 0 when intact, 1 naming the first bad record, 2 when unreadable.

    With `--file` only, the file; with `--redis-url`, Redis; with both, both and that they
    match; with neither, Redis (and the audit file) of the settings.
    """
    settings = _settings(config, redis_url=redis_url, audit_file=file)
    use_redis = redis_url is not None or file is None
    results: list[VerifyResult] = []
    redis_result: VerifyResult | None = None
    if use_redis:
        client = redis.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_connect_timeout=2.0
        )
        try:
            redis_result = AuditLog(client, settings.key_prefix).verify()
        except (redis.RedisError, AuditError) as exc:
            raise fail(f"{settings.redis_url}: cannot read the audit trail: {exc}") from None
        finally:
            client.close()
        _print(out if redis_result.ok else err, redis_result.render("redis"))
        results.append(redis_result)
    audit_file = settings.audit_file
    if audit_file is not None:
        try:
            file_result = verify_records(read_file_records(audit_file))
        except OSError as exc:
            raise fail(f"{audit_file}: cannot read: {exc.strerror}") from None
        _print(out if file_result.ok else err, file_result.render(str(audit_file)))
        results.append(file_result)
        if redis_result is not None:
            both = compare_mirrors(redis_result, file_result, str(audit_file))
            if not both.ok and redis_result.ok and file_result.ok:
                _print(err, both.render(f"{audit_file} vs redis"))
                results.append(both)
    if not all(result.ok for result in results):
        raise typer.Exit(1)
