"""`redline prompts trace|verify`: the gateway's tamper-evident prompt log.

Reads the `prompt_log:` section of the gateway's settings (`--config`, REDLINE_* variables),
with `--directory`, `--redis-url` and `--key-prefix` winning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import redis
import typer

from redline.cli.common import ConfigOpt, err, fail, out
from redline.core.redisconn import open_redis
from redline.core.settings import SettingsError, load_settings
from redline.gateway.settings import GatewaySettings
from redline.platform.promptlog import PromptLog, PromptLogError

prompts_app = typer.Typer(
    name="prompts",
    help="The tamper-evident prompt log: trace a session with proofs, verify the log.",
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
    batches that changed, each record: exit 0 when intact, 1 naming where it is not."""
    log = _open(config, directory, redis_url, key_prefix)
    try:
        report = log.verify(deep=deep) if batch is None else log.verify_batch(batch)
    except (redis.RedisError, OSError, PromptLogError) as exc:
        raise fail(f"cannot read the prompt log: {exc}") from None
    if report.ok:
        out.print(
            f"ok: {report.batches} batches, {report.records} records verified "
            f"in {report.seconds * 1000:.0f} ms",
            markup=False,
        )
        return
    for problem in report.problems:
        err.print(problem.render(), markup=False)
    raise typer.Exit(1)
