"""The local stack's shape: what the demo runs, its parts, its run directory and its URLs.

Pure: every name here is a function of the spec's regions, the ports chosen for a run and the run
directory. The settings files each part is started with are built in `redline.devstack.config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from redline.devstack.multiregion import GLOBAL_PART, regional_part
from redline.generate.outputs import ALERTMANAGER_FILE, RULE_FILE
from redline.platform.golden import EMBEDDING_DIMS
from redline.slo.spec import Spec

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
REDIS_TOPOLOGIES = ("single", "sentinel")
"""`redline up --redis`: one redis-server (the default), or a primary, a replica and three
Sentinels, every part given the Sentinel URL (docs/redis.md)."""
SENTINEL_MASTER = "redline"
"""The master name the stack's Sentinels monitor."""
REDIS_REPLICA_PART = "redis-replica"
SENTINEL_PARTS = ("sentinel-1", "sentinel-2", "sentinel-3")
SENTINEL_QUORUM = 2
TRACE_STORE_PART = "trace-store"
"""The local stack's trace backend (`redline.devstack.tracestore`): the gateway exports its spans
there over OTLP/HTTP; it starts before the gateway."""
TAIL_PARTS = (
    TRACE_STORE_PART,
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
SESSION_SYNC_PREFIX = "session-sync-"
"""The CRDT session sync into a region (`session-sync-<region>`): one per direction between
the first two regions, each region's CRDT sessions in a Redis database of its own."""
CRDT_SESSION_DBS = (0, 2)
"""Redis databases of the first and second region's CRDT session stores (db 1 is the CDC
replica)."""
HTTP_PARTS = frozenset({TRACE_STORE_PART, "gateway", "remediation", "exporters"})
OPTIONAL_PARTS = frozenset({TRACE_STORE_PART})
"""Ported parts a run may go without: a state file written before the part existed, or a stack
standing in for the local one (the compose stack run as processes, whose Jaeger does not run)."""
GATEWAY_PART = "gateway"
GATEWAY_SOURCE = "redline-gateway"
"""The default stack: clients go through redline's gateway, whose series feed the rules."""
STACK_SOURCES = (GATEWAY_SOURCE, "vllm")
"""What `redline up --source` accepts: redline's gateway, or an engine profile the simulator can
publish (`vllm`: the simulators publish vLLM's exposition and no gateway is started)."""
CONTROL_PLANE_JOBS = ("remediation", "alertmanager")
"""With one Prometheus per region, these scrape jobs belong to the last region's Prometheus (the
control plane runs there); the serving path (gateway, exporters) stays in the first region."""


REPLICATED_PARTS = ("gateway", "remediation", "exporters")
"""Parts `redline up --replicas N` runs N of: `<part>`, `<part>-2`, ... (docs/redis.md)."""
MAX_REPLICAS = 3


class StackConfigError(Exception):
    """The stack cannot be configured as asked (e.g. a spec with one region, a bad port)."""


DEFAULT_PODS = 2
"""Simulator pods per region (`redline up --pods N`): a change made through a region's URL
reaches one pod, so the rollback must act on every pod and the drills prove it does."""
MAX_PODS = 8


def simulator_part(region: str, pod: int) -> str:
    """The part name of one simulator pod of a region (`simulator-<region>-<n>`)."""
    return f"simulator-{region}-{pod}"


def pod_name(region: str, pod: int) -> str:
    """The `pod` target label of one simulator pod (`<region>-<n>`)."""
    return f"{region}-{pod}"


def service_part(region: str) -> str:
    """The part name of a region's service front (`service-<region>`): the round-robin proxy
    over the region's pods, standing in for a Kubernetes Service."""
    return f"service-{region}"


def check_pods(pods: int) -> None:
    """StackConfigError unless 1 <= pods <= MAX_PODS."""
    if not 1 <= pods <= MAX_PODS:
        raise StackConfigError(f"--pods {pods}: the local stack runs 1 to {MAX_PODS} pods a region")


def check_replicas(replicas: int) -> None:
    """StackConfigError unless 1 <= replicas <= MAX_REPLICAS."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise StackConfigError(
            f"--replicas {replicas}: the local stack runs 1 to {MAX_REPLICAS} replicas of "
            f"{', '.join(REPLICATED_PARTS)}"
        )


def replica_part(part: str, index: int) -> str:
    """The part name of replica `index` (from 0) of a replicated part: `gateway`, `gateway-2`."""
    return part if index == 0 else f"{part}-{index + 1}"


def replica_parts(part: str, replicas: int) -> tuple[str, ...]:
    """Every replica's part name of a replicated part (the first is the part itself)."""
    return tuple(replica_part(part, i) for i in range(replicas))


def replica_base(name: str) -> str:
    """The replicated part a replica's name stands for (`gateway-2` -> `gateway`); any other
    name unchanged."""
    base, _, number = name.rpartition("-")
    return base if base in REPLICATED_PARTS and number.isdigit() else name


def build_serving_parts(regions: Sequence[str], pods: int) -> tuple[str, ...]:
    """Every region's simulator pods, then every region's service front (start order)."""
    simulators = tuple(simulator_part(r, i) for r in regions for i in range(pods))
    return (*simulators, *(service_part(r) for r in regions))


def check_redis_topology(redis: str) -> None:
    """StackConfigError unless the local stack can run this Redis topology."""
    if redis not in REDIS_TOPOLOGIES:
        raise StackConfigError(
            f"--redis {redis}: the local stack runs {', '.join(REDIS_TOPOLOGIES)}"
        )


def build_redis_ha_parts(redis: str = "single") -> tuple[str, ...]:
    """What a Sentinel topology adds after the primary (`redis`): the replica, then the
    Sentinels (started in that order, once the primary runs); nothing for `single`."""
    return (REDIS_REPLICA_PART, *SENTINEL_PARTS) if redis == "sentinel" else ()


def build_service_parts(prometheus_regions: Sequence[str] = ()) -> tuple[str, ...]:
    """The service binaries: a Prometheus per region (if asked for) before the global one."""
    regional = tuple(regional_part(r) for r in prometheus_regions)
    at = SERVICE_PARTS.index(GLOBAL_PART)
    return (*SERVICE_PARTS[:at], *regional, *SERVICE_PARTS[at:])


def has_gateway(source: str) -> bool:
    """True when the stack of this source puts redline's gateway in the path."""
    return source == GATEWAY_SOURCE


def check_source(source: str) -> None:
    """StackConfigError unless the local stack can run this source."""
    if source not in STACK_SOURCES:
        raise StackConfigError(
            f"--source {source}: the local stack runs {', '.join(STACK_SOURCES)} (the simulator "
            "publishes redline's gateway series or vLLM's exposition)"
        )


def session_sync_part(region: str) -> str:
    """The part name of the CRDT session sync into `region`."""
    return f"{SESSION_SYNC_PREFIX}{region}"


def build_session_sync_parts(regions: Sequence[str]) -> tuple[str, ...]:
    """The two sync directions between the first two regions (into the second, then back);
    none with fewer than two regions."""
    if len(regions) < 2:
        return ()
    first, second = regions[0], regions[1]
    return (session_sync_part(second), session_sync_part(first))


def _replicated(parts: Sequence[str], replicas: int) -> tuple[str, ...]:
    """`parts` with each replicated part followed by its further replicas."""
    out: list[str] = []
    for part in parts:
        out += replica_parts(part, replicas) if part in REPLICATED_PARTS else [part]
    return tuple(out)


def _tail_parts(source: str, regions: Sequence[str], replicas: int = 1) -> tuple[str, ...]:
    tail = TAIL_PARTS if has_gateway(source) else tuple(p for p in TAIL_PARTS if p != GATEWAY_PART)
    at = tail.index("session-writer") + 1
    return _replicated((*tail[:at], *build_session_sync_parts(regions), *tail[at:]), replicas)


def _http_parts(source: str, replicas: int = 1) -> list[str]:
    http = HTTP_PARTS if has_gateway(source) else HTTP_PARTS - {GATEWAY_PART}
    return sorted(_replicated(sorted(http), replicas))


def build_part_names(
    regions: Sequence[str],
    prometheus_regions: Sequence[str] = (),
    source: str = GATEWAY_SOURCE,
    pods: int = DEFAULT_PODS,
    redis: str = "single",
    replicas: int = 1,
) -> tuple[str, ...]:
    """Every part in start order (stop order is the reverse); no gateway for an engine source."""
    services = (*build_service_parts(prometheus_regions), *build_redis_ha_parts(redis))
    tail = _tail_parts(source, regions, replicas)
    return (*services, *build_serving_parts(regions, pods), *tail)


def build_ported_parts(
    regions: Sequence[str],
    prometheus_regions: Sequence[str] = (),
    source: str = GATEWAY_SOURCE,
    pods: int = DEFAULT_PODS,
    redis: str = "single",
    replicas: int = 1,
) -> tuple[str, ...]:
    """The parts that listen on a TCP port."""
    services = (*build_service_parts(prometheus_regions), *build_redis_ha_parts(redis))
    http = _http_parts(source, replicas)
    return (*services, *build_serving_parts(regions, pods), *http)


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
    def loadgen_pause(self) -> Path:
        """While this file exists the load generator sends nothing new (a drill's night)."""
        return self.data_dir / "loadgen-paused"

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
    source: str = GATEWAY_SOURCE
    """`redline-gateway`, or the engine profile the simulators publish (no gateway then)."""
    pods: int = DEFAULT_PODS
    """Simulator pods per region, behind the region's service front."""
    hosts: Mapping[str, str] = field(default_factory=dict)
    """Parts listening on an address of their own (the compose stack run as processes gives
    each service a loopback address, as compose gives each container one); others on `host`."""
    redis: str = "single"
    """The Redis topology (`single`, `sentinel`): with Sentinels every Redis URL is theirs."""
    replicas: int = 1
    """Replicas of the gateway, the receiver and the exporter (`redline up --replicas`)."""

    def address(self, part: str) -> str:
        """`host:port` of a part."""
        return f"{self.hosts.get(part, self.host)}:{self.ports[part]}"

    def _url(self, part: str) -> str:
        return f"http://{self.address(part)}"

    @property
    def sentinel(self) -> bool:
        """True when Redis runs as a primary, a replica and Sentinels."""
        return self.redis == "sentinel"

    def redis_db_url(self, db: int) -> str:
        """A database of the stack's Redis: the server's URL, or the Sentinels' (which find
        the current primary) in a Sentinel topology."""
        if self.sentinel:
            sentinels = ",".join(self.address(part) for part in SENTINEL_PARTS)
            return f"redis+sentinel://{sentinels}/{SENTINEL_MASTER}/{db}"
        return f"redis://{self.address('redis')}/{db}"

    @property
    def redis_url(self) -> str:
        """Redis of the job store, routing, delta log, sessions (db 0)."""
        return self.redis_db_url(0)

    @property
    def session_replica_url(self) -> str:
        """The session replica store (db 1 of the same server)."""
        return self.redis_db_url(1)

    @property
    def crdt_session_urls(self) -> dict[str, str]:
        """The first two regions' CRDT session stores (databases of the stack's Redis)."""
        pairs = zip(self.regions[:2], CRDT_SESSION_DBS, strict=False)
        return {region: self.redis_db_url(db) for region, db in pairs}

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
        """The remediation receiver (base URL; the first replica's)."""
        return self._url("remediation")

    def replica_urls(self, part: str) -> list[str]:
        """The base URLs of every replica of a replicated part (the part's own first)."""
        return [self._url(name) for name in replica_parts(part, self.replicas)]

    @property
    def receiver_urls(self) -> list[str]:
        """Every receiver replica (Alertmanager notifies each)."""
        return self.replica_urls("remediation")

    @property
    def exporters_urls(self) -> list[str]:
        """Every exporter replica."""
        return self.replica_urls("exporters")

    @property
    def gateway_urls(self) -> list[str]:
        """Every gateway replica (the load generator spreads over them); none without one."""
        return self.replica_urls(GATEWAY_PART) if self.has_gateway else []

    @property
    def has_gateway(self) -> bool:
        """True when redline's gateway is in the path (the default stack)."""
        return has_gateway(self.source)

    @property
    def gateway_url(self) -> str:
        """The gateway (OpenAI-compatible); StackConfigError in a stack without one."""
        if not self.has_gateway:
            raise StackConfigError(f"the {self.source} stack runs no gateway")
        return self._url(GATEWAY_PART)

    @property
    def client_url(self) -> str:
        """Where clients (load generator, golden probe, baselines) send their requests: the
        gateway, or without one the first region's service (its engine pods) directly."""
        return self.gateway_url if self.has_gateway else self.service_url(self.regions[0])

    @property
    def has_trace_store(self) -> bool:
        """True when this run has the trace store (every `redline up` since it was added)."""
        return TRACE_STORE_PART in self.ports

    @property
    def trace_store_url(self) -> str:
        """The trace store (its read API: /api/traces); StackConfigError in a run without one."""
        if not self.has_trace_store:
            raise StackConfigError("this run has no trace store")
        return self._url(TRACE_STORE_PART)

    @property
    def otlp_traces_url(self) -> str:
        """Where OTLP/HTTP exporters send spans (the trace store's /v1/traces)."""
        return f"{self.trace_store_url}/v1/traces"

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

    def service_url(self, region: str) -> str:
        """A region's service front: what the gateway, the probes and clients call, as they
        would call a Kubernetes Service (one pod answers each request)."""
        return self._url(service_part(region))

    def pod_parts(self, region: str) -> list[str]:
        """The part names of a region's simulator pods."""
        return [simulator_part(region, i) for i in range(self.pods)]

    def pod_urls(self, region: str) -> list[str]:
        """The base URLs of a region's simulator pods (fault knobs, LoRA API, status)."""
        return [self._url(part) for part in self.pod_parts(region)]

    def pod_address(self, region: str, pod: int) -> str:
        """`host:port` of one simulator pod (a scrape target)."""
        return self.address(simulator_part(region, pod))

    @property
    def upstreams(self) -> dict[str, str]:
        """Region -> its service front's URL, in failover order."""
        return {region: self.service_url(region) for region in self.regions}


def build_endpoints(
    ports: Mapping[str, int],
    regions: Sequence[str],
    host: str = HOST,
    prometheus_regions: Sequence[str] = (),
    source: str = GATEWAY_SOURCE,
    pods: int = DEFAULT_PODS,
    hosts: Mapping[str, str] | None = None,
    redis: str = "single",
    replicas: int = 1,
) -> Endpoints:
    """Endpoints of a run; StackConfigError when a part's port is missing or invalid."""
    check_source(source)
    check_pods(pods)
    check_redis_topology(redis)
    check_replicas(replicas)
    parts = build_ported_parts(regions, prometheus_regions, source, pods, redis, replicas)
    missing = [part for part in parts if part not in ports and part not in OPTIONAL_PARTS]
    if missing:
        raise StackConfigError(f"no port chosen for: {', '.join(missing)}")
    for part, port in ports.items():
        if not 0 < port < 65536:
            raise StackConfigError(f"port of {part} must be 1..65535, got {port}")
    hosts = dict(hosts or {})
    # Parts given an address of their own are placed deliberately (a compose service can stand
    # for two parts, a pod and its region's service); the ports picked on `host` must differ.
    shared = [port for part, port in ports.items() if part not in hosts]
    if len(set(shared)) != len(shared):
        raise StackConfigError("two parts were given the same address")
    return Endpoints(
        host,
        dict(ports),
        tuple(regions),
        tuple(prometheus_regions),
        source,
        pods,
        hosts,
        redis,
        replicas,
    )


def check_regions(spec: Spec) -> None:
    """The drills need a primary and a secondary region to reroute between."""
    if len(spec.regions) < 2:
        raise StackConfigError(
            f"the local stack needs at least two regions to reroute between; the spec has "
            f"{', '.join(spec.regions)} (add one to `regions`)"
        )
