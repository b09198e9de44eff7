"""The exporter process: probes on a scheduler, `/metrics` and `/healthz` over HTTP.

Each probe runs on its own interval in a daemon thread of its own (apscheduler 3.x,
`max_instances=1`, `coalesce=True`, first run at start-up). `/metrics` only reads the
`ProbeCache`, so a slow or hanging probe never blocks or slows a scrape; a probe still running past
its timeout reports `redline_probe_success 0`, and a probe that raises does the same while the
process stays up. Daemon threads let the process exit on SIGTERM even while a probe hangs.

`POST /v1/evaluations` (`redline.exporters.evaluations`) takes accuracy verdicts from the user's
own evaluator. They and the golden-set probes' answers go to one `EvalTally`, registered beside
the cache and read at every scrape, labelled with the snapshot registry's active versions
(`ActiveVersions` over `models.root`, the registry the model-versions probe reads).

Probes that write canaries (`writes_canaries`) run on one exporter replica only: the holder of
the canary lease in Redis (`canary_lease`, `redline.platform.lease`). The others skip them and
publish none of their series, and every replica publishes `redline_exporter_canary_lease_held`;
when the holder dies another takes over within the lease TTL plus one renewal interval (at
once when the holder stops cleanly: it releases the lease).

No `_created` series are exposed unless `created_series`: building the app sets
prometheus-client's process-wide switch for them (`redline.core.created`).
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from apscheduler.executors.base import BaseExecutor, run_job
from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from redline.core.created import apply_created_series
from redline.core.redisconn import open_redis
from redline.core.settings import SettingsError, read_secret
from redline.exporters.canary_file import CanaryFileError
from redline.exporters.consistency import build_consistency_probes
from redline.exporters.drift import (
    DriftProbe,
    NpyReference,
    RedisStreamWindow,
    build_drift_probe,
)
from redline.exporters.drift_stats import DriftError
from redline.exporters.evaluations import (
    EVAL_METRICS,
    EvalTally,
    EvaluationConfigError,
    build_evaluations_router,
)
from redline.exporters.index_consistency import IndexConsistencyProbe
from redline.exporters.index_staleness import IndexStalenessProbe
from redline.exporters.keepalive import KeepaliveProbe
from redline.exporters.llm_probes import build_llm_probes
from redline.exporters.models import ModelVersionsProbe
from redline.exporters.mutation import build_mutation_probes
from redline.exporters.probe import Probe, ProbeCache, writes_canaries
from redline.exporters.session_crdt import SessionCrdtProbe
from redline.exporters.session_rpo import SessionRpoProbe
from redline.exporters.settings import ExporterSettings
from redline.platform.golden import GoldenSetError
from redline.platform.index import DeltaLogError
from redline.platform.lease import LeaseKeeper, RedisLease, default_owner
from redline.platform.snapshots import ActiveVersions, SnapshotRegistry
from redline.slo import catalog
from redline.slo.spec import RedisDurability, Spec

log = logging.getLogger(__name__)


class DaemonThreadExecutor(BaseExecutor):  # type: ignore[misc]
    """Runs every job in a fresh daemon thread; with max_instances=1 that is one per probe.

    A pool would let one hanging probe starve the others, and its non-daemon workers would keep a
    stopped process alive until the hang ends.
    """

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        def target() -> None:
            try:
                events = run_job(job, job._jobstore_alias, run_times, self._logger.name)
            except BaseException as exc:  # reported to the scheduler like a pool executor does
                self._run_job_error(job.id, exc, exc.__traceback__)
            else:
                self._run_job_success(job.id, events)

        thread = threading.Thread(target=target, name=f"probe-{job.id}", daemon=True)
        thread.start()


@dataclass(frozen=True)
class Shared:
    """What several probes and the evaluations endpoint share: one registry, versions, tally."""

    snapshots: SnapshotRegistry
    versions: ActiveVersions
    tally: EvalTally

    @classmethod
    def from_settings(cls, settings: ExporterSettings) -> Shared:
        """The registry at `models.root`, its cached active versions and an empty tally."""
        snapshots = SnapshotRegistry(settings.models.root)
        versions = ActiveVersions(snapshots, settings.models.version_ttl_seconds)
        return cls(snapshots, versions, EvalTally())


@dataclass
class Exporter:
    """An exporter ready to serve: the ASGI app, its scheduler, cache and registry."""

    app: FastAPI
    scheduler: BackgroundScheduler
    cache: ProbeCache
    registry: CollectorRegistry
    probes: list[Probe] = field(default_factory=list)
    shared: Shared | None = None
    lease: LeaseKeeper | None = None
    """The canary lease (None: every probe runs here, as with a single exporter)."""

    def start(self) -> None:
        """Try the canary lease, schedule every probe (first run now), start the scheduler."""
        if self.scheduler.running:
            return
        if self.lease is not None:
            self.lease.start()
        now = datetime.now(UTC)
        for probe in self.probes:
            self.scheduler.add_job(
                self.cache.run,
                "interval",
                seconds=probe.interval_seconds,
                args=[probe.name],
                id=probe.name,
                name=f"probe {probe.name}",
                next_run_time=now,
                replace_existing=True,
            )
        self.scheduler.start()
        log.info("exporter started %d probe(s): %s", len(self.probes), list(self.cache.probes))

    def stop(self) -> None:
        """Stop scheduling (never waits for a hanging probe) and close probes that hold clients."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
            log.info("exporter stopped its scheduler")
        if self.lease is not None:
            # Released, so another replica takes the canaries over at its next attempt.
            self.lease.stop(release=True)
            self.lease.lease.client.close()
        for probe in self.probes:
            _close(probe)


