"""Pure builders of the local stack: its parts, run-directory layout, URLs and settings files.

Everything here is a function of the spec (with its `local` profile applied), the ports and the
run directory, so `redline up` is reproducible and the unit tests can validate every settings
file against the settings class of the part that reads it. Thresholds and intervals come from the
spec; what is chosen here is only what the spec does not say (the demo model, the healthy
latency of each simulated region, probe intervals short enough for the profile's staleness
guard).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from redline.devstack.multiregion import (
    GLOBAL_PART,
    build_multiregion_configs,
    regional_part,
)
from redline.generate.outputs import ALERTMANAGER_FILE, RULE_FILE
from redline.platform.golden import EMBEDDING_DIMS
from redline.platform.sessions import DEFAULT_GROUP, DEFAULT_STREAM
from redline.rules.model import format_duration
from redline.slo.spec import Receiver, Spec

HOST = "127.0.0.1"
ADAPTER = "chat-lora"
"""The LoRA adapter the demo serves; its versions are the snapshots the rollback drills use."""
BASE_MODEL = "redline-base"
ADAPTER_VERSIONS = ("v1", "v2", "v3")
"""v1 serves; v2 is the regression drill's release, v3 the negative drill's."""
COLLECTION = "documents"
INDEX_DIM = 128
EMBEDDINGS_STREAM = "redline:prompt-embeddings"
EMBEDDINGS_FIELD = "vector"
DRIFT_DIM = EMBEDDING_DIMS
PRIMARY_INDEX = "primary"
REPLICA_INDEX = "replica"
STATE_FILE = "state.json"
MARKER_FILE = ".redline-run"

SERVICE_PARTS = ("redis", "milvus-primary", "milvus-replica", "prometheus", "alertmanager")
"""Parts that are external binaries, started by `redline.devstack.processes`."""
TAIL_PARTS = (
    "gateway",
    "remediation",
    "remediation-worker",
    "replicator",
    "session-replica",
    "session-writer",
    "index-writer",
    "exporters",
    "loadgen",
)
HTTP_PARTS = frozenset({"gateway", "remediation", "exporters"})
CONTROL_PLANE_JOBS = ("remediation", "alertmanager")
"""With one Prometheus per region, these scrape jobs belong to the last region's Prometheus (the
control plane runs there); the serving path (gateway, exporters) stays in the first region."""


class StackConfigError(Exception):
    """The stack cannot be configured as asked (e.g. a spec with one region, a bad port)."""


def simulator_part(region: str) -> str:
    """The part name of a region's upstream simulator."""
    return f"simulator-{region}"


def build_service_parts(prometheus_regions: Sequence[str] = ()) -> tuple[str, ...]:
    """The service binaries: a Prometheus per region (if asked for) before the global one."""
    regional = tuple(regional_part(r) for r in prometheus_regions)
    at = SERVICE_PARTS.index(GLOBAL_PART)
    return (*SERVICE_PARTS[:at], *regional, *SERVICE_PARTS[at:])


def build_part_names(
    regions: Sequence[str], prometheus_regions: Sequence[str] = ()
) -> tuple[str, ...]:
    """Every part in start order (stop order is the reverse)."""
    services = build_service_parts(prometheus_regions)
    return (*services, *(simulator_part(r) for r in regions), *TAIL_PARTS)


def build_ported_parts(
    regions: Sequence[str], prometheus_regions: Sequence[str] = ()
) -> tuple[str, ...]:
    """The parts that listen on a TCP port."""
    services = build_service_parts(prometheus_regions)
    return (*services, *(simulator_part(r) for r in regions), *sorted(HTTP_PARTS))


