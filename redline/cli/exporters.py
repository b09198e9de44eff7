"""`redline exporters` (the exporter process) and `redline snapshot ...` (the snapshot registry).

Thin: parses arguments, loads settings and the spec, calls `redline.exporters` and
`redline.platform.snapshots`. Registered on the main app by `register`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from redline.cli.common import err, fail, out, require_redis
from redline.core.settings import SettingsError
from redline.exporters.settings import ExporterSettings, load_exporter_settings
from redline.platform.snapshots import (
    Baselines,
    Snapshot,
    SnapshotError,
    SnapshotRegistry,
)
from redline.slo.load import SpecError, apply_profile, load_spec
from redline.slo.spec import Spec

snapshot_app = typer.Typer(
    name="snapshot",
    help="Model and LoRA-adapter snapshots: create, verify, list, activate, checkpoint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="Exporter settings YAML file.", show_default=False)
]
RootOpt = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help="Snapshot registry root (default: models.root of the exporter settings).",
        show_default=False,
    ),
]


def _settings(config: Path | None, **overrides: object) -> ExporterSettings:
    try:
        return load_exporter_settings(config, **overrides)
    except SettingsError as exc:
        raise fail(str(exc), 2) from None


def _spec(settings: ExporterSettings) -> Spec:
    try:
        loaded = load_spec(settings.spec)
        for finding in loaded.warnings:
            err.print(finding.render(loaded.source), markup=False)
        return apply_profile(loaded.spec, settings.profile)
    except SpecError as exc:
        raise fail("\n".join(exc.problems), 2) from None


def exporters(
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (default 9109).", show_default=False)
    ] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL.", show_default=False)] = None,
    spec: Annotated[
        Path | None, typer.Option(help="Spec YAML file (default: embedded).", show_default=False)
    ] = None,
    config: ConfigOpt = None,
    profile: Annotated[
        str | None, typer.Option(help="Timing profile of the spec.", show_default=False)
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level.", show_default=False)] = None,
) -> None:
    """Run the exporter process: probes on a scheduler, /metrics and /healthz over HTTP."""
    import uvicorn

    from redline.exporters.app import ProbeConfigError, build_exporter_app

    settings = _settings(
        config,
        host=host,
        port=port,
        redis_url=redis_url,
        spec=spec,
        profile=profile,
        log_level=log_level,
    )
    require_redis(settings.redis_url)
    the_spec = _spec(settings)
    level = settings.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet = max(logging.getLevelName(level), logging.WARNING)
    for chatty in ("apscheduler", "httpx", "httpcore"):  # a line per run or request otherwise
        logging.getLogger(chatty).setLevel(quiet)
    try:
        exporter = build_exporter_app(settings, the_spec)
    except ProbeConfigError as exc:
        # A bad golden-set file, token file or probe section: its message names what to fix.
        raise fail(str(exc), 2) from None
    names = ", ".join(sorted(exporter.cache.probes)) or "(none)"
    err.print(
        f"redline exporters on http://{settings.host}:{settings.listen_port}/metrics; "
        f"probes: {names}",
        markup=False,
    )
    uvicorn.run(
        exporter.app,
        host=settings.host,
        port=settings.listen_port,
        log_level=settings.log_level.lower(),
        access_log=False,
        lifespan="on",
    )


def _registry(root: Path | None, config: Path | None) -> SnapshotRegistry:
    if root is None:
        root = _settings(config).models.root
    return SnapshotRegistry(root)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _line(snapshot: Snapshot, active_id: str | None) -> str:
    marker = "*" if snapshot.snapshot_id == active_id else " "
    state = "verified" if snapshot.verified else "unverified"
    baselines = ""
    if snapshot.baselines is not None:
        baselines = (
            f" p99={snapshot.baselines.p99_seconds:g}s "
            f"accuracy={snapshot.baselines.accuracy_ratio:g}"
        )
    adapter = f" adapter={snapshot.adapter}" if snapshot.adapter else ""
    return (
        f"{marker} {snapshot.model} {snapshot.snapshot_id} version={snapshot.version}{adapter} "
        f"created={_when(snapshot.created_at)} {state}{baselines} "
        f"weights={snapshot.weights_sha256[:12]} config={snapshot.config_sha256[:12]}"
    )


@snapshot_app.command("create")
def snapshot_create(
    model: Annotated[str, typer.Argument(help="Served model name (the `model` label).")],
    version: Annotated[str, typer.Argument(help="Version (the `model_version` label).")],
    weights: Annotated[Path, typer.Option(help="Weights file or adapter directory.")],
    model_config: Annotated[Path, typer.Option(help="Model or adapter config file/dir.")],
    adapter: Annotated[str | None, typer.Option(help="LoRA adapter name.")] = None,
    activate: Annotated[bool, typer.Option(help="Make it the active snapshot.")] = False,
    root: RootOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Hash the weights and config and record a snapshot (same content: same snapshot)."""
    registry = _registry(root, config)
    try:
        snapshot = registry.create(model, version, weights, model_config, adapter=adapter)
        if activate:
            registry.activate(model, snapshot.snapshot_id)
    except SnapshotError as exc:
        raise fail(str(exc), 1) from None
    out.print(snapshot.snapshot_id, markup=False)


