"""Pure builders of the local stack's configuration: every settings file, every Prometheus config.

Everything here is a function of the spec (with its `local` profile applied), the ports and the
run directory (`redline.devstack.layout`), so `redline up` is reproducible and the unit tests can
validate every settings file against the settings class of the part that reads it. Thresholds and
intervals come from the spec; what is chosen here is only what the spec does not say (the demo
model, the healthy latency of each simulated region, probe intervals short enough for the
profile's staleness guard).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from redline.devstack.layout import (
    ADAPTER,
    ADAPTER_VERSIONS,
    BASE_MODEL,
    COLLECTION,
    CONTROL_PLANE_JOBS,
    EMBEDDINGS_FIELD,
    EMBEDDINGS_STREAM,
    GATEWAY_PART,
    INDEX_DIM,
    PRIMARY_INDEX,
    REPLICA_INDEX,
    TRACE_STORE_PART,
    Endpoints,
    StackLayout,
    build_session_sync_parts,
    check_source,
    has_gateway,
    pod_name,
    replica_parts,
    service_part,
    session_sync_part,
    simulator_part,
)
from redline.devstack.multiregion import GLOBAL_PART, build_multiregion_configs, regional_part
from redline.platform.sessions import DEFAULT_GROUP, DEFAULT_STREAM
from redline.rules.model import format_duration
from redline.slo.sources import PROFILES, SIGNAL_KINDS
from redline.slo.spec import REMEDIATION_RECEIVER, Receiver, Sources, Spec

SERVICE_MODULE = "redline.devstack.fakes.service"
"""Run with `python -m` as each region's service front."""
TRACE_STORE_MODULE = "redline.devstack.tracestore"
"""Run with `python -m` as the stack's trace backend."""
GATEWAY_SERVICE_NAME = "redline-gateway"
"""The gateway's OTEL_SERVICE_NAME (the `service` of its spans in the trace store)."""
GATEWAY_ONLY_PLAYBOOKS = frozenset({"reroute"})
"""Playbooks that act through redline's gateway (its routing override): a stack without the
gateway cannot run them, so its spec pages a human instead."""


def build_source_spec(spec: Spec, source: str) -> Spec:
    """The spec as a stack of `source` runs it: unchanged for redline's gateway; for an engine
    source its `sources` replaced by the engine's profile (the simulators publish exactly its
    documented exposition) and, with no gateway in the path, a latency red line that pages a
    human instead of a reroute only the gateway could perform, and that does not claim to
    include reroutes."""
    check_source(source)
    if has_gateway(source):
        if spec.sources.profile == source:
            return spec
        # An engine spec run behind the gateway: the rules read what the gateway writes.
        return spec.model_copy(update={"sources": Sources.model_validate({"profile": source})})
    red = spec.red_lines
    latency = red.latency_p99
    playbook = None if latency.playbook in GATEWAY_ONLY_PLAYBOOKS else latency.playbook
    latency = latency.model_copy(update={"playbook": playbook, "includes_reroute": False})
    return spec.model_copy(
        update={
            "sources": Sources.model_validate({"profile": source}),
            "red_lines": red.model_copy(update={"latency_p99": latency}),
        }
    )


def build_stack_spec(spec: Spec, endpoints: Endpoints, token_file: Path) -> Spec:
    """The spec (local profile already applied) as this run's source runs it
    (`build_source_spec`), with the receiver pointed at this run's."""
    receiver = Receiver(url=f"{endpoints.receiver_url}/alerts", bearer_token_file=str(token_file))
    staged = build_source_spec(spec, endpoints.source)
    return staged.model_copy(update={"receiver": receiver})


def pipeline_budget_seconds(spec: Spec, for_seconds: float, federated: bool = False) -> float:
    """scrape (+ a federation scrape) + eval + for + group_wait: from a fault to a
    notification. The rules read an engine's series where they are (no copy, no extra
    evaluation); only its version stamp may be one evaluation old."""
    t = spec.timing
    scrapes = 2 if federated else 1
    return (
        scrapes * t.scrape_interval_seconds
        + t.evaluation_interval_seconds
        + for_seconds
        + t.group_wait_seconds
    )


def engine_job(endpoints: Endpoints) -> str | None:
    """The scrape job of the simulators' engine exposition (named after the source), or None
    where the gateway writes the series."""
    return None if endpoints.has_gateway else endpoints.source


