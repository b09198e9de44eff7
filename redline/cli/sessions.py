"""`redline sessions …`: run the session replica consumer or the CRDT sync between regions,
generate demo traffic (CDC or CRDT), show the RPO."""

from __future__ import annotations

import itertools
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from redline.core.settings import SettingsError, load_settings
from redline.platform.session_replica import ReplicaConsumer
from redline.platform.session_sync import (
    CrdtSessionStore,
    SessionSync,
    SessionSyncSettings,
)
from redline.platform.sessions import (
    REDIS_CONNECTION_ERRORS,
    CdcTargetError,
    SessionSettings,
    SessionStoreError,
    SessionWriter,
    measure_cdc_rpo,
    open_redis,
)
from redline.slo.load import SpecError, load_spec

sessions_app = typer.Typer(
    name="sessions",
    help="Session state with CDC: replica consumer, demo writer, RPO status.",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
log = logging.getLogger(__name__)


RedisUrlOpt = Annotated[str | None, typer.Option("--redis-url", help="Primary session store.")]
ReplicaUrlOpt = Annotated[str | None, typer.Option("--replica-url", help="Replica store.")]
StreamOpt = Annotated[str | None, typer.Option("--stream", help="CDC stream key.")]
GroupOpt = Annotated[str | None, typer.Option("--group", help="Replica consumer group.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Settings YAML file.")]
SpecOpt = Annotated[Path | None, typer.Option("--spec", help="Spec YAML; default: embedded.")]


S = TypeVar("S", SessionSettings, SessionSyncSettings)


def _load(cls: type[S], config: Path | None, **overrides: object) -> S:
    """Settings of `cls` (exit 2 naming the field when unusable), logging configured from them."""
    try:
        settings = load_settings(cls, config, **overrides)
    except SettingsError as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return settings


def _min_seconds(spec: Path | None) -> float:
    try:
        return float(load_spec(spec).spec.red_lines.context_keepalive.min_seconds)
    except SpecError as exc:
        for line in exc.problems:
            err.print(line, markup=False, highlight=False)
        raise typer.Exit(2) from None


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while the block runs; the old handlers come back after."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@sessions_app.command()
def replica(
    redis_url: RedisUrlOpt = None,
    replica_url: ReplicaUrlOpt = None,
    stream: StreamOpt = None,
    group: GroupOpt = None,
    consumer: Annotated[str | None, typer.Option("--consumer", help="Consumer name.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Apply the CDC stream to the replica until SIGTERM/Ctrl-C (ACK after each apply)."""
    s = _load(
        SessionSettings,
        config,
        redis_url=redis_url,
        replica_url=replica_url,
        session_stream=stream,
        session_group=group,
        session_consumer=consumer,
    )
    source = open_redis(s.redis_url, timeout_seconds=5.0)
    target = open_redis(s.replica_url, timeout_seconds=5.0)
    try:
        worker = ReplicaConsumer(
            source, target, s.session_stream, s.session_group, s.session_consumer
        )
        console.print(
            f"session replica: {s.session_stream} ({s.session_group}/{s.session_consumer}) "
            f"-> {s.replica_url}",
            markup=False,
            highlight=False,
        )
        with _stop_on_signals() as stop:
            worker.run(stop)
        console.print(
            f"session replica stopped: applied {worker.stats.applied}, acked {worker.stats.acked}",
            markup=False,
            highlight=False,
        )
    finally:
        source.close()
        target.close()


def _demo_traffic(
    store: SessionWriter, stop: threading.Event, sessions: int, rate: float, duration: float
) -> int:
    rng = random.Random(0)
    turns: dict[str, list[str]] = {}
    written = 0
    deadline = time.monotonic() + duration if duration else None
    for n in itertools.count():
        if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
            break
        session_id = f"demo-{n % sessions:04d}"
        history = turns.setdefault(session_id, [])
        history.append(f"turn {len(history) + 1}: {rng.choice(['hi', 'why?', 'go on'])}")
        del history[:-10]  # the context window keeps the last ten turns
        try:
            store.write(session_id, json.dumps({"turns": history}))
            written += 1
        except REDIS_CONNECTION_ERRORS as exc:
            log.warning("session write failed: %s", exc)
        stop.wait(1.0 / rate)
    return written


@sessions_app.command()
def writer(
    redis_url: RedisUrlOpt = None,
    stream: StreamOpt = None,
    sessions: Annotated[int, typer.Option(min=1, help="Distinct demo sessions.")] = 20,
    rate: Annotated[float, typer.Option(min=0.1, help="Writes per second.")] = 10.0,
    duration: Annotated[float, typer.Option(min=0, help="Seconds to run; 0: until Ctrl-C.")] = 0,
    ttl_seconds: Annotated[float | None, typer.Option(min=0.001, help="Context TTL.")] = None,
    config: ConfigOpt = None,
    spec: SpecOpt = None,
) -> None:
    """Generate demo session traffic: each write appends a turn to a session's context."""
    s = _load(
        SessionSettings,
        config,
        redis_url=redis_url,
        session_stream=stream,
        session_ttl_seconds=ttl_seconds,
    )
    retention = max(3600.0, 2 * _min_seconds(spec))
    client = open_redis(s.redis_url, timeout_seconds=5.0)
    try:
        store = SessionWriter(client, s.layout, s.session_ttl_seconds, retention)
        with _stop_on_signals() as stop:
            written = _demo_traffic(store, stop, sessions, rate, duration)
    finally:
        client.close()
    console.print(f"wrote {written} session updates", markup=False, highlight=False)


@sessions_app.command()
def status(
    redis_url: RedisUrlOpt = None,
    stream: StreamOpt = None,
    group: GroupOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Print the CDC RPO of a stream's group: exit 2 if missing, 1 if Redis is unreachable."""
    s = _load(
        SessionSettings, config, redis_url=redis_url, session_stream=stream, session_group=group
    )
    client = open_redis(s.redis_url)
    try:
        lag = measure_cdc_rpo(client, s.session_stream, s.session_group)
    except CdcTargetError as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    except (*REDIS_CONNECTION_ERRORS, SessionStoreError) as exc:
        err.print(f"{s.redis_url}: {type(exc).__name__}: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    finally:
        client.close()
    console.print(
        f"{lag.stream} {lag.group}: rpo {lag.rpo_seconds:.3f} s, pending {lag.pending}, "
        f"undelivered {lag.lag if lag.lag is not None else '?'}, "
        f"oldest pending {lag.oldest_pending_id or '-'}, "
        f"first undelivered {lag.first_undelivered_id or '-'}",
        markup=False,
        highlight=False,
    )


RegionOpt = Annotated[str | None, typer.Option("--region", help="This region (CRDT).")]


@sessions_app.command()
def sync(
    redis_url: Annotated[
        str | None, typer.Option("--redis-url", help="This region's session Redis.")
    ] = None,
    source_url: Annotated[
        str | None, typer.Option("--source-url", help="The other region's session Redis.")
    ] = None,
    region: RegionOpt = None,
    source_region: Annotated[
        str | None, typer.Option("--source-region", help="The region to merge from.")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Merge the other region's CRDT session deltas into this region until SIGTERM/Ctrl-C."""
    s = _load(
        SessionSyncSettings,
        config,
        redis_url=redis_url,
        source_url=source_url,
        region=region,
        source_region=source_region,
    )
    local = open_redis(s.redis_url, timeout_seconds=s.sync_timeout_seconds)
    remote = open_redis(s.source_url, timeout_seconds=s.sync_timeout_seconds)
    try:
        worker = SessionSync(
            CrdtSessionStore(remote, s.source_region, s.layout, s.crdt_ttl_seconds),
            CrdtSessionStore(local, s.region, s.layout, s.crdt_ttl_seconds),
            batch_size=s.sync_batch_size,
            block_ms=s.sync_block_ms,
            trim=s.sync_trim,
            session_delay_seconds=s.sync_session_delay_seconds,
        )
        console.print(
            f"session sync: {worker.name} from checkpoint {worker.checkpoint()}",
            markup=False,
            highlight=False,
        )
        with _stop_on_signals() as stop:
            worker.run(stop)
        st = worker.stats
        console.print(
            f"session sync {worker.name} stopped: {st.entries} deltas, {st.sessions} session "
            f"merges, {st.changed} elements changed",
            markup=False,
            highlight=False,
        )
    finally:
        local.close()
        remote.close()


def _crdt_traffic(
    store: CrdtSessionStore, stop: threading.Event, sessions: int, rate: float, duration: float
) -> int:
    rng = random.Random(store.region)
    written = 0
    deadline = time.monotonic() + duration if duration else None
    for n in itertools.count():
        if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
            break
        session_id = f"crdt-demo-{n % sessions:04d}"
        try:
            if n % 5 == 4:
                store.set_variable(session_id, "topic", rng.choice(["billing", "travel", "code"]))
            else:
                store.add_message(session_id, f"{store.region}-{n}", rng.choice(["hi", "why?"]))
            written += 1
        except REDIS_CONNECTION_ERRORS as exc:
            log.warning("session write failed: %s", exc)
        stop.wait(1.0 / rate)
    return written


@sessions_app.command("crdt-writer")
def crdt_writer(
    redis_url: RedisUrlOpt = None,
    region: RegionOpt = None,
    sessions: Annotated[int, typer.Option(min=1, help="Distinct demo sessions.")] = 20,
    rate: Annotated[float, typer.Option(min=0.1, help="Writes per second.")] = 10.0,
    duration: Annotated[float, typer.Option(min=0, help="Seconds to run; 0: until Ctrl-C.")] = 0,
    config: ConfigOpt = None,
) -> None:
    """Demo CRDT session traffic in one region: messages and a context variable per session."""
    s = _load(SessionSyncSettings, config, redis_url=redis_url, region=region)
    client = open_redis(s.redis_url, timeout_seconds=5.0)
    try:
        store = CrdtSessionStore(client, s.region, s.layout, s.crdt_ttl_seconds)
        with _stop_on_signals() as stop:
            written = _crdt_traffic(store, stop, sessions, rate, duration)
    finally:
        client.close()
    console.print(f"wrote {written} CRDT session operations", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `sessions` group to the main CLI."""
    app.add_typer(sessions_app, name="sessions")