@dataclass(frozen=True)
class StackLayout:
    """Where everything of one run lives under its run directory."""

    root: Path

    @property
    def state_file(self) -> Path:
        """The state file `redline down` and `status` read (pids, ports, URLs)."""
        return self.root / STATE_FILE

    @property
    def marker(self) -> Path:
        """A file marking the directory as a redline run directory (safe to clean)."""
        return self.root / MARKER_FILE

    @property
    def config_dir(self) -> Path:
        """Generated configuration and settings files."""
        return self.root / "config"

    @property
    def logs_dir(self) -> Path:
        """One log per part."""
        return self.root / "logs"

    @property
    def data_dir(self) -> Path:
        """Data of the services (TSDB, AOF, Milvus) and of the drills."""
        return self.root / "data"

    @property
    def rules_dir(self) -> Path:
        """The rule file and alertmanager.yml generated from the spec."""
        return self.config_dir / "rules"

    @property
    def rule_file(self) -> Path:
        """The Prometheus rule file."""
        return self.rules_dir / RULE_FILE

    @property
    def alertmanager_file(self) -> Path:
        """Alertmanager's configuration."""
        return self.rules_dir / ALERTMANAGER_FILE

    def prometheus_config(self, part: str) -> Path:
        """The configuration of one Prometheus part (`prometheus`, `prometheus-<region>`)."""
        return self.config_dir / f"{part}.yml"

    @property
    def dashboards_dir(self) -> Path:
        """Grafana dashboards generated from the stack's spec (local profile)."""
        return self.config_dir / "dashboards"

    @property
    def token_file(self) -> Path:
        """The webhook bearer token shared by Alertmanager and the receiver."""
        return self.config_dir / "webhook-token"

    @property
    def snapshots_dir(self) -> Path:
        """Root of the snapshot registry."""
        return self.data_dir / "snapshots"

    @property
    def adapters_dir(self) -> Path:
        """Adapter files of the demo model, one directory per version."""
        return self.data_dir / "adapters"

    @property
    def audit_file(self) -> Path:
        """JSONL mirror of the remediation audit trail."""
        return self.data_dir / "audit.jsonl"

    @property
    def drift_reference(self) -> Path:
        """Reference embeddings of the prompt distribution (.npy)."""
        return self.data_dir / "drift-reference.npy"

    @property
    def loadgen_stats(self) -> Path:
        """Counters the load generator rewrites every second."""
        return self.data_dir / "loadgen-stats.json"

    @property
    def drills_dir(self) -> Path:
        """One JSON result per drill run."""
        return self.root / "drills"

    def adapter_dir(self, version: str) -> Path:
        """The files of one adapter version."""
        return self.adapters_dir / ADAPTER / version

    def settings_file(self, part: str) -> Path:
        """The settings YAML a part is started with."""
        return self.config_dir / f"{part}.yaml"

    def log_file(self, part: str) -> Path:
        """The log of a part started by the stack."""
        return self.logs_dir / f"{part}.log"

    def service_dir(self, part: str) -> Path:
        """The working directory of a service binary (its data and log)."""
        return self.data_dir / part


@dataclass(frozen=True)
class Endpoints:
    """The URLs of every part, from the ports chosen for this run."""

    host: str
    ports: Mapping[str, int]
    regions: tuple[str, ...]
    prometheus_regions: tuple[str, ...] = ()
    """Regions with their own Prometheus (federated by the global one); empty: one Prometheus."""

    def _url(self, part: str) -> str:
        return f"http://{self.host}:{self.ports[part]}"

    @property
    def redis_url(self) -> str:
        """Redis of the job store, routing, delta log, sessions (db 0)."""
        return f"redis://{self.host}:{self.ports['redis']}/0"

    @property
    def session_replica_url(self) -> str:
        """The session replica store (db 1 of the same server)."""
        return f"redis://{self.host}:{self.ports['redis']}/1"

    @property
    def prometheus_url(self) -> str:
        """Prometheus (the global one when each region has its own): rules, alerts, queries."""
        return self._url(GLOBAL_PART)

    @property
    def federated(self) -> bool:
        """True when the global Prometheus federates one Prometheus per region."""
        return bool(self.prometheus_regions)

    def regional_prometheus_url(self, region: str) -> str:
        """The Prometheus of one region."""
        return self._url(regional_part(region))

    @property
    def alertmanager_url(self) -> str:
        """Alertmanager."""
        return self._url("alertmanager")

    @property
    def receiver_url(self) -> str:
        """The remediation receiver (base URL)."""
        return self._url("remediation")

    @property
    def gateway_url(self) -> str:
        """The gateway (OpenAI-compatible)."""
        return self._url("gateway")

    @property
    def exporters_url(self) -> str:
        """The exporter process."""
        return self._url("exporters")

    @property
    def milvus_primary_uri(self) -> str:
        """Milvus Lite of the primary index."""
        return self._url("milvus-primary")

    @property
    def milvus_replica_uri(self) -> str:
        """Milvus Lite of the replica index."""
        return self._url("milvus-replica")

    def simulator_url(self, region: str) -> str:
        """The upstream simulator of a region."""
        return self._url(simulator_part(region))

    @property
    def upstreams(self) -> dict[str, str]:
        """Region -> simulator URL, in failover order."""
        return {region: self.simulator_url(region) for region in self.regions}