def build_engine_job(endpoints: Endpoints) -> dict[str, Any]:
    """Every pod of every region (its engine /metrics, scraped pod by pod as Kubernetes service
    discovery would, never through the region's service), each with `region` and `pod` target
    labels: the profile maps the engine's series' `region` label onto the catalog's, and the
    recordings sum the pods of a region."""
    name = engine_job(endpoints)
    if name is None:
        raise ValueError("the gateway stack scrapes no engine")
    targets = [
        {
            "targets": [endpoints.pod_address(region, pod)],
            "labels": {"region": region, "pod": pod_name(region, pod)},
        }
        for region in endpoints.regions
        for pod in range(endpoints.pods)
    ]
    return {"job_name": name, "static_configs": targets}


def engine_series_match(source: str) -> list[str]:
    """`match[]` selectors of an engine profile's own series (what its mirror recordings read),
    for federation: the catalog's prefixes do not cover them."""
    profile = PROFILES[source]
    names: set[str] = set()
    for signal, series in profile.series.items():
        for name in series.names:
            names.add(re.escape(name))
            if SIGNAL_KINDS[signal] == "histogram":
                names.update(re.escape(name) + suffix for suffix in ("_bucket", "_count", "_sum"))
    return [f'{{__name__=~"{"|".join(sorted(names))}"}}'] if names else []


def build_prometheus_config(spec: Spec, endpoints: Endpoints, rule_file: Path) -> dict[str, Any]:
    """prometheus.yml: the profile's scrape/eval intervals, the rules, Alertmanager, targets
    (the gateway, or every region's engine without one)."""
    t = spec.timing
    scrape = format_duration(t.scrape_interval_seconds)
    host = endpoints.host

    def job(name: str, part: str) -> dict[str, Any]:
        # A replicated part (gateway, receiver, exporter) is one job with a target per replica.
        names = replica_parts(part, endpoints.replicas) if part in REPLICATED_JOBS else (part,)
        targets = [f"{host}:{endpoints.ports[name]}" for name in names]
        return {"job_name": name, "static_configs": [{"targets": targets}]}

    if endpoints.has_gateway:
        serving = job(GATEWAY_PART, GATEWAY_PART)
    else:
        serving = build_engine_job(endpoints)
    return {
        "global": {
            "scrape_interval": scrape,
            "scrape_timeout": scrape,
            "evaluation_interval": format_duration(t.evaluation_interval_seconds),
            "external_labels": {"service": spec.service, "stack": "local"},
        },
        "rule_files": [str(rule_file)],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"{host}:{endpoints.ports['alertmanager']}"]}]}
            ]
        },
        "scrape_configs": [
            serving,
            job("exporters", "exporters"),
            job("remediation", "remediation"),
            job("prometheus", "prometheus"),
            job("alertmanager", "alertmanager"),
        ],
    }


REPLICATED_JOBS = frozenset({GATEWAY_PART, "remediation", "exporters"})


def add_receiver_replicas(config: dict[str, Any], urls: Sequence[str]) -> dict[str, Any]:
    """Alertmanager's config with the remediation receiver's webhook sent to every receiver
    replica (same token, same options): each replica gets each notification and the job store's
    idempotency keys make every alert one job, whichever replica records it first."""
    receivers = []
    for receiver in config["receivers"]:
        hooks = receiver.get("webhook_configs")
        if receiver["name"] == REMEDIATION_RECEIVER and hooks:
            [hook] = hooks
            receiver = {**receiver, "webhook_configs": [{**hook, "url": url} for url in urls]}
        receivers.append(receiver)
    return {**config, "receivers": receivers}


def build_prometheus_configs(
    spec: Spec, endpoints: Endpoints, rule_file: Path
) -> dict[str, dict[str, Any]]:
    """prometheus.yml of every Prometheus part: one, or one per region plus a federating global."""
    base = build_prometheus_config(spec, endpoints, rule_file)
    if not endpoints.federated:
        return {GLOBAL_PART: base}
    parts = (*(regional_part(r) for r in endpoints.prometheus_regions), GLOBAL_PART)
    addresses = {part: f"{endpoints.host}:{endpoints.ports[part]}" for part in parts}
    last = endpoints.prometheus_regions[-1]
    job_regions = dict.fromkeys(CONTROL_PLANE_JOBS, last)
    extra = () if endpoints.has_gateway else engine_series_match(endpoints.source)
    return build_multiregion_configs(spec, base, addresses, job_regions, extra).parts()