@snapshot_app.command("verify")
def snapshot_verify(
    model: Annotated[str, typer.Argument(help="Served model name.")],
    snapshot_id: Annotated[
        str | None, typer.Argument(help="Snapshot id (default: the active one).")
    ] = None,
    p99: Annotated[
        float | None, typer.Option(help="Baseline P99 (s): mark verified with it.")
    ] = None,
    accuracy: Annotated[
        float | None, typer.Option(help="Baseline golden-set accuracy (0..1).")
    ] = None,
    samples: Annotated[int | None, typer.Option(help="Requests behind the baselines.")] = None,
    reference_answers: Annotated[
        Path | None, typer.Option(help="JSON object: golden prompt id -> reference answer.")
    ] = None,
    root: RootOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Recompute the hashes (exit 1 on mismatch); with --p99 and --accuracy, mark verified."""
    registry = _registry(root, config)
    if (p99 is None) != (accuracy is None):
        raise fail("--p99 and --accuracy go together: both or neither", 2)
    try:
        if snapshot_id is None:
            active = registry.active(model)
            if active is None:
                raise fail(f"{model}: no active snapshot; name one", 1)
            snapshot = active
        else:
            snapshot = registry.get(model, snapshot_id)
        problems = registry.check(snapshot)
        if problems:
            raise fail("\n".join(f"{snapshot.snapshot_id}: {p}" for p in problems), 1)
        if p99 is not None and accuracy is not None:
            answers = _answers(reference_answers)
            baselines = Baselines(
                p99_seconds=p99, accuracy_ratio=accuracy, samples=samples, reference_answers=answers
            )
            snapshot = registry.mark_verified(model, snapshot.snapshot_id, baselines)
    except SnapshotError as exc:
        raise fail(str(exc), 1) from None
    except ValueError as exc:  # pydantic's ValidationError of the baselines
        raise fail(f"baselines: {exc}", 2) from None
    out.print(f"{snapshot.snapshot_id}: ok", markup=False)


def _answers(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise fail(f"{path}: cannot read reference answers: {exc}", 2) from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise fail(f"{path}: expected a JSON object of prompt id -> answer text", 2)
    return {str(k): v for k, v in data.items()}


@snapshot_app.command("list")
def snapshot_list(
    model: Annotated[str | None, typer.Argument(help="Model (default: every model).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    root: RootOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Snapshots newest first (`*` marks the active one); exit 1 if a file is unreadable."""
    registry = _registry(root, config)
    failed = False
    rows: list[dict[str, object]] = []
    for name in [model] if model else registry.models():
        snapshots, corrupt = registry.scan(name)
        errors: list[SnapshotError] = list(corrupt)
        try:
            pointer = registry.active_pointer(name)
        except SnapshotError as exc:
            errors.append(exc)
            pointer = None
        for error in errors:
            err.print(str(error), markup=False)
            failed = True
        active_id = pointer.snapshot_id if pointer else None
        for snapshot in snapshots:
            if as_json:
                rows.append(
                    {
                        **snapshot.model_dump(mode="json"),
                        "active": snapshot.snapshot_id == active_id,
                    }
                )
            else:
                out.print(_line(snapshot, active_id), markup=False)
    if as_json:
        out.print(json.dumps(rows, indent=2), markup=False)
    if failed:
        raise typer.Exit(1)


@snapshot_app.command("activate")
def snapshot_activate(
    model: Annotated[str, typer.Argument(help="Served model name.")],
    snapshot_id: Annotated[str, typer.Argument(help="Snapshot to serve.")],
    verify: Annotated[bool, typer.Option(help="Recompute hashes before switching.")] = True,
    root: RootOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Switch the model's active pointer atomically."""
    registry = _registry(root, config)
    try:
        pointer = registry.activate(model, snapshot_id, verify=verify)
    except SnapshotError as exc:
        raise fail(str(exc), 1) from None
    previous = pointer.previous_snapshot_id or "(none)"
    out.print(f"{model}: active {pointer.snapshot_id} (was {previous})", markup=False)


@snapshot_app.command("checkpoint")
def snapshot_checkpoint(
    adapter: Annotated[str, typer.Argument(help="LoRA adapter name.")],
    path: Annotated[Path | None, typer.Option(help="Where the checkpoint was saved.")] = None,
    root: RootOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Record a successful checkpoint of an adapter now (source of the checkpoint metric)."""
    registry = _registry(root, config)
    try:
        record = registry.record_checkpoint(adapter, path=path)
    except SnapshotError as exc:
        raise fail(str(exc), 1) from None
    out.print(f"{adapter}: checkpoint at {_when(record.last_success)}", markup=False)


def register(app: typer.Typer) -> None:
    """Add `exporters` and the `snapshot` group to the main CLI."""
    app.command("exporters")(exporters)
    app.add_typer(snapshot_app, name="snapshot")
