"""`redline index ...`: the vector index write path from the command line.

Thin: parses arguments, loads settings, calls `redline.platform.index`. `replicate` is the
long-running replicator process (it also trims the log); `replay`, `freeze`, `unfreeze`, `pause`,
`resume`, `status`, `trim`, `forget-target` and `write-demo` are one-shot commands for playbooks,
drills and operators. A collection the write path cannot use stops a command at start-up, with
the collection and the field named (exit 2).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import redis
import typer
from pymilvus import MilvusException

from redline.cli.common import err, fail, out
from redline.core.redisconn import open_redis
from redline.core.settings import SettingsError, load_settings, read_secret
from redline.platform.index import (
    DeltaLog,
    DeltaLogError,
    IndexConfig,
    IndexSchemaError,
    IndexSettings,
    IndexWriter,
    MilvusTarget,
    Replicator,
    VectorIndexError,
    decode_vector_id,
    format_vector_id,
    freeze_writes,
    replay_delta_log,
    trim_delta_log,
    unfreeze_writes,
)

index_app = typer.Typer(
    name="index",
    help="Vector index write path: replicator, delta-log replay, write freeze, status.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@dataclass
class _Index:
    settings: IndexSettings
    config: IndexConfig
    redis: redis.Redis
    log: DeltaLog
    primary: MilvusTarget
    replica: MilvusTarget


ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="Settings YAML file.", show_default=False)
]
RedisOpt = Annotated[
    str | None, typer.Option("--redis-url", help="Redis holding the delta log.", show_default=False)
]
CollectionOpt = Annotated[
    str | None, typer.Option("--collection", help="Logical collection.", show_default=False)
]
DimOpt = Annotated[int | None, typer.Option("--dim", help="Vector dimension.", show_default=False)]
PrimaryUriOpt = Annotated[
    str | None, typer.Option("--primary-uri", help="Milvus URI of the primary.", show_default=False)
]
ReplicaUriOpt = Annotated[
    str | None, typer.Option("--replica-uri", help="Milvus URI of the replica.", show_default=False)
]
PrimaryCollOpt = Annotated[
    str | None,
    typer.Option("--primary-collection", help="Primary collection name.", show_default=False),
]
ReplicaCollOpt = Annotated[
    str | None,
    typer.Option("--replica-collection", help="Replica collection name.", show_default=False),
]
ReplicaNameOpt = Annotated[
    str | None, typer.Option("--replica-name", help="Name of the replica.", show_default=False)
]
RegionOpt = Annotated[
    str | None, typer.Option("--region", help="Region this process writes as.", show_default=False)
]
BatchOpt = Annotated[
    int | None, typer.Option("--batch-size", help="Entries per batch.", show_default=False)
]
LeaseOpt = Annotated[
    float | None,
    typer.Option("--lease-ttl", help="Seconds an applier's lease lasts.", show_default=False),
]
RetentionOpt = Annotated[
    float | None,
    typer.Option(
        "--retention-seconds",
        help="History kept behind the slowest checkpoint when trimming.",
        show_default=False,
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option("--milvus-token-file", help="File holding the Milvus token.", show_default=False),
]


@contextmanager
def _open(
    config: Path | None, token_file: Path | None = None, redis_only: bool = False, **overrides: Any
) -> Iterator[_Index]:
    try:
        settings = load_settings(IndexSettings, config, **overrides)
        token = read_secret(token_file, settings.milvus_token, "milvus token")
        index = settings.collection_config(token.get_secret_value() if token else "")
    except (SettingsError, DeltaLogError) as exc:
        raise fail(str(exc), 2) from None
    if index.replication == "external" and not redis_only:
        raise fail(
            f"{index.collection} is replicated by something else (replication: external): "
            "redline's write path, replicator and replay do not apply to it",
            2,
        )
    client = open_redis(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    t = settings.milvus_timeout_seconds
    primary = MilvusTarget(index.primary, index.dim, t, index.metric_type)
    replica = MilvusTarget(index.replica, index.dim, t, index.metric_type)
    try:
        yield _Index(settings, index, client, DeltaLog(client, index.collection, index.dim),
                     primary, replica)  # fmt: skip
    except IndexSchemaError as exc:
        raise fail(f"{type(exc).__name__}: {exc}", 2) from None
    except (redis.RedisError, MilvusException, VectorIndexError, DeltaLogError) as exc:
        raise fail(f"{type(exc).__name__}: {exc}", 1) from None
    finally:
        primary.close()
        replica.close()
        client.close()


def _common(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _open_replica(
    config: Path | None, redis_url: str | None, collection: str | None, replica_name: str | None
) -> AbstractContextManager[_Index]:
    """Open the index for the Redis-only replica commands (`pause`, `resume`, `status`)."""
    overrides = _common(redis_url=redis_url, collection=collection, replica_name=replica_name)
    return _open(config, None, redis_only=True, **overrides)


@index_app.command()
def replicate(
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    dim: DimOpt = None,
    primary_uri: PrimaryUriOpt = None,
    replica_uri: ReplicaUriOpt = None,
    primary_collection: PrimaryCollOpt = None,
    replica_collection: ReplicaCollOpt = None,
    replica_name: ReplicaNameOpt = None,
    batch_size: BatchOpt = None,
    lease_ttl: LeaseOpt = None,
    retention: RetentionOpt = None,
    no_trim: Annotated[
        bool, typer.Option("--no-trim", help="Do not trim the delta log from this process.")
    ] = False,
    milvus_token_file: TokenFileOpt = None,
) -> None:
    """Run the replicator: apply the delta log to the replica (and trim it) until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    overrides = _common(
        redis_url=redis_url, collection=collection, dim=dim, primary_uri=primary_uri,
        replica_uri=replica_uri, primary_collection=primary_collection,
        replica_collection=replica_collection, replica_name=replica_name,
        batch_size=batch_size, lease_ttl_seconds=lease_ttl, retention_seconds=retention,
    )  # fmt: skip
    with _open(config, milvus_token_file, **overrides) as ix:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        _ensure(ix.replica, like=ix.primary)
        _check_same_rows(ix)
        ix.log.register_target(ix.replica.name)
        replicator = Replicator(
            ix.log,
            ix.replica,
            batch_size=ix.settings.batch_size,
            poll_interval_seconds=ix.settings.poll_interval_seconds,
            lease_ttl_seconds=ix.settings.lease_ttl_seconds,
            retention_seconds=None if no_trim else ix.settings.retention_seconds,
            trim_interval_seconds=ix.settings.trim_interval_seconds,
            trim_chunk=ix.settings.trim_chunk,
        )
        err.print(
            f"replicating {ix.config.collection} -> {ix.replica.name} "
            f"({ix.replica.spec.uri}, collection {ix.replica.collection})",
            markup=False,
        )
        replicator.run(stop)


