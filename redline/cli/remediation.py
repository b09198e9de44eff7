"""`redline remediation` (receiver + workers), `redline remediation worker`, `redline remediation
pause|resume|status`, `redline audit verify`.

Thin: parses options, loads settings (flags > `REDLINE_*` env > `--config` file > defaults) and
calls `redline.remediation`. Secrets come from `--token-file` or `REDLINE_WEBHOOK_TOKEN`. The
receiver and the worker refuse to start while the spec names a playbook no playbook class (built
in, `redline.playbooks` entry point, `playbook_classes`) or registry knows; the receiver with
workers and the worker also while an enabled playbook lacks a setting or its options do not
validate.
"""

from __future__ import annotations

import getpass
import logging
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import redis
import typer
import uvicorn
from rich.console import Console

from redline.cli.common import err, fail, out, require_redis
from redline.core.redisconn import open_redis
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
from redline.remediation.catalog import load_known_playbooks, load_registry
from redline.remediation.guards import GuardStore, Policies, check_startup, load_policies
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


def _policies(settings: RemediationSettings) -> Policies:
    try:
        return load_policies(settings.spec, settings.profile, settings.policies)
    except SettingsError as exc:
        raise fail(str(exc)) from None


def _check_startup(registry: PlaybookRegistry, policies: Policies) -> None:
    try:
        check_startup(registry, policies)
    except SettingsError as exc:
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


def _check_spec(
    settings: RemediationSettings, registry: PlaybookRegistry, *, warn_unregistered: bool
) -> None:
    """Refuse a spec naming a playbook no class or registry knows (naming the field); with
    `warn_unregistered`, warn of the known ones this registry lacks (their jobs will fail)."""
    try:
        loaded = load_spec(settings.spec, playbooks=load_known_playbooks(settings, registry))
    except RegistryError as exc:
        raise fail(str(exc)) from None
    except SpecError as exc:
        raise fail("\n".join(exc.problems)) from None
    if not warn_unregistered:
        return
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
    require_redis(settings.redis_url)
    registry = _registry(settings)
    _check_spec(settings, registry, warn_unregistered=True)
    policies = _policies(settings)
    try:
        token = None if settings.allow_unauthenticated else settings.resolve_token()
    except SettingsError as exc:
        raise fail(str(exc)) from None
    if settings.workers > 0:
        # A receiver without workers runs no playbook: its worker processes check theirs.
        _check_startup(registry, policies)
    app = build_receiver_app(settings, token=token, policies=policies, playbooks=registry.names())
    stop = threading.Event()
    # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown; with these handlers in
    # place that ends here (workers stopped and joined) instead of killing the process.
    _on_signals(stop)
    threads = start_workers(settings, registry, settings.workers, stop, policies)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port or DEFAULT_PORT,
            log_level=settings.log_level.lower(),
            # Above info the access lines are dropped anyway; not building them saves the hot
            # path a little at thousands of deliveries a second.
            access_log=settings.log_level.lower() in ("trace", "debug", "info"),
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
    require_redis(settings.redis_url)
    registry = _registry(settings)
    _check_spec(settings, registry, warn_unregistered=False)
    policies = _policies(settings)
    _check_startup(registry, policies)
    stop = threading.Event()
    _on_signals(stop)
    threads = start_workers(settings, registry, max(settings.workers, 1), stop, policies)
    while any(thread.is_alive() for thread in threads):
        for thread in threads:
            thread.join(timeout=0.2)


PlaybookArg = Annotated[
    str | None, typer.Argument(help="The playbook (default: every playbook).", show_default=False)
]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (kept in the audit trail).")]
ByOpt = Annotated[
    str | None, typer.Option("--by", help="Who (default: user@host), kept in the audit trail.")
]


def _who(by: str | None) -> str:
    return by or f"{getpass.getuser()}@{socket.gethostname()}"


def _guarded(
    config: Path | None, redis_url: str | None, playbooks: str | None, playbook: str | None
) -> tuple[RemediationSettings, redis.Redis, GuardStore]:
    settings = _settings(config, redis_url=redis_url, playbooks=playbooks)
    client = open_redis(
        settings.redis_url, decode_responses=True, socket_connect_timeout=2.0, socket_timeout=5.0
    )
    guards = GuardStore(client, settings.key_prefix)
    if playbook is not None:
        known = set(_registry(settings).names()) | set(_policies(settings).names())
        if playbook not in known:
            # A playbook the state names (paused, breaker open) can always be handed back.
            try:
                state = guards.snapshot()
            except redis.RedisError:
                state = None
            if state is None or playbook not in {*state.paused, *state.breakers_open}:
                client.close()
                raise fail(f"unknown playbook {playbook!r}; known: {', '.join(sorted(known))}")
    return settings, client, guards


