"""`redline index ...`: the vector index write path from the command line.

Thin: parses arguments, loads settings, calls `redline.platform.index`. `replicate` is the
long-running replicator process (it also trims the log); `replay`, `freeze`, `unfreeze`, `pause`,
`resume`, `status`, `trim`, `forget-target` and `write-demo` are one-shot commands for playbooks,
drills and operators. A collection the write path cannot use stops a command at start-up, with
the collection and the field named (exit 2).

Two writing regions (docs/index.md): each region runs `write-demo --origin R` (or its own
writer) and `replicate --origin R --from OTHER`, which applies the other region's delta log to
R's copy — the wiring `Replicator(DeltaLog(..., origin=OTHER), <R's copy>)`. R's copy is the
primary settings' collection (`--primary-uri`, `--primary-collection`), named after R; both
regions' logs, the heads and the conflict map live in the one Redis (`--redis-url`).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import redis
import typer
from pymilvus import MilvusException

from redline.cli.common import err, fail, out, require_redis
from redline.core.redisconn import open_redis
from redline.core.settings import SettingsError, load_settings, read_secret
from redline.platform.index import (
    ConflictMap,
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
from redline.slo.load import SpecError, load_spec
from redline.slo.spec import RedisDurability

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
    origin: str | None = None
    """Two writing regions: this process's region; `log` is its own log (writers, trim) or the
    other region's (`replicate`), and `primary` and `replica` are both the region's copy."""
    source: str | None = None
    """Two writing regions: the region whose log `replicate` applies."""


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
OriginOpt = Annotated[
    str | None,
    typer.Option(
        "--origin",
        help="Two writing regions: the region this process works for (its log, its copy: the "
        "primary collection, named after the region).",
        show_default=False,
    ),
]
FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="Two writing regions: the other region, whose delta log is applied to the "
        "--origin region's copy.",
        show_default=False,
    ),
]
RegionsOpt = Annotated[
    str | None,
    typer.Option(
        "--regions",
        help="Two writing regions: every region of the collection, comma-separated (checks "
        "--origin and --from).",
        show_default=False,
    ),
]
HeadsRetentionOpt = Annotated[
    float | None,
    typer.Option(
        "--heads-retention-seconds",
        help="Two writing regions: the conflict window, and how long per-id heads are kept "
        "(default: --retention-seconds).",
        show_default=False,
    ),
]
TwoRegions = Literal["write", "replicate"]
"""What a two-region process does: write (its own log) or replicate (the other's log)."""


def _regions(value: str | None) -> tuple[str, ...] | None:
    """The `--regions` list, or None when not given."""
    if value is None:
        return None
    return tuple(r.strip() for r in value.split(",") if r.strip())


@contextmanager
def _open(
    config: Path | None,
    token_file: Path | None = None,
    redis_only: bool = False,
    two_regions: TwoRegions | None = None,
    **overrides: Any,
) -> Iterator[_Index]:
    try:
        settings = load_settings(IndexSettings, config, **overrides)
        regions = (
            settings.two_regions(two_regions == "replicate") if two_regions is not None else None
        )
        token = read_secret(token_file, settings.milvus_token, "milvus token")
        index = settings.collection_config(token.get_secret_value() if token else "")
        # An acknowledged write must survive the Redis primary's death when the spec says so.
        durability = load_spec(settings.spec).spec.redis
    except (SettingsError, DeltaLogError) as exc:
        raise fail(str(exc), 2) from None
    except SpecError as exc:
        raise fail("\n".join(exc.problems), 2) from None
    if regions is not None:
        log_origin = regions[1] if two_regions == "replicate" and regions[1] else regions[0]
        with _open_regions(settings, index, regions[0], regions[1], log_origin, durability) as ix:
            yield ix
        return
    if index.replication == "external" and not redis_only:
        raise fail(
            f"{index.collection} is replicated by something else (replication: external): "
            "redline's write path, replicator and replay do not apply to it",
            2,
        )
    # A Sentinel URL no sentinel answers, an unknown master: exit 2 naming the setting.
    require_redis(settings.redis_url)
    client = open_redis(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    t = settings.milvus_timeout_seconds
    primary = MilvusTarget(index.primary, index.dim, t, index.metric_type)
    replica = MilvusTarget(index.replica, index.dim, t, index.metric_type)
    try:
        deltalog = DeltaLog(
            client,
            index.collection,
            index.dim,
            min_replicas_ack=durability.min_replicas_ack,
            ack_timeout_ms=durability.ack_timeout_ms,
        )
        yield _Index(settings, index, client, deltalog, primary, replica)
    except IndexSchemaError as exc:
        raise fail(f"{type(exc).__name__}: {exc}", 2) from None
    except (redis.RedisError, MilvusException, VectorIndexError, DeltaLogError) as exc:
        raise fail(f"{type(exc).__name__}: {exc}", 1) from None
    finally:
        primary.close()
        replica.close()
        client.close()


@contextmanager
def _open_regions(
    settings: IndexSettings,
    index: IndexConfig,
    origin: str,
    source: str | None,
    log_origin: str,
    durability: RedisDurability,
) -> Iterator[_Index]:
    """The index of a two-region process: the log of `log_origin` (its own, or the region it
    replicates from) and `origin`'s copy — the primary settings' collection, named `origin`."""
    if index.replication == "external":
        raise fail(f"{index.collection} is replicated by something else (replication: external)")
    client = open_redis(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    copy = MilvusTarget(
        replace(index.primary, name=origin), index.dim, settings.milvus_timeout_seconds,
        index.metric_type,
    )  # fmt: skip
    try:
        deltalog = DeltaLog(
            client,
            index.collection,
            index.dim,
            origin=log_origin,
            min_replicas_ack=durability.min_replicas_ack,
            ack_timeout_ms=durability.ack_timeout_ms,
        )
        conflicts = ConflictMap(
            client, index.collection, settings.id_salt, settings.conflict_window_seconds()
        )
        try:
            conflicts.agree()  # before anything resolves: a mismatch would make copies diverge
        except DeltaLogError as exc:
            raise fail(str(exc), 2) from None
        yield _Index(settings, index, client, deltalog, copy, copy, origin, source)
    except IndexSchemaError as exc:
        raise fail(f"{type(exc).__name__}: {exc}", 2) from None
    except (redis.RedisError, MilvusException, VectorIndexError, DeltaLogError) as exc:
        raise fail(f"{type(exc).__name__}: {exc}", 1) from None
    finally:
        copy.close()
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
    origin: OriginOpt = None,
    source: FromOpt = None,
    regions: RegionsOpt = None,
    heads_retention: HeadsRetentionOpt = None,
) -> None:
    """Run the replicator: apply the delta log to the replica (and trim it) until SIGTERM/SIGINT.
    With --origin R --from OTHER: apply OTHER's log to R's copy (two writing regions)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    overrides = _common(
        redis_url=redis_url, collection=collection, dim=dim, primary_uri=primary_uri,
        replica_uri=replica_uri, primary_collection=primary_collection,
        replica_collection=replica_collection, replica_name=replica_name,
        batch_size=batch_size, lease_ttl_seconds=lease_ttl, retention_seconds=retention,
        origin=origin, replicate_from=source, regions=_regions(regions),
        heads_retention_seconds=heads_retention,
    )  # fmt: skip
    with _open(config, milvus_token_file, two_regions="replicate", **overrides) as ix:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if ix.origin is not None:
            given = [f for f, v in (("--replica-uri", replica_uri),
                                    ("--replica-collection", replica_collection),
                                    ("--replica-name", replica_name)) if v is not None]  # fmt: skip
            if given:
                raise fail(
                    f"{', '.join(given)} do not apply with --origin: the copy replicated into is "
                    f"{ix.origin}'s, --primary-uri/--primary-collection (named {ix.origin})"
                )
            _replicate_regions(ix, stop, no_trim)
            return
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


def _replicate_regions(ix: _Index, stop: threading.Event, no_trim: bool) -> None:
    """Apply the other region's log to this region's copy until `stop` (two writing regions)."""
    settings = ix.settings
    _ensure(ix.replica)
    ix.log.register_target(ix.replica.name)
    replicator = Replicator(
        ix.log,
        ix.replica,
        batch_size=settings.batch_size,
        poll_interval_seconds=settings.poll_interval_seconds,
        lease_ttl_seconds=settings.lease_ttl_seconds,
        retention_seconds=None if no_trim else settings.retention_seconds,
        trim_interval_seconds=settings.trim_interval_seconds,
        trim_chunk=settings.trim_chunk,
        salt=settings.id_salt,
        conflict_window_seconds=settings.conflict_window_seconds(),
    )
    if ix.log.info().length == 0:
        err.print(f"no writes from {ix.source} yet: waiting for its log", markup=False)
    err.print(
        f"replicating {ix.config.collection}: log of {ix.source} -> copy of {ix.origin} "
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
    origin: Annotated[
        str | None,
        typer.Option(
            "--origin",
            help="Two writing regions: trim this region's log, and prune the settled heads of "
            "the copies it is applied to.",
            show_default=False,
        ),
    ] = None,
    heads_retention: HeadsRetentionOpt = None,
) -> None:
    """Trim the delta log at what every registered copy allows, prune tombstones (JSON report);
    with --origin, one region's log and its copies' settled conflict heads."""
    overrides = _common(
        redis_url=redis_url, collection=collection, retention_seconds=retention, trim_chunk=chunk,
        origin=origin, heads_retention_seconds=heads_retention,
    )  # fmt: skip
    with _open(config, None, redis_only=True, two_regions="write", **overrides) as ix:
        settings = ix.settings
        conflicts = (
            ConflictMap(ix.redis, ix.config.collection, settings.id_salt,
                        settings.conflict_window_seconds())
            if ix.origin is not None
            else None
        )  # fmt: skip
        report = trim_delta_log(
            ix.log, settings.retention_seconds, settings.trim_chunk, pause_seconds,
            conflicts=conflicts,
        )  # fmt: skip
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
    origin: OriginOpt = None,
    regions: RegionsOpt = None,
    heads_retention: HeadsRetentionOpt = None,
) -> None:
    """Write random vectors through the writer (demo load, drills); prints counts as JSON.
    With --origin R: as region R of two writing regions (R's log, R's copy)."""
    overrides = _common(
        redis_url=redis_url, collection=collection, dim=dim, primary_uri=primary_uri,
        primary_collection=primary_collection, region=region, origin=origin,
        regions=_regions(regions), heads_retention_seconds=heads_retention,
    )  # fmt: skip
    with _open(config, milvus_token_file, two_regions="write", **overrides) as ix:
        if ix.origin is not None and region is not None and region != ix.origin:
            raise fail(
                f"--region {region} and --origin {ix.origin} differ: a region's writer writes "
                "its own log as its own region (leave --region out)"
            )
        _ensure(ix.primary)
        if ix.origin is not None:
            writer = IndexWriter(
                ix.log, ix.primary, ix.origin, ids=ix.settings.id_generator(),
                salt=ix.settings.id_salt,
                conflict_window_seconds=ix.settings.conflict_window_seconds(),
            )  # fmt: skip
        else:
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