def build_endpoints(
    ports: Mapping[str, int],
    regions: Sequence[str],
    host: str = HOST,
    prometheus_regions: Sequence[str] = (),
) -> Endpoints:
    """Endpoints of a run; StackConfigError when a part's port is missing or invalid."""
    parts = build_ported_parts(regions, prometheus_regions)
    missing = [part for part in parts if part not in ports]
    if missing:
        raise StackConfigError(f"no port chosen for: {', '.join(missing)}")
    for part, port in ports.items():
        if not 0 < port < 65536:
            raise StackConfigError(f"port of {part} must be 1..65535, got {port}")
    if len(set(ports.values())) != len(ports):
        raise StackConfigError("two parts were given the same port")
    return Endpoints(host, dict(ports), tuple(regions), tuple(prometheus_regions))


def check_regions(spec: Spec) -> None:
    """The drills need a primary and a secondary region to reroute between."""
    if len(spec.regions) < 2:
        raise StackConfigError(
            f"the local stack needs at least two regions to reroute between; the spec has "
            f"{', '.join(spec.regions)} (add one to `regions`)"
        )


def build_stack_spec(spec: Spec, endpoints: Endpoints, token_file: Path) -> Spec:
    """The spec (local profile already applied) with the receiver pointed at this run's."""
    receiver = Receiver(url=f"{endpoints.receiver_url}/alerts", bearer_token_file=str(token_file))
    return spec.model_copy(update={"receiver": receiver})


def pipeline_budget_seconds(spec: Spec, for_seconds: float, federated: bool = False) -> float:
    """scrape (+ a federation scrape) + eval + for + group_wait: from a fault to a notification."""
    t = spec.timing
    scrapes = 2 if federated else 1
    return (
        scrapes * t.scrape_interval_seconds
        + t.evaluation_interval_seconds
        + for_seconds
        + t.group_wait_seconds
    )


def build_prometheus_config(spec: Spec, endpoints: Endpoints, rule_file: Path) -> dict[str, Any]:
    """prometheus.yml: the profile's scrape/eval intervals, the rules, Alertmanager, targets."""
    t = spec.timing
    scrape = format_duration(t.scrape_interval_seconds)
    host = endpoints.host

    def job(name: str, part: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        target: dict[str, Any] = {"targets": [f"{host}:{endpoints.ports[part]}"]}
        if labels:
            target["labels"] = dict(labels)
        return {"job_name": name, "static_configs": [target]}

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
            job("gateway", "gateway"),
            job("exporters", "exporters"),
            job("remediation", "remediation"),
            job("prometheus", "prometheus"),
            job("alertmanager", "alertmanager"),
        ],
    }


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
    return build_multiregion_configs(spec, base, addresses, job_regions).parts()


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
    region: str, region_index: int, endpoints: Endpoints, layout: StackLayout, seed: int
) -> dict[str, Any]:
    """Settings of one region's upstream simulator, serving the active adapter version."""
    return {
        "host": endpoints.host,
        "port": endpoints.ports[simulator_part(region)],
        "region": region,
        "base_model": BASE_MODEL,
        "adapters": {ADAPTER: str(layout.adapter_dir(ADAPTER_VERSIONS[0]))},
        "seed": seed + region_index,
        "faults": build_healthy_faults(region_index),
        "log_level": "warning",
    }


def _spec_fields(spec_path: Path | None) -> dict[str, Any]:
    return {"spec": str(spec_path) if spec_path is not None else None, "profile": "local"}


