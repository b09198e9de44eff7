"""`redline compose init`: write the compose stack's configuration and secrets for this machine."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from redline.cli.common import fail
from redline.generate.compose_config import (
    CONFIG_DIR,
    REDIS_TOPOLOGIES,
    SECRET_MODE,
    SECRETS,
    SECRETS_DIR,
    SECRETS_GID,
    ComposeConfigError,
    ComposeOptions,
    build_compose_config,
)
from redline.slo.load import SpecError, default_spec_text, load_spec

compose_app = typer.Typer(
    name="compose",
    help="The Docker compose stack: write its configuration from the spec.",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)


def _pairs(values: list[str], flag: str) -> dict[str, list[str]]:
    """`KEY=VALUE` flags (repeatable) -> key -> values, with a clear error on a bad one."""
    pairs: dict[str, list[str]] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise fail(f"{flag} {value!r}: expected REGION=URL")
        pairs.setdefault(key, []).append(rest)
    return pairs


def write_config(directory: Path, files: dict[str, str]) -> list[Path]:
    """Write the config files (0644) under `directory/config`; return what was written."""
    written = []
    for name, text in files.items():
        path = (directory / CONFIG_DIR / name).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, "utf-8")
        os.chmod(tmp, 0o644)  # mounted read-only into containers running as another user
        os.replace(tmp, path)
        written.append(path)
    return written


def write_secrets(directory: Path, rotate: bool) -> tuple[list[Path], list[Path]]:
    """Create each missing secret with a random token, readable by its owner and the
    containers' group only; `rotate` replaces existing ones. Returns (created, not regrouped)."""
    created, ungrouped = [], []
    folder = directory / SECRETS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name in SECRETS:
        path = folder / name
        if path.exists() and not rotate:
            continue
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.chown(tmp, -1, SECRETS_GID)
            os.chmod(tmp, SECRET_MODE)
        except PermissionError:
            ungrouped.append(path)  # stays 0600: the user is told how to share it
        os.replace(tmp, path)
        created.append(path)
    return created, ungrouped


@compose_app.command("init")
def init(
    directory: Annotated[
        Path, typer.Option("--dir", help="The compose folder (holds docker-compose.yml).")
    ] = Path("compose"),
    spec_path: Annotated[
        Path | None, typer.Option("--spec", help="Spec YAML; default: the embedded one.")
    ] = None,
    demo: Annotated[
        bool, typer.Option("--demo", help="Simulated upstreams, demo writers and Milvus.")
    ] = False,
    upstream: Annotated[
        list[str] | None,
        typer.Option("--upstream", help="REGION=URL of a region's OpenAI-compatible upstream."),
    ] = None,
    pod: Annotated[
        list[str] | None,
        typer.Option("--pod", help="REGION=URL of one pod (repeat): rollback on every pod."),
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model the probes ask.")] = None,
    milvus_primary: Annotated[
        str | None, typer.Option("--milvus-primary", help="Milvus URI of the primary index.")
    ] = None,
    milvus_replica: Annotated[
        str | None, typer.Option("--milvus-replica", help="Milvus URI of the replica index.")
    ] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", help="The index's logical collection.")
    ] = None,
    dim: Annotated[int | None, typer.Option("--dim", min=1, help="Vector dimension.")] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="Spec timing profile (--demo: local when the spec has it)."),
    ] = None,
    rotate_secrets: Annotated[
        bool, typer.Option("--rotate-secrets", help="Replace existing tokens with new ones.")
    ] = False,
    redis: Annotated[
        str,
        typer.Option(
            "--redis",
            help="Redis topology: single (one `redis`) or sentinel (+ a replica and three "
            "Sentinels, the `ha` profile; every service connects through the Sentinels).",
        ),
    ] = "single",
) -> None:
    """Write compose/config/ from the spec, compose/.env, and random tokens in compose/secrets/."""
    if not (directory / "docker-compose.yml").is_file():
        raise fail(f"--dir {directory}: no docker-compose.yml there (the repo's compose/ folder)")
    if redis not in REDIS_TOPOLOGIES:
        raise fail(f"--redis {redis!r}: expected one of {', '.join(REDIS_TOPOLOGIES)}")
    try:
        loaded = load_spec(spec_path)
    except SpecError as exc:
        raise fail("\n".join(exc.problems)) from None
    spec_text = spec_path.read_text("utf-8") if spec_path is not None else default_spec_text()
    if profile is None and demo and "local" in loaded.spec.profiles:
        profile = "local"
    defaults = ComposeOptions()
    options = ComposeOptions(
        demo=demo,
        upstreams={k: v[-1] for k, v in _pairs(upstream or [], "--upstream").items()},
        pods=_pairs(pod or [], "--pod"),
        model=model,
        milvus_primary_uri=milvus_primary or defaults.milvus_primary_uri,
        milvus_replica_uri=milvus_replica or defaults.milvus_replica_uri,
        collection=collection or defaults.collection,
        dim=dim or defaults.dim,
        profile=profile,
        redis="sentinel" if redis == "sentinel" else "single",
    )
    try:
        files = build_compose_config(loaded.spec, spec_text, options)
    except (ComposeConfigError, SpecError) as exc:
        raise fail(str(exc)) from None
    written = write_config(directory, files)
    created, ungrouped = write_secrets(directory, rotate_secrets)
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False)
    for path in created:
        mode = "0600" if path in ungrouped else f"{SECRET_MODE:04o}, group {SECRETS_GID}"
        console.print(f"created {path} ({mode})", markup=False, highlight=False)
    if ungrouped:
        paths = " ".join(str(p) for p in ungrouped)
        console.print(
            f"the containers read the tokens as group {SECRETS_GID}; share them with: "
            f"sudo chgrp {SECRETS_GID} {paths} && sudo chmod {SECRET_MODE:o} {paths}",
            markup=False,
            highlight=False,
        )
    if options.redis == "sentinel" and loaded.spec.redis.min_replicas_ack == 0:
        console.print(
            "note: the spec's redis.min_replicas_ack is 0: a write acknowledged just before a "
            "failover can be lost; set it to 1 so jobs, audit records and index writes wait "
            "for the replica (docs/redis.md)",
            markup=False,
            highlight=False,
        )
    profiles = ",".join(options.compose_profiles) or "(none)"
    console.print(
        f"profiles: {profiles}; timing: {profile or 'as the spec says'}. Next: "
        f"docker compose -f {directory / 'docker-compose.yml'} up -d",
        markup=False,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Add the `compose` group to the top-level app."""
    app.add_typer(compose_app)