def _ensure(target: MilvusTarget, attempts: int = 60, like: MilvusTarget | None = None) -> None:
    """Create/check the collection (created like `like` when given), retrying while Milvus
    starts; IndexSchemaError (no retry) when the write path cannot use it."""
    for attempt in range(attempts):
        try:
            target.ensure_collection(like=like)
            return
        except MilvusException as exc:
            if attempt == attempts - 1:
                raise
            err.print(f"waiting for Milvus at {target.spec.uri}: {exc}", markup=False)
            time.sleep(1.0)


def _check_same_rows(ix: _Index) -> None:
    """Refuse a replica that cannot hold the primary's rows (skipped while the primary is down:
    the replica must be replicated to precisely when the primary fails)."""
    try:
        primary = ix.primary.schema()
    except MilvusException as exc:
        err.print(f"primary not described ({exc}); replica schema not compared", markup=False)
        return
    problems = primary.differences(ix.replica.schema())
    if problems:
        raise IndexSchemaError(
            f"collection {ix.replica.collection} on {ix.replica.name} cannot hold the rows of "
            f"{ix.primary.collection} on {ix.primary.name}: {'; '.join(problems)}"
        )


@index_app.command()
def replay(
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    dim: DimOpt = None,
    replica_uri: ReplicaUriOpt = None,
    replica_collection: ReplicaCollOpt = None,
    replica_name: ReplicaNameOpt = None,
    batch_size: BatchOpt = None,
    lease_ttl: LeaseOpt = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Last stream id to apply (default: the newest now)."),
    ] = None,
    max_rows_per_second: Annotated[
        float | None, typer.Option("--max-rows-per-second", help="Throttle the replay.")
    ] = None,
    no_compact: Annotated[bool, typer.Option("--no-compact", help="Skip compaction.")] = False,
    milvus_token_file: TokenFileOpt = None,
) -> None:
    """Replay the delta log onto the replica, verify it, print a JSON report (exit 1: mismatch)."""
    overrides = _common(
        redis_url=redis_url, collection=collection, dim=dim, replica_uri=replica_uri,
        replica_collection=replica_collection, replica_name=replica_name,
        batch_size=batch_size, lease_ttl_seconds=lease_ttl,
    )  # fmt: skip
    with _open(config, milvus_token_file, **overrides) as ix:
        ix.replica.ensure_collection(like=ix.primary)
        ix.log.register_target(ix.replica.name)
        report = replay_delta_log(
            ix.log,
            ix.replica,
            batch_size=ix.settings.batch_size,
            until=until,
            lease_ttl_seconds=ix.settings.lease_ttl_seconds,
            max_rows_per_second=max_rows_per_second,
            compact=not no_compact,
        )
        out.print(json.dumps(report.summary()), markup=False)
        if not report.ok:
            raise typer.Exit(1)