def build_gateway_settings(endpoints: Endpoints, spec_path: Path | None) -> dict[str, Any]:
    """Settings of the gateway: every region's simulator in failover order."""
    return {
        "host": endpoints.host,
        "port": endpoints.ports["gateway"],
        "redis_url": endpoints.redis_url,
        **_spec_fields(spec_path),
        "upstreams": endpoints.upstreams,
        "first_byte_budget_seconds": 1.0,
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


def build_exporter_settings(
    spec: Spec, endpoints: Endpoints, layout: StackLayout, spec_path: Path | None
) -> dict[str, Any]:
    """Settings of the exporter process: every probe on, each well inside the stale guard."""
    stale = spec.timing.probe_stale_after_seconds
    # A probe's last success must never look stale between two healthy runs.
    fast = min(1.0, stale / 4)
    slow = min(5.0, stale / 3)
    return {
        "host": endpoints.host,
        "port": endpoints.ports["exporters"],
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
            "interval_seconds": 2.0,
            "timeout_seconds": 3.0,
            "gateway_url": endpoints.gateway_url,
            "models": [ADAPTER],
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
    """The receiver's playbook sections: where each playbook finds what it acts on."""
    return {
        "serving": {
            "gateway_url": endpoints.gateway_url,
            "upstreams": endpoints.upstreams,
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
        # A short hold-down: the drills wait for the routing to be restored before the next one.
        "reroute": {"hold_down_seconds": 3.0, "healthy_checks": 3, "poll_seconds": 0.25},
    }


def build_remediation_settings(
    endpoints: Endpoints, layout: StackLayout, spec_path: Path | None, workers: int
) -> dict[str, Any]:
    """Settings of the receiver and of the worker process (same file, same registry)."""
    return {
        "host": endpoints.host,
        "port": endpoints.ports["remediation"],
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
    """Settings of the load generator (chat traffic, prompt embeddings, adapter checkpoints)."""
    return {
        "redis_url": endpoints.redis_url,
        "gateway_url": endpoints.gateway_url,
        "rate": rate,
        "seed": seed,
        "adapter": ADAPTER,
        "base_model": BASE_MODEL,
        "stats_file": str(layout.loadgen_stats),
        "snapshots_root": str(layout.snapshots_dir),
        "embeddings_stream": EMBEDDINGS_STREAM,
        "embeddings_field": EMBEDDINGS_FIELD,
        "log_level": "info",
    }


@dataclass(frozen=True)
class PartCommand:
    """How a redline part is started: its argv and its settings file."""

    part: str
    argv: tuple[str, ...]
    settings: dict[str, Any]


def build_part_commands(
    spec: Spec,
    endpoints: Endpoints,
    layout: StackLayout,
    spec_path: Path | None,
    rate: float,
    seed: int,
    python: str = sys.executable,
) -> list[PartCommand]:
    """The redline parts (every part but the service binaries), in start order."""
    cli = (python, "-m", "redline.cli")

    def command(part: str, args: Sequence[str], settings: dict[str, Any]) -> PartCommand:
        config = str(layout.settings_file(part))
        return PartCommand(part, (*cli, *args, "--config", config), settings)

    spec_args = ("--spec", str(spec_path)) if spec_path is not None else ()
    commands = [
        command(
            simulator_part(region),
            ("simulate", "upstream"),
            build_simulator_settings(region, index, endpoints, layout, seed),
        )
        for index, region in enumerate(endpoints.regions)
    ]
    # The reroute's hold-down occupies a worker while it waits: run three in two processes.
    receiver = build_remediation_settings(endpoints, layout, spec_path, workers=1)
    workers = build_remediation_settings(endpoints, layout, spec_path, workers=2)
    commands += [
        command("gateway", ("gateway",), build_gateway_settings(endpoints, spec_path)),
        command("remediation", ("remediation",), receiver),
        command("remediation-worker", ("remediation", "worker"), workers),
        command("replicator", ("index", "replicate"), build_index_settings(endpoints)),
        command("session-replica", ("sessions", "replica"), build_session_settings(endpoints)),
        command(
            "session-writer",
            ("sessions", "writer", "--rate", "5", "--sessions", "50", *spec_args),
            build_session_settings(endpoints),
        ),
        command(
            "index-writer",
            ("index", "write-demo", "--count", "1000000000", "--rate", "5", "--batch", "5"),
            build_index_settings(endpoints),
        ),
        command(
            "exporters",
            ("exporters",),
            build_exporter_settings(spec, endpoints, layout, spec_path),
        ),
        command("loadgen", ("loadgen",), build_loadgen_settings(endpoints, layout, rate, seed)),
    ]
    return commands


def render_settings(settings: Mapping[str, Any]) -> str:
    """A settings file's YAML (stable key order, no anchors)."""
    header = "# Written by redline up for this run; regenerated on every start.\n"
    return header + yaml.safe_dump(dict(settings), sort_keys=True, default_flow_style=False)