def build_healthy_faults(region_index: int) -> dict[str, Any]:
    """A region's normal behaviour: a few tens of ms, lognormal tail; farther regions slower."""
    return {
        "latency": {
            "base_seconds": round(0.02 + 0.03 * region_index, 3),
            "jitter": "lognormal",
            "jitter_seconds": 0.04,
            "sigma": 0.4,
        }
    }


def build_simulator_settings(
    region: str,
    region_index: int,
    endpoints: Endpoints,
    layout: StackLayout,
    seed: int,
    pod: int = 0,
) -> dict[str, Any]:
    """Settings of one simulator pod of a region, serving the active adapter version; without
    a gateway it publishes the engine's exposition on /metrics. Pods of a region behave alike
    (same faults) with their own dice."""
    engine = {} if endpoints.has_gateway else {"metrics_profile": endpoints.source}
    return {
        **engine,
        "host": endpoints.host,
        "port": endpoints.ports[simulator_part(region, pod)],
        "region": region,
        "base_model": BASE_MODEL,
        "adapters": {ADAPTER: str(layout.adapter_dir(ADAPTER_VERSIONS[0]))},
        "seed": seed + region_index + 100 * pod,
        "faults": build_healthy_faults(region_index),
        "log_level": "warning",
    }


def build_service_settings(region: str, endpoints: Endpoints) -> dict[str, Any]:
    """Settings of a region's service front: round robin over the region's pods
    (`redline.devstack.fakes.service`)."""
    return {
        "host": endpoints.host,
        "port": endpoints.ports[service_part(region)],
        "region": region,
        "pods": endpoints.pod_urls(region),
        "eject_seconds": 2.0,
        "log_level": "warning",
    }


def build_trace_store_settings(endpoints: Endpoints) -> dict[str, Any]:
    """Settings of the trace store (`redline.devstack.tracestore`): the last 2000 traces; at
    the demo's load that is the last minute or so, which is what a test or a look at a P99
    exemplar reads."""
    return {
        "host": endpoints.host,
        "port": endpoints.ports[TRACE_STORE_PART],
        "max_traces": 2000,
        "max_spans_per_trace": 1000,
        "max_body_bytes": 8 * 1024 * 1024,
        "log_level": "warning",
    }


def build_tracing_env(endpoints: Endpoints, service_name: str) -> dict[str, str]:
    """The standard OpenTelemetry environment of a part whose spans go to the trace store:
    OTLP/HTTP protobuf to its /v1/traces, every trace sampled unless the caller's traceparent
    says otherwise, and a short batch delay so a test finds a request's spans within a second
    (the SDK's default waits 5 s)."""
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoints.otlp_traces_url,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": service_name,
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


def _spec_fields(spec_path: Path | None) -> dict[str, Any]:
    return {"spec": str(spec_path) if spec_path is not None else None, "profile": "local"}


LOCAL_QUOTAS_FILE = Path(__file__).with_name("local-quotas.yaml")
"""The local gateway's quotas: tenants `batch` (summarise 2000 tokens/min) and `interactive`."""


def build_gateway_settings(
    endpoints: Endpoints,
    spec_path: Path | None,
    snapshots_dir: Path | None = None,
    part: str = GATEWAY_PART,
) -> dict[str, Any]:
    """Settings of the gateway (or of its replica `part`): every region's simulator in failover
    order, and the snapshot registry it stamps each request's `model_version` from (not the
    upstream's header). Replicas share the routing store and the quota buckets in Redis."""
    return {
        "host": endpoints.host,
        "port": endpoints.ports[part],
        "redis_url": endpoints.redis_url,
        **_spec_fields(spec_path),
        **({"snapshots_root": str(snapshots_dir)} if snapshots_dir is not None else {}),
        "upstreams": endpoints.upstreams,
        # The rollback checks the golden set through the gateway right after it moves the
        # registry's pointer: a shorter cache of the active version than the default 1 s keeps
        # the version the gateway stamps close to what the pods serve (a registry read is cheap).
        "version_ttl_seconds": 0.1,
        # The latency drills slow a region by 0.9 s for the P99 red line (0.8 s) to catch: a
        # budget of 1.0 s left the region's own latency 0.1 s, on a loaded machine requests
        # crossed it, were rerouted one by one and opened the region's breaker, and the red line
        # never saw the slowness it is drilled on. Twice the red line and more keeps the two
        # mechanisms apart; a region that does not answer at all is still rerouted at once.
        "first_byte_budget_seconds": 2.0,
        # Token quotas for two tenants (the `quota` drill); the load generator has none.
        "quotas_file": str(LOCAL_QUOTAS_FILE),
        "log_level": "warning",
    }