def build_scheduler() -> BackgroundScheduler:
    """A background scheduler whose jobs never overlap themselves and catch up once when late."""
    return BackgroundScheduler(
        executors={"default": DaemonThreadExecutor()},
        job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None},
        timezone=UTC,
    )


def build_registry(
    cache: ProbeCache, extra_collectors: Sequence[Collector] = ()
) -> CollectorRegistry:
    """The exporter's own registry: the probe cache plus extra collectors."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(cache)
    for collector in extra_collectors:
        registry.register(collector)
    return registry


def build_metrics_router(
    registry: CollectorRegistry, exporter: Exporter, gzip_ok: bool
) -> APIRouter:
    """`/metrics` (text or OpenMetrics by Accept, gzip by Accept-Encoding) and `/healthz`."""
    router = APIRouter()

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        names = request.query_params.getlist("name[]")
        # `name[]` selects families, as prometheus-client's own exposition apps allow.
        body = encoder(registry.restricted_registry(names) if names else registry)
        headers = {}
        if gzip_ok and "gzip" in request.headers.get("accept-encoding", ""):
            # Level 1: ~7x cheaper than level 9 (prometheus-client's) for ~1.5x the bytes
            # (bench/scrape.py); a scrape's CPU matters more than its size.
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type=content_type, headers=headers)

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        status = exporter.cache.status()
        running = exporter.scheduler.running
        lease = exporter.lease
        body = {
            "status": "ok" if running else "stopped",
            "scheduler_running": running,
            "probes_ok": sum(1 for s in status.values() if s["success"]),
            "probes_total": len(status),
            "probes_skipped": sum(1 for s in status.values() if s["skipped"]),
            "canary_lease": None
            if lease is None
            else {"held": lease.held, "owner": lease.lease.owner, "error": lease.last_error},
            "probes": status,
        }
        return JSONResponse(body, status_code=200 if running else 503)

    return router


class ProbeConfigError(Exception):
    """A probe section that cannot be built; the message names the section."""


class LeaseCollector(Collector):
    """`redline_exporter_canary_lease_held`: whether this replica runs the canary probes."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper

    def describe(self) -> list[Metric]:
        """The one gauge family, without samples."""
        return [self._family()]

    def collect(self) -> list[Metric]:
        """The gauge: 1 while the lease is held."""
        family = self._family()
        family.add_metric([], 1.0 if self.keeper.held else 0.0)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        metric = catalog.REDLINE_EXPORTER_CANARY_LEASE_HELD
        return GaugeMetricFamily(metric.family, metric.help, labels=[])


def build_canary_lease(
    settings: ExporterSettings, probes: Sequence[Probe], durability: RedisDurability | None = None
) -> LeaseKeeper | None:
    """The canary lease's keeper when the lease is on and some probe writes canaries; the
    Redis client is opened lazily by redis-py, so Redis down delays the lease, not the start.
    With the spec's `redis` durability, the lease counts only what its replicas acknowledged."""
    section = settings.canary_lease
    if not settings.canary_lease_enabled or not any(writes_canaries(p) for p in probes):
        return None
    url = section.redis_url or settings.redis_url
    setting = "canary_lease.redis_url" if section.redis_url else "redis_url"
    renew = section.renew_seconds if section.renew_seconds is not None else section.ttl_seconds / 3
    # Short socket timeouts: an attempt must end well before the lease it renews lapses.
    timeout = max(0.1, min(2.0, renew / 2))
    try:
        client = open_redis(url, setting, socket_timeout=timeout, socket_connect_timeout=timeout)
        acks = durability if durability is not None else RedisDurability()
        lease = RedisLease(
            client,
            section.key,
            default_owner("exporter"),
            section.ttl_seconds,
            min_replicas_ack=acks.min_replicas_ack,
            ack_timeout_ms=acks.ack_timeout_ms,
        )
        return LeaseKeeper(lease, renew)
    except SettingsError as exc:
        raise ProbeConfigError(str(exc)) from None
    except ValueError as exc:
        raise ProbeConfigError(f"canary_lease: {exc}") from None