@index_app.command()
def freeze(
    reason: Annotated[str, typer.Option("--reason", help="Why writes are frozen.")],
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
) -> None:
    """Freeze writes to the primary (they keep landing in the delta log)."""
    with _open(
        config, None, redis_only=True, **_common(redis_url=redis_url, collection=collection)
    ) as ix:
        state = freeze_writes(ix.log, ix.primary.name, reason)
        out.print(json.dumps(asdict(state)), markup=False)


@index_app.command()
def unfreeze(
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    dim: DimOpt = None,
    primary_uri: PrimaryUriOpt = None,
    primary_collection: PrimaryCollOpt = None,
    batch_size: BatchOpt = None,
    milvus_token_file: TokenFileOpt = None,
) -> None:
    """Apply the writes made while frozen to the primary, then let writes flow again."""
    overrides = _common(
        redis_url=redis_url, collection=collection, dim=dim, primary_uri=primary_uri,
        primary_collection=primary_collection, batch_size=batch_size,
    )  # fmt: skip
    with _open(config, milvus_token_file, **overrides) as ix:
        applied = unfreeze_writes(ix.log, ix.primary, batch_size=ix.settings.batch_size)
        out.print(json.dumps({"unfrozen": True, "applied_to_primary": applied}), markup=False)


@index_app.command()
def pause(
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    replica_name: ReplicaNameOpt = None,
) -> None:
    """Pause the replica's replicator (drills)."""
    with _open_replica(config, redis_url, collection, replica_name) as ix:
        ix.log.set_paused(ix.replica.name, True)


@index_app.command()
def resume(
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    replica_name: ReplicaNameOpt = None,
) -> None:
    """Resume the replica's replicator."""
    with _open_replica(config, redis_url, collection, replica_name) as ix:
        ix.log.set_paused(ix.replica.name, False)


@index_app.command()
def status(
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    replica_name: ReplicaNameOpt = None,
) -> None:
    """Print the delta log, freeze flag and replica checkpoint as JSON (Redis only)."""
    with _open_replica(config, redis_url, collection, replica_name) as ix:
        name = ix.replica.name
        state = ix.log.target_state(name)
        pending, oldest = ix.log.pending(name, state)
        frozen = ix.log.freeze_state()
        report = {
            "collection": ix.config.collection,
            "log": asdict(ix.log.info()),
            "frozen": asdict(frozen) if frozen else None,
            "replica": {
                "name": name,
                "paused": ix.log.is_paused(name),
                "pending_entries": pending,
                "oldest_pending_age_seconds": oldest,
                **asdict(state),
                "regions": sorted(state.regions),
            },
            "unfinished_replay": ix.log.replay_range(name),
            "targets": ix.log.targets(),
            "trimmed_at": ix.log.trimmed_point(),
            "memory_bytes": ix.log.memory_bytes(),
        }
        out.print(json.dumps(report), markup=False)