def build_index_settings(endpoints: Endpoints) -> dict[str, Any]:
    """Settings of the replicator and the index writer (`redline index ...`)."""
    return {
        "redis_url": endpoints.redis_url,
        "collection": COLLECTION,
        "dim": INDEX_DIM,
        "region": endpoints.regions[0],
        "primary_uri": endpoints.milvus_primary_uri,
        "primary_name": PRIMARY_INDEX,
        "replica_uri": endpoints.milvus_replica_uri,
        "replica_name": REPLICA_INDEX,
        "log_level": "info",
    }


def build_session_settings(endpoints: Endpoints) -> dict[str, Any]:
    """Settings of the session CDC replica consumer and writer."""
    return {
        "redis_url": endpoints.redis_url,
        "replica_url": endpoints.session_replica_url,
        "session_stream": DEFAULT_STREAM,
        "session_group": DEFAULT_GROUP,
        "log_level": "info",
    }


def build_session_sync_settings(endpoints: Endpoints, region: str) -> dict[str, Any]:
    """Settings of the CRDT session sync into `region` from the other of the first two regions
    (`redline sessions sync`): short reads, so a heal after a partition converges fast."""
    urls = endpoints.crdt_session_urls
    source = next(other for other in urls if other != region)
    return {
        "redis_url": urls[region],
        "region": region,
        "source_url": urls[source],
        "source_region": source,
        "sync_block_ms": 100,
        "log_level": "info",
    }


CANARY_LEASE_TTL_SECONDS = 3.0
"""The stack's canary lease: short, so a replica takes the canaries over well inside the
profile's stale guard when the holder dies."""


def build_exporter_settings(
    spec: Spec,
    endpoints: Endpoints,
    layout: StackLayout,
    spec_path: Path | None,
    part: str = "exporters",
) -> dict[str, Any]:
    """Settings of the exporter process (or of its replica `part`): every probe on, each well
    inside the stale guard; the canary probes run on the canary lease's holder only."""
    stale = spec.timing.probe_stale_after_seconds
    # A probe's last success must never look stale between two healthy runs.
    fast = min(1.0, stale / 4)
    slow = min(5.0, stale / 3)
    return {
        "host": endpoints.host,
        "port": endpoints.ports[part],
        "canary_lease": {
            "enabled": True,
            "ttl_seconds": CANARY_LEASE_TTL_SECONDS,
            "renew_seconds": CANARY_LEASE_TTL_SECONDS / 6,
        },
        "redis_url": endpoints.redis_url,
        **_spec_fields(spec_path),
        "log_level": "info",
        "probe_timeout_seconds": 10.0,
        "models": {
            "interval_seconds": fast,
            "root": str(layout.snapshots_dir),
            "models": [ADAPTER],
        },
        "endpoints": {
            "interval_seconds": fast,
            "timeout_seconds": 2.0,
            "upstreams": endpoints.upstreams,
            "model": BASE_MODEL,
        },
        "golden_set": {
            # Every 5 s (a third of the stale guard): 2.4 golden requests/s, enough verdicts for
            # the gate's accuracy leg, few enough that a night-time window (the load generator
            # paused) holds fewer than min_requests.
            "interval_seconds": 5.0,
            "timeout_seconds": 3.0,
            # Without a gateway the probe asks the first region's engine directly.
            "gateway_url": endpoints.client_url,
            "models": [ADAPTER],
        },
        # The same canaries on every region's engine: the simulators answer alike (level 2 of
        # the report's maturity) until a fault makes one region's answers differ.
        "consistency": {
            "enabled": True,
            "interval_seconds": slow,
            "timeout_seconds": 3.0,
            "upstreams": endpoints.upstreams,
            "models": [BASE_MODEL],
        },
        # The adapter's canary answers in every region against the accepted ones (drill
        # `mutation`); only an operator accepts a changed answer.
        "mutation": {
            "enabled": True,
            "interval_seconds": slow,
            "timeout_seconds": 3.0,
            "upstreams": endpoints.upstreams,
            "models": [ADAPTER],
            "accept_after": 0,
        },
        "index_staleness": {
            "interval_seconds": fast,
            "collection": COLLECTION,
            "dim": INDEX_DIM,
            "region": endpoints.regions[0],
            "primary_uri": endpoints.milvus_primary_uri,
            "primary_name": PRIMARY_INDEX,
            "replica_uri": endpoints.milvus_replica_uri,
            "replica_name": REPLICA_INDEX,
            "timeout_seconds": 2.0,
        },
        "session_rpo": {
            "interval_seconds": 0.5,
            "targets": [{"stream": DEFAULT_STREAM, "group": DEFAULT_GROUP}],
        },
        "keepalive": {
            "interval_seconds": slow,
            "replica_url": endpoints.session_replica_url,
        },
        # Divergence is judged on sessions quiet for a second (the sync reads every 0.1 s).
        "session_crdt": {
            "enabled": len(endpoints.regions) >= 2,
            "interval_seconds": 0.5,
            "regions": endpoints.crdt_session_urls,
            "settle_seconds": 1.0,
        },
        "drift": {
            "interval_seconds": slow,
            "source": "redis_stream",
            "reference": str(layout.drift_reference),
            "stream": EMBEDDINGS_STREAM,
            "stream_field": EMBEDDINGS_FIELD,
            "encoding": "float32",
        },
    }