def build_probes(
    settings: ExporterSettings, spec: Spec, shared: Shared | None = None
) -> list[Probe]:
    """Every enabled probe, built from its settings section and the spec's thresholds.

    The one explicit registry of probes: a new probe module gets a section in ExporterSettings
    and a few lines here. Constructors do not connect (clients are opened on the first run), so
    a dependency that is down makes its probe fail at run time, never the exporter at start-up.
    `shared` (default: a fresh one from the settings) is what the probes share with the app.
    """
    shared = shared if shared is not None else Shared.from_settings(settings)
    probes: list[Probe] = []
    try:
        probes.extend(_model_probes(settings, shared))
        probes.extend(_llm_probes(settings, spec, shared))
        probes.extend(_consistency_probes(settings, spec))
        probes.extend(_mutation_probes(settings, spec, shared))
        probes.extend(_index_probes(settings, spec))
        if settings.session_rpo.enabled:
            probes.append(SessionRpoProbe.from_settings(settings.session_rpo, settings.redis_url))
        if settings.keepalive.enabled:
            probes.append(
                KeepaliveProbe.from_settings(settings.keepalive, settings.redis_url, spec)
            )
        if settings.session_crdt.enabled:
            probes.append(SessionCrdtProbe.from_settings(settings.session_crdt))
        probes.extend(_drift_probes(settings, spec))
        if settings.weights.enabled:
            # Imported here: the weights modules bring boto3, cryptography and python-pkcs11,
            # which an exporter without the weights probe should not load at start-up.
            from redline.exporters.weights import WeightsProbe

            probes.append(WeightsProbe(settings.weights, spec.weights))
    except (
        ValueError,
        DriftError,
        DeltaLogError,
        SettingsError,
        GoldenSetError,
        CanaryFileError,
    ) as exc:
        for probe in probes:
            _close(probe)
        raise ProbeConfigError(str(exc)) from None
    return probes


def _model_probes(settings: ExporterSettings, shared: Shared) -> list[Probe]:
    section = settings.models
    if not section.enabled:
        return []
    return [
        ModelVersionsProbe(
            shared.snapshots,
            models=section.models,
            interval_seconds=section.interval_seconds,
            max_versions=section.max_versions,
        )
    ]


def _llm_probes(settings: ExporterSettings, spec: Spec, shared: Shared) -> list[Probe]:
    unknown = sorted(set(settings.endpoints.upstreams) - set(spec.regions))
    if settings.endpoints.enabled and unknown:
        raise ProbeConfigError(
            f"endpoints.upstreams: regions {', '.join(unknown)} are not in the spec's regions "
            f"({', '.join(spec.regions)})"
        )
    return list(
        build_llm_probes(settings.endpoints, settings.golden_set, shared.versions, shared.tally)
    )


def _consistency_probes(settings: ExporterSettings, spec: Spec) -> list[Probe]:
    section = settings.consistency
    if not section.enabled:
        return []
    embeddings = section.embeddings
    key = read_secret(
        embeddings.api_key_file, embeddings.api_key, "consistency.embeddings.api_key_file"
    )
    return list(
        build_consistency_probes(
            section,
            spec.regions,
            settings.endpoints.upstreams,
            key.get_secret_value() if key is not None else None,
        )
    )


def _mutation_probes(settings: ExporterSettings, spec: Spec, shared: Shared) -> list[Probe]:
    section = settings.mutation
    unknown = sorted(set(section.upstreams) - set(spec.regions))
    if section.enabled and unknown:
        raise ProbeConfigError(
            f"mutation.upstreams: regions {', '.join(unknown)} are not in the spec's regions "
            f"({', '.join(spec.regions)})"
        )
    return list(build_mutation_probes(section, settings.redis_url, shared.versions))


def _index_probes(settings: ExporterSettings, spec: Spec) -> list[Probe]:
    section = settings.index_staleness
    if not section.enabled:
        return []
    token = read_secret(
        section.milvus_token_file, section.milvus_token, "index_staleness.milvus_token_file"
    )
    secret = token.get_secret_value() if token is not None else ""
    config = section.index_config(section.collection, section.dim, secret, section.region)
    probes: list[Probe] = [
        IndexStalenessProbe(
            config,
            section.redis_url or settings.redis_url,
            interval_seconds=section.interval_seconds,
            timeout_seconds=section.timeout_seconds,
        )
    ]
    if section.consistency_check:
        probes.append(
            IndexConsistencyProbe(
                config,
                spec.red_lines.index_consistency.max_staleness_seconds,
                bounded_staleness_seconds=section.bounded_staleness_seconds,
                interval_seconds=section.consistency_interval_seconds,
                timeout_seconds=section.timeout_seconds,
            )
        )
    return probes


