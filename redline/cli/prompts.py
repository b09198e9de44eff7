"""`redline prompts trace|verify|watch`: the gateway's tamper-evident prompt log.

Reads the `prompt_log:` section of the gateway's settings (`--config`, REDLINE_* variables),
with `--directory`, `--redis-url` and `--key-prefix` winning.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated

import redis
import typer

from redline.cli.common import ConfigOpt, err, fail, out
from redline.core.redisconn import open_redis
from redline.core.settings import SettingsError, load_settings
from redline.gateway.settings import GatewaySettings
from redline.platform.promptlog import PromptLog, PromptLogError, VerifyReport
from redline.platform.promptlog.watch import Detection, PromptLogWatcher, WatchError

prompts_app = typer.Typer(
    name="prompts",
    help="The tamper-evident prompt log: trace a session with proofs, verify or watch the log.",
    no_args_is_help=True,
)

DirOpt = Annotated[Path | None, typer.Option("--directory", help="The log's directory.")]
RedisOpt = Annotated[
    str | None, typer.Option("--redis-url", help="Redis of the anchors and the index.")
]
PrefixOpt = Annotated[str | None, typer.Option("--key-prefix", help="Redis key prefix.")]


def register(app: typer.Typer) -> None:
    """Add the `prompts` command group to the main CLI."""
    app.add_typer(prompts_app, name="prompts")


def _open(
    config: Path | None, directory: Path | None, redis_url: str | None, prefix: str | None
) -> PromptLog:
    try:
        settings = load_settings(GatewaySettings, config)
    except SettingsError as exc:
        raise fail(str(exc)) from None
    section = settings.prompt_log
    client = open_redis(
        redis_url or section.redis_url or settings.redis_url, socket_connect_timeout=2.0
    )
    return PromptLog(client, directory or section.directory, prefix or section.key_prefix)


@prompts_app.command("trace")
def trace(
    session: Annotated[str, typer.Argument(help="The session id.")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON: records, proofs, roots.")] = False,
    directory: DirOpt = None,
    redis_url: RedisOpt = None,
    key_prefix: PrefixOpt = None,
    config: ConfigOpt = None,
) -> None:
    """A session's records from the index, each checked with its inclusion proof against the
    anchored root: exit 0 when all verify, 1 when one does not, 2 when the log is unreadable."""
    log = _open(config, directory, redis_url, key_prefix)
    try:
        found = log.trace(session)
    except (redis.RedisError, OSError, PromptLogError) as exc:
        raise fail(f"cannot read the prompt log: {exc}") from None
    if as_json:
        document = {
            "session": session,
            "verified": found.ok,
            "records": [r.as_dict() for r in found.records],
        }
        out.print_json(json.dumps(document))
    else:
        out.print(f"session {session}: {len(found.records)} records", markup=False)
        for r in found.records:
            mark = "ok" if r.ok else f"NOT VERIFIED: {r.problem}"
            text = r.record
            out.print(
                f"  batch {r.batch} leaf {r.leaf} {text.get('ts', '?')} "
                f"request {text.get('request', '?')}: {mark}",
                markup=False,
            )
            out.print(f"    prompt: {text.get('prompt')}", markup=False)
            out.print(f"    answer: {text.get('answer')}", markup=False)
    if not found.ok:
        raise typer.Exit(1)


@prompts_app.command("verify")
def verify(
    batch: Annotated[
        int | None, typer.Option("--batch", help="Check only this batch (the targeted check).")
    ] = None,
    deep: Annotated[bool, typer.Option("--deep", help="Recompute every Merkle root.")] = False,
    directory: DirOpt = None,
    redis_url: RedisOpt = None,
    key_prefix: PrefixOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Verify the chain of roots (Redis and roots.jsonl), the sealed records and, for the
    batches that changed, each record: exit 0 when intact, 1 naming where it is not (one line
    per problem: copy, batch, leaf, what happened), 2 when the log cannot be read."""
    log = _open(config, directory, redis_url, key_prefix)
    try:
        report = log.verify(deep=deep) if batch is None else log.verify_batch(batch)
    except (redis.RedisError, OSError, PromptLogError) as exc:
        raise fail(f"cannot read the prompt log: {exc}") from None
    if report.ok:
        out.print(f"ok: {_checked(report)}", markup=False)
        return
    _tampered(report)
    raise typer.Exit(1)


def _checked(report: VerifyReport) -> str:
    return (
        f"{report.batches} batches, {report.records} records verified "
        f"in {report.seconds * 1000:.0f} ms"
    )


def _tampered(report: VerifyReport) -> None:
    batches = sorted({p.batch for p in report.problems if p.batch is not None})
    where = f" in batches {', '.join(map(str, batches))}" if batches else ""
    err.print(
        f"TAMPERED: {len(report.problems)} problems{where} ({_checked(report)}):", markup=False
    )
    for problem in report.problems:
        err.print(f"  {problem.render()}", markup=False)


@prompts_app.command("watch")
def watch(
    poll_seconds: Annotated[
        float, typer.Option("--poll-seconds", min=0.01, help="Stat the files every so often.")
    ] = 1.0,
    sweep_seconds: Annotated[
        float, typer.Option("--sweep-seconds", min=1.0, help="Full verify every so often.")
    ] = 300.0,
    grace_seconds: Annotated[
        float,
        typer.Option("--grace-seconds", min=0.0, help="Longest bytes may wait to be anchored."),
    ] = 5.0,
    exit_on_tamper: Annotated[
        bool, typer.Option("--exit-on-tamper", help="Stop at the first detection.")
    ] = False,
    max_seconds: Annotated[
        float | None, typer.Option("--max-seconds", min=0.0, help="Stop after this long.")
    ] = None,
    configure_redis: Annotated[
        bool,
        typer.Option(
            "--configure-redis/--no-configure-redis",
            help="Add the keyspace notifications it needs to Redis' notify-keyspace-events.",
        ),
    ] = True,
    directory: DirOpt = None,
    redis_url: RedisOpt = None,
    key_prefix: PrefixOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Verify the log, then watch it: every change the files' events or Redis' keyspace
    notifications name is checked at once (the segment, the tree or the roots that changed),
    with a poll and a periodic full verify behind them. Each problem is printed as it is
    found; exit 1 when anything was found, 0 when not, 2 when the log cannot be read."""
    log = _open(config, directory, redis_url, key_prefix)
    stop = threading.Event()

    def detected(detection: Detection) -> None:
        for line in detection.render():
            err.print(f"TAMPERED: {line}", markup=False)
        if exit_on_tamper:
            stop.set()

    watcher = PromptLogWatcher(
        log,
        detected,
        poll_seconds=poll_seconds,
        sweep_seconds=sweep_seconds,
        grace_seconds=grace_seconds,
        configure_redis=configure_redis,
    )
    try:
        baseline = watcher.start()
    except WatchError as exc:
        raise fail(str(exc)) from None
    try:
        state = "ok" if baseline.ok else "TAMPERED"
        out.print(
            f"watching {log.directory}: baseline {state}, {_checked(baseline)}; file events "
            f"{'inotify' if watcher.inotify else 'polled'}, roots "
            f"{'keyspace notifications' if watcher.notifications else 'polled'}",
            markup=False,
        )
        if not (exit_on_tamper and watcher.detections):
            stop.wait(max_seconds)
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
    if watcher.detections:
        raise typer.Exit(1)