def build_playbook_sections(endpoints: Endpoints, layout: StackLayout) -> dict[str, Any]:
    """The receiver's playbook sections: where each playbook finds what it acts on (without a
    gateway, the rollback's golden set asks the first region's service). The upstreams are the
    regions' service fronts; the rollback finds every pod behind them from a static list, as it
    would from a headless Service's DNS or the Service's EndpointSlices."""
    return {
        "serving": {
            "gateway_url": endpoints.client_url,
            "upstreams": endpoints.upstreams,
            "pods": {region: {"urls": endpoints.pod_urls(region)} for region in endpoints.regions},
            "probe_model": BASE_MODEL,
            "timeout_seconds": 5.0,
        },
        "rollback": {"snapshot_root": str(layout.snapshots_dir)},
        "vector_index": {
            "redis_url": endpoints.redis_url,
            "collections": {
                COLLECTION: {
                    "dim": INDEX_DIM,
                    "primary_uri": endpoints.milvus_primary_uri,
                    "primary_name": PRIMARY_INDEX,
                    "replica_uri": endpoints.milvus_replica_uri,
                    "replica_name": REPLICA_INDEX,
                }
            },
        },
        # A short hold-down and restore period (the spec's is 120 s): the drills wait for the
        # routing to be restored before the next one. The restore also reads the exporter's
        # probe durations and the recorded P99 from the stack's Prometheus, as a deployment
        # would: the `latency-persistent` drill checks that a region still slow keeps the
        # override across several of these periods.
        "reroute": {
            "hold_down_seconds": 3.0,
            "healthy_checks": 3,
            "poll_seconds": 0.25,
            "restore_check_seconds": 1.0,
            "restore_for_seconds": 5.0,
            "prometheus_url": endpoints.prometheus_url,
        },
    }


def build_remediation_settings(
    endpoints: Endpoints,
    layout: StackLayout,
    spec_path: Path | None,
    workers: int,
    part: str = "remediation",
) -> dict[str, Any]:
    """Settings of a receiver (`part`: a replica) and of the worker process (same file, same
    registry); replicas share the job store, the audit chain and its file."""
    return {
        "host": endpoints.host,
        "port": endpoints.ports[part],
        "redis_url": endpoints.redis_url,
        **_spec_fields(spec_path),
        "log_level": "info",
        "token_file": str(layout.token_file),
        "workers": workers,
        "audit_file": str(layout.audit_file),
        "audit_verify_interval_seconds": 10.0,
        "lock_ttl_seconds": 30.0,
        "claim_idle_seconds": 30.0,
        "max_attempts": 3,
        "backoff_initial_seconds": 0.5,
        "backoff_max_seconds": 5.0,
        "poll_seconds": 0.5,
        **build_playbook_sections(endpoints, layout),
    }


def build_loadgen_settings(
    endpoints: Endpoints, layout: StackLayout, rate: float, seed: int
) -> dict[str, Any]:
    """Settings of the load generator (chat traffic, prompt embeddings, adapter checkpoints):
    through the gateway, or without one to the first region's engine directly."""
    return {
        "redis_url": endpoints.redis_url,
        "gateway_url": endpoints.client_url,
        # Further gateway replicas: the load generator sends to each in turn.
        "more_gateway_urls": endpoints.gateway_urls[1:],
        "rate": rate,
        "seed": seed,
        "adapter": ADAPTER,
        "base_model": BASE_MODEL,
        "stats_file": str(layout.loadgen_stats),
        "pause_file": str(layout.loadgen_pause),
        "snapshots_root": str(layout.snapshots_dir),
        "embeddings_stream": EMBEDDINGS_STREAM,
        "embeddings_field": EMBEDDINGS_FIELD,
        "log_level": "info",
    }