def _drift_probes(settings: ExporterSettings, spec: Spec) -> list[Probe]:
    section = settings.drift
    if not section.enabled:
        return []
    reference = section.reference or (
        Path(spec.drift.reference) if spec.drift.reference is not None else None
    )
    if reference is None:
        log.warning(
            "embedding drift probe not started: no reference vectors (set drift.reference in "
            "the exporter settings or the spec, or drift.enabled: false)"
        )
        return []
    drift = spec.drift.model_copy(update={"reference": str(reference)})
    token = read_secret(section.milvus_token_file, section.milvus_token, "drift.milvus_token_file")
    secret = token.get_secret_value() if token is not None else ""
    if section.source == "milvus":
        return [
            build_drift_probe(
                drift,
                milvus_uri=section.milvus_uri,
                token=secret,
                vector_field=section.vector_field,
                time_field=section.time_field,
                interval_seconds=section.interval_seconds,
                use_spec_threshold=section.use_spec_threshold,
            )
        ]
    return [
        DriftProbe(
            source=RedisStreamWindow(
                section.redis_url or settings.redis_url,
                section.stream,
                field=section.stream_field,
                encoding=section.encoding,
            ),
            reference=NpyReference(reference),
            collection=drift.collection,
            methods=(drift.method,),
            window_size=drift.window,
            interval_seconds=section.interval_seconds,
            fixed_thresholds={drift.method: drift.threshold}
            if section.use_spec_threshold
            else None,
        )
    ]


def _close(probe: Probe) -> None:
    close: Callable[[], object] | None = getattr(probe, "close", None)
    if close is not None:
        try:
            close()
        except Exception as exc:  # closing one probe must not stop the others closing
            log.warning("closing probe %s failed: %s", probe.name, exc)


def hang_timeouts(settings: ExporterSettings, probes: Sequence[Probe]) -> dict[str, float]:
    """Each probe's hang timeout: `probe_timeouts[name]`, else max(global, its interval)."""
    names = {probe.name for probe in probes}
    for name in sorted(set(settings.probe_timeouts) - names):
        log.warning("probe_timeouts names %r, which is not a running probe", name)
    return {
        probe.name: settings.probe_timeouts.get(
            probe.name, max(settings.probe_timeout_seconds, probe.interval_seconds)
        )
        for probe in probes
    }


def build_exporter_app(
    settings: ExporterSettings,
    spec: Spec,
    probes: Sequence[Probe] | None = None,
    extra_collectors: Sequence[Collector] = (),
    shared: Shared | None = None,
) -> Exporter:
    """An exporter over the probes of `settings` (or the given ones) and `POST /v1/evaluations`;
    the app's lifespan starts the scheduler and stops it (closing the probes)."""
    shared = shared if shared is not None else Shared.from_settings(settings)
    try:
        # Before any probe is built, so an unreadable token file leaves nothing to close.
        evaluations = build_evaluations_router(settings.evaluations, shared.versions, shared.tally)
    except EvaluationConfigError as exc:
        raise ProbeConfigError(str(exc)) from None
    if probes is None:
        probes = build_probes(settings, spec, shared)
    tally_families = {definition.name for definition in EVAL_METRICS}
    for probe in probes:
        if tally_families & {definition.name for definition in probe.metrics}:
            # The app publishes those counters from its tally; a second publisher would make
            # two series with the same labels.
            raise ProbeConfigError(
                f"probe {probe.name!r} publishes {', '.join(sorted(tally_families))} itself; "
                "build it with the tally of the `shared` given to build_exporter_app"
            )
    timeouts = hang_timeouts(settings, probes)
    lease = build_canary_lease(settings, probes, spec.redis)
    canaries = {probe.name for probe in probes if writes_canaries(probe)}

    def may_run(name: str) -> bool:
        return lease is None or name not in canaries or lease.held

    cache = ProbeCache(
        probes, timeout_seconds=settings.probe_timeout_seconds, timeouts=timeouts, may_run=may_run
    )
    apply_created_series(settings.created_series)
    lease_collectors = [LeaseCollector(lease)] if lease is not None else []
    registry = build_registry(cache, [shared.tally, *lease_collectors, *extra_collectors])
    scheduler = build_scheduler()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        exporter.start()
        try:
            yield
        finally:
            exporter.stop()

    app = FastAPI(
        title="redline exporters",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    exporter = Exporter(app, scheduler, cache, registry, list(probes), shared, lease)
    app.include_router(build_metrics_router(registry, exporter, settings.gzip))
    app.include_router(evaluations)
    return exporter


__all__ = [
    "ProbeConfigError",
    "DaemonThreadExecutor",
    "Exporter",
    "LeaseCollector",
    "Shared",
    "build_canary_lease",
    "hang_timeouts",
    "build_exporter_app",
    "build_probes",
    "build_registry",
    "build_scheduler",
]