@index_app.command()
def trim(
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    retention: RetentionOpt = None,
    chunk: Annotated[
        int | None, typer.Option("--chunk", help="Entries per XTRIM call.", show_default=False)
    ] = None,
    pause_seconds: Annotated[
        float, typer.Option("--pause-seconds", help="Pause between two XTRIM calls.")
    ] = 0.0,
) -> None:
    """Trim the delta log at what every registered copy allows, prune tombstones (JSON report)."""
    overrides = _common(
        redis_url=redis_url, collection=collection, retention_seconds=retention, trim_chunk=chunk
    )
    with _open(config, None, redis_only=True, **overrides) as ix:
        report = trim_delta_log(
            ix.log, ix.settings.retention_seconds, ix.settings.trim_chunk, pause_seconds
        )
        out.print(json.dumps(report.summary()), markup=False)


@index_app.command("forget-target")
def forget_target(
    name: Annotated[str, typer.Argument(help="Target (replica) that is gone for good.")],
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
) -> None:
    """Stop keeping the delta log for a target that is gone (it must be rebuilt to return)."""
    with _open(
        config, None, redis_only=True, **_common(redis_url=redis_url, collection=collection)
    ) as ix:
        if not ix.log.forget_target(name):
            raise fail(f"{name} is not a registered target of {ix.config.collection}", 1)
        out.print(json.dumps({"forgotten": name}), markup=False)


@index_app.command("write-demo")
def write_demo(
    count: Annotated[int, typer.Option("--count", help="Rows to write.", min=1)] = 1000,
    rate: Annotated[
        float | None, typer.Option("--rate", help="Rows per second (default: as fast as it can).")
    ] = None,
    batch: Annotated[int, typer.Option("--batch", help="Rows per write call.", min=1)] = 100,
    prefix: Annotated[str, typer.Option("--prefix", help="Row id prefix.")] = "doc-",
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the vectors.")] = 0,
    config: ConfigOpt = None,
    redis_url: RedisOpt = None,
    collection: CollectionOpt = None,
    dim: DimOpt = None,
    primary_uri: PrimaryUriOpt = None,
    primary_collection: PrimaryCollOpt = None,
    region: RegionOpt = None,
    milvus_token_file: TokenFileOpt = None,
) -> None:
    """Write random vectors through the writer (demo load, drills); prints counts as JSON."""
    overrides = _common(
        redis_url=redis_url, collection=collection, dim=dim, primary_uri=primary_uri,
        primary_collection=primary_collection, region=region,
    )  # fmt: skip
    with _open(config, milvus_token_file, **overrides) as ix:
        _ensure(ix.primary)
        writer = IndexWriter(ix.log, ix.primary, ix.config.region)
        rng = np.random.default_rng(seed)
        started = time.monotonic()
        written = applied = 0
        while written < count:
            n = min(batch, count - written)
            vectors = rng.standard_normal((n, ix.config.dim)).astype(np.float32)
            rows = [(f"{prefix}{written + i}", vectors[i]) for i in range(n)]
            acks = writer.upsert_many(rows)
            written += n
            applied += sum(a.applied for a in acks)
            if rate:
                ahead = written / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        elapsed = time.monotonic() - started
        out.print(
            json.dumps(
                {
                    "written": written,
                    "applied_to_primary": applied,
                    "seconds": round(elapsed, 3),
                }
            ),
            markup=False,
        )


@index_app.command("new-id")
def new_id(
    count: Annotated[int, typer.Option("--count", help="Ids to print.", min=1)] = 1,
    config: ConfigOpt = None,
    region_code: Annotated[
        int | None, typer.Option("--region-code", help="Region code (0-63).", show_default=False)
    ] = None,
    node_id: Annotated[
        int | None, typer.Option("--node-id", help="Node id (0-63).", show_default=False)
    ] = None,
) -> None:
    """Print generated vector ids (time ms | region | node | sequence) with their parts, as JSON
    lines; no Redis or Milvus needed."""
    try:
        settings = load_settings(
            IndexSettings, config, **_common(region_code=region_code, node_id=node_id)
        )
    except SettingsError as exc:
        raise fail(str(exc), 2) from None
    generator = settings.id_generator()
    for _ in range(count):
        value = generator.next_id()
        parts = decode_vector_id(value)
        out.print(json.dumps({"id": value, "varchar": format_vector_id(value), **asdict(parts)}),
                  markup=False)  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add the `index` group to the main CLI."""
    app.add_typer(index_app, name="index")