@dataclass(frozen=True)
class PartCommand:
    """How a redline part is started: its argv, its settings file and the environment it gets
    beyond the stack's own (the gateway's OTEL_* variables)."""

    part: str
    argv: tuple[str, ...]
    settings: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


def build_part_commands(
    spec: Spec,
    endpoints: Endpoints,
    layout: StackLayout,
    spec_path: Path | None,
    rate: float,
    seed: int,
    python: str = sys.executable,
) -> list[PartCommand]:
    """The redline parts (every part but the service binaries), in start order; the gateway
    only where the source is redline's gateway."""
    cli = (python, "-m", "redline.cli")

    def command(
        part: str, args: Sequence[str], settings: dict[str, Any], env: dict[str, str] | None = None
    ) -> PartCommand:
        config = str(layout.settings_file(part))
        return PartCommand(part, (*cli, *args, "--config", config), settings, env or {})

    spec_args = ("--spec", str(spec_path)) if spec_path is not None else ()
    commands = [
        command(
            simulator_part(region, pod),
            ("simulate", "upstream"),
            build_simulator_settings(region, index, endpoints, layout, seed, pod),
        )
        for index, region in enumerate(endpoints.regions)
        for pod in range(endpoints.pods)
    ]
    # The service fronts are plain modules, not CLI commands: one lean process per region.
    service_argv = (python, "-m", SERVICE_MODULE, "--config")
    commands += [
        PartCommand(
            service_part(region),
            (*service_argv, str(layout.settings_file(service_part(region)))),
            build_service_settings(region, endpoints),
        )
        for region in endpoints.regions
    ]
    # The trace store is a plain module too, started before the gateway that exports to it.
    trace_settings = str(layout.settings_file(TRACE_STORE_PART))
    commands.append(
        PartCommand(
            TRACE_STORE_PART,
            (python, "-m", TRACE_STORE_MODULE, "--config", trace_settings),
            build_trace_store_settings(endpoints),
        )
    )
    # Three workers in two processes: jobs keep flowing while one process restarts (each
    # receiver replica runs one more).
    workers = build_remediation_settings(endpoints, layout, spec_path, workers=2)
    if endpoints.has_gateway:
        tracing = build_tracing_env(endpoints, GATEWAY_SERVICE_NAME)
        commands += [
            command(
                part,
                ("gateway",),
                build_gateway_settings(endpoints, spec_path, layout.snapshots_dir, part),
                tracing,
            )
            for part in replica_parts(GATEWAY_PART, endpoints.replicas)
        ]
    commands += [
        *(
            command(
                part,
                ("remediation",),
                build_remediation_settings(endpoints, layout, spec_path, 1, part),
            )
            for part in replica_parts("remediation", endpoints.replicas)
        ),
        command("remediation-worker", ("remediation", "worker"), workers),
        command("replicator", ("index", "replicate"), build_index_settings(endpoints)),
        command("session-replica", ("sessions", "replica"), build_session_settings(endpoints)),
        command(
            "session-writer",
            ("sessions", "writer", "--rate", "5", "--sessions", "50", *spec_args),
            build_session_settings(endpoints),
        ),
        *(
            command(
                part,
                ("sessions", "sync"),
                build_session_sync_settings(endpoints, part.removeprefix(session_sync_part(""))),
            )
            for part in build_session_sync_parts(endpoints.regions)
        ),
        command(
            "index-writer",
            ("index", "write-demo", "--count", "1000000000", "--rate", "5", "--batch", "5"),
            build_index_settings(endpoints),
        ),
        *(
            command(
                part,
                ("exporters",),
                build_exporter_settings(spec, endpoints, layout, spec_path, part),
            )
            for part in replica_parts("exporters", endpoints.replicas)
        ),
        command("loadgen", ("loadgen",), build_loadgen_settings(endpoints, layout, rate, seed)),
    ]
    return commands


def render_settings(settings: Mapping[str, Any]) -> str:
    """A settings file's YAML (stable key order, no anchors)."""
    header = "# Written by redline up for this run; regenerated on every start.\n"
    return header + yaml.safe_dump(dict(settings), sort_keys=True, default_flow_style=False)