GuardChange = Callable[[GuardStore, str], tuple[dict[str, Any], str]]
"""A change of the guard state by a human (who): the audit record's fields and the outcome."""


def _hand_over(
    verb: str,
    event: str,
    change: GuardChange,
    playbook: str | None,
    reason: str,
    by: str | None,
    *,
    config: Path | None,
    redis_url: str | None,
    playbooks: str | None,
) -> None:
    """`pause` and `resume`: change the guard state, record it in the audit trail as `event`
    with who and why, print the outcome; Redis or the audit trail failing exits 1."""
    settings, client, guards = _guarded(config, redis_url, playbooks, playbook)
    who, name = _who(by), playbook or "every playbook"
    try:
        fields, outcome = change(guards, who)
        audit = AuditLog(client, settings.key_prefix, settings.audit_file)
        audit.append(event, None, playbook=playbook or "*", by=who, reason=reason, **fields)
    except (redis.RedisError, AuditError) as exc:
        raise fail(f"{settings.redis_url}: cannot {verb} {name}: {exc}", 1) from None
    finally:
        client.close()
    _print(out, f"{name}: {outcome}; by {who}: {reason}")


@remediation_app.command("pause")
def pause(
    playbook: PlaybookArg = None,
    *,
    reason: ReasonOpt,
    by: ByOpt = None,
    redis_url: RedisOpt = None,
    config: ConfigOpt = None,
    playbooks: PlaybooksOpt = None,
) -> None:
    """Pause a playbook (or all) for a human to take over: its jobs are recorded and skipped."""

    def change(guards: GuardStore, who: str) -> tuple[dict[str, Any], str]:
        changed = guards.pause(playbook, who, reason)
        return {"already": not changed}, (
            "paused" if changed else "already paused (first pause kept)"
        )

    _hand_over("pause", "playbook.paused", change, playbook, reason, by,
               config=config, redis_url=redis_url, playbooks=playbooks)  # fmt: skip


@remediation_app.command("resume")
def resume(
    playbook: PlaybookArg = None,
    *,
    reason: ReasonOpt,
    by: ByOpt = None,
    redis_url: RedisOpt = None,
    config: ConfigOpt = None,
    playbooks: PlaybooksOpt = None,
) -> None:
    """Hand a playbook (or all) back: lift its pause and close its breaker."""

    def change(guards: GuardStore, who: str) -> tuple[dict[str, Any], str]:
        lifted, closed = guards.resume(playbook)
        parts = [f"pause lifted: {', '.join(lifted)}" if lifted else "was not paused"]
        if closed:
            parts.append(f"breaker closed: {', '.join(closed)}")
        fields = {"pauses_lifted": lifted, "breakers_closed": closed}
        return fields, f"resumed ({'; '.join(parts)})"

    _hand_over("resume", "playbook.resumed", change, playbook, reason, by,
               config=config, redis_url=redis_url, playbooks=playbooks)  # fmt: skip


@remediation_app.command("status")
def status(
    redis_url: RedisOpt = None, config: ConfigOpt = None, playbooks: PlaybooksOpt = None
) -> None:
    """Each playbook's mode, pause and breaker."""
    settings, client, guards = _guarded(config, redis_url, playbooks, None)
    policies = _policies(settings)
    try:
        snapshot = guards.snapshot()
    except redis.RedisError as exc:
        raise fail(f"{settings.redis_url}: cannot read the guard state: {exc}", 1) from None
    finally:
        client.close()
    names = sorted(
        {*_registry(settings).names(), *policies.names(), *snapshot.breakers_open}
        | (set(snapshot.paused) - {"*"})
    )
    for name in names:
        policy = policies.get(name)
        pause_record = snapshot.paused.get(name) or snapshot.paused.get("*")
        paused = f"paused by {pause_record.get('by')}" if pause_record else "-"
        opened = snapshot.breakers_open.get(name)
        breaker = f"OPEN since {opened.get('at')}" if opened else "closed"
        failures = snapshot.failures.get(name, 0)
        budget = f"{policy.budget.runs}/{policy.budget.per}" if policy.budget else "-"
        _print(
            out,
            f"{name:<20} mode={policy.mode:<6} paused={paused:<24} breaker={breaker} "
            f"(failures in a row {failures}/{policy.breaker.failures}) budget={budget}",
        )


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
        client = open_redis(settings.redis_url, decode_responses=True, socket_connect_timeout=2.0)
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
