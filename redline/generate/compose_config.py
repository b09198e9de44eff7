"""The compose stack's configuration for one installation (`redline compose init`).

`compose/docker-compose.yml` is the same for everyone; what differs between installations is
built here from the spec and a few options, and written to `compose/config/` (and the secrets to
`compose/secrets/`, by the command): the spec itself, Prometheus' and Alertmanager's configs and
the rule file (with the spec's timing profile applied), and one settings file per redline
service, each pointing at the compose services by their host names. With `demo` the upstreams
are the simulators and the demo writers run (the `demo` compose profile); otherwise every region
names its real OpenAI-compatible upstream and the index names its real Milvus pair.

With `redis="sentinel"` the `ha` compose profile runs a replica of `redis` and three Sentinels
(their config files are written here): every service then reaches Redis through the Sentinels
(`redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/redline/<db>`) and
follows a failover.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from redline.generate.compose import (
    RULE_FILE,
    SERVICE_PORTS,
    build_compose_alertmanager_config,
    build_compose_prometheus_config,
    compose_url,
)
from redline.rules.build import build_rule_groups
from redline.rules.render import render_rule_file, render_yaml
from redline.slo.load import apply_profile
from redline.slo.spec import Spec

CONFIG_DIR = "config"
SECRETS_DIR = "secrets"
ENV_FILE = ".env"
CONTAINER_CONFIG = "/etc/redline"
CONTAINER_SECRETS = "/run/secrets"
DATA_DIR = "/var/lib/redline"
SNAPSHOTS_DIR = f"{DATA_DIR}/snapshots"
SECRETS = ("webhook-token", "admin-token")
"""Files `redline compose init` creates with a random value when they are missing."""
SECRETS_GID = 10001
"""The group that reads the secrets in the containers: the redline image's user's group, and a
supplementary group of the Alertmanagers (`group_add`). Compose mounts a file secret with its
host owner and mode (uid/gid/mode apply to Swarm only), so a 0600 file would be unreadable by
a container user other than its host owner; 0640 to this group keeps it from everyone else."""
SECRET_MODE = 0o640
DEMO_SIMULATORS = ("simulator-primary", "simulator-secondary")
"""The compose file's simulator services, one per region of the spec, in failover order."""
DEMO_PROFILES = ("demo", "milvus")
DEMO_MODEL = "redline-base"
DEMO_COLLECTION = "documents"
DEMO_DIM = 128
PRIMARY_INDEX = "primary"
REPLICA_INDEX = "replica"
HEADER = "# Written by `redline compose init`; run it again after changing the spec.\n"
RedisTopology = Literal["single", "sentinel"]
REDIS_TOPOLOGIES: tuple[RedisTopology, ...] = ("single", "sentinel")
HA_PROFILE = "ha"
"""The compose profile of the replica and the Sentinels."""
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
"""The compose file's Sentinel services (quorum 2 of 3)."""
SENTINEL_PORT = 26379
SENTINEL_MASTER = "redline"
"""The master name the Sentinels monitor (the same as `redline up --redis sentinel`)."""
SENTINEL_QUORUM = 2
SENTINEL_DOWN_AFTER_MS = 5000
"""How long the primary must be unreachable before a Sentinel calls it down: long enough for a
container restart not to cause a failover, short enough to bound the 503s of a real one."""
SENTINEL_FAILOVER_TIMEOUT_MS = 60000


class ComposeConfigError(Exception):
    """The options cannot make a working compose configuration (the message says why)."""


@dataclass(frozen=True)
class ComposeOptions:
    """What `redline compose init` is told about the installation."""

    demo: bool = False
    """Simulated upstreams and demo writers (the `demo` and `milvus` compose profiles)."""
    upstreams: Mapping[str, str] = field(default_factory=dict)
    """Region -> the region's OpenAI-compatible base URL (every region of the spec)."""
    pods: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Region -> its pods' base URLs, for a rollback on every pod (default: the upstream)."""
    model: str | None = None
    """The model the probes ask (default: the demo's base model, or the first listed)."""
    milvus_primary_uri: str = compose_url("milvus-primary")
    milvus_replica_uri: str = compose_url("milvus-replica")
    collection: str = DEMO_COLLECTION
    dim: int = DEMO_DIM
    profile: str | None = None
    """The spec's timing profile (`local`: drills close their loop in seconds)."""
    redis: RedisTopology = "single"
    """`single`: the one `redis` service; `sentinel`: + a replica and three Sentinels (`ha`)."""

    @property
    def compose_profiles(self) -> tuple[str, ...]:
        """The compose profiles this installation runs (sorted, as compose/.env lists them)."""
        profiles = (*(DEMO_PROFILES if self.demo else ()), *self.redis_profiles)
        return tuple(sorted(profiles))

    @property
    def redis_profiles(self) -> tuple[str, ...]:
        """The profiles of the Redis topology."""
        return (HA_PROFILE,) if self.redis == "sentinel" else ()


def redis_url(options: ComposeOptions, database: int = 0) -> str:
    """The Redis URL every service uses: the `redis` service, or its Sentinels."""
    if options.redis == "sentinel":
        hosts = ",".join(f"{name}:{SENTINEL_PORT}" for name in SENTINELS)
        return f"redis+sentinel://{hosts}/{SENTINEL_MASTER}/{database}"
    return compose_url("redis", "redis", database=database)


def render_sentinel_config(announce: str) -> str:
    """The config a Sentinel starts from (it rewrites its own copy): monitor `redis` by its
    service name, announce itself by its own, so container restarts (new IPs) change nothing."""
    lines = [
        f"port {SENTINEL_PORT}",
        "dir /data",
        # Names, not IPs: before `monitor`, which names the primary by its service name.
        "sentinel resolve-hostnames yes",
        "sentinel announce-hostnames yes",
        f"sentinel announce-ip {announce}",
        f"sentinel monitor {SENTINEL_MASTER} redis {SERVICE_PORTS['redis']} {SENTINEL_QUORUM}",
        f"sentinel down-after-milliseconds {SENTINEL_MASTER} {SENTINEL_DOWN_AFTER_MS}",
        f"sentinel failover-timeout {SENTINEL_MASTER} {SENTINEL_FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {SENTINEL_MASTER} 1",
    ]
    return HEADER + "\n".join(lines) + "\n"


def build_upstreams(spec: Spec, options: ComposeOptions) -> dict[str, str]:
    """Region -> upstream URL in failover order; ComposeConfigError naming what is missing."""
    if options.demo:
        if len(spec.regions) > len(DEMO_SIMULATORS):
            raise ComposeConfigError(
                f"the demo simulates {len(DEMO_SIMULATORS)} regions; the spec has "
                f"{len(spec.regions)} ({', '.join(spec.regions)})"
            )
        return {r: compose_url(s) for r, s in zip(spec.regions, DEMO_SIMULATORS, strict=False)}
    unknown = sorted(set(options.upstreams) - set(spec.regions))
    if unknown:
        raise ComposeConfigError(
            f"--upstream {', '.join(unknown)}: not a region of the spec "
            f"(allowed: {', '.join(spec.regions)})"
        )
    missing = [region for region in spec.regions if region not in options.upstreams]
    if missing:
        raise ComposeConfigError(
            "every region needs its upstream: add "
            + " ".join(f"--upstream {region}=URL" for region in missing)
            + " (or --demo for simulated upstreams)"
        )
    return {region: options.upstreams[region] for region in spec.regions}


def _service(name: str, options: ComposeOptions) -> dict[str, Any]:
    """The fields every redline service shares: where it listens, Redis, the spec."""
    return {
        "host": "0.0.0.0",
        "port": SERVICE_PORTS[name],
        "redis_url": redis_url(options),
        "spec": f"{CONTAINER_CONFIG}/spec.yaml",
        "log_level": "info",
    }


def _profiled(options: ComposeOptions) -> dict[str, Any]:
    return {"profile": options.profile} if options.profile else {}


def _index_targets(options: ComposeOptions) -> dict[str, Any]:
    return {
        "collection": options.collection,
        "dim": options.dim,
        "primary_uri": options.milvus_primary_uri,
        "primary_name": PRIMARY_INDEX,
        "replica_uri": options.milvus_replica_uri,
        "replica_name": REPLICA_INDEX,
    }


def build_gateway_settings(upstreams: Mapping[str, str], options: ComposeOptions) -> dict[str, Any]:
    """The gateway: the regions' upstreams in failover order, admin behind the admin token."""
    return {
        **_service("gateway", options),
        **_profiled(options),
        "upstreams": dict(upstreams),
        "snapshots_root": SNAPSHOTS_DIR,
        "admin_token_file": f"{CONTAINER_SECRETS}/admin-token",
    }


def build_exporter_settings(
    spec: Spec, upstreams: Mapping[str, str], options: ComposeOptions
) -> dict[str, Any]:
    """The exporter: every probe against the compose services and the real upstreams."""
    region = spec.regions[0]
    model = options.model or (DEMO_MODEL if options.demo else None)
    return {
        **_service("exporters", options),
        **_profiled(options),
        "models": {"root": SNAPSHOTS_DIR},
        "endpoints": {"upstreams": dict(upstreams), **({"model": model} if model else {})},
        "golden_set": {
            "gateway_url": compose_url("gateway"),
            **({"models": [model]} if model else {}),
        },
        "index_staleness": {**_index_targets(options), "region": region},
        "keepalive": {"replica_url": redis_url(options, database=1)},
        # Drift needs a reference set of embeddings: mount one and enable it (docs/compose.md).
        "drift": {"enabled": False},
    }


def build_remediation_settings(
    upstreams: Mapping[str, str], options: ComposeOptions
) -> dict[str, Any]:
    """The receiver and its workers: every playbook's settings, so none refuses to start."""
    pods = {region: {"urls": list(urls)} for region, urls in options.pods.items()}
    fast = {"hold_down_seconds": 3.0, "restore_for_seconds": 5.0} if options.demo else {}
    return {
        **_service("remediation", options),
        **_profiled(options),
        "token_file": f"{CONTAINER_SECRETS}/webhook-token",
        "audit_file": f"{DATA_DIR}/audit/audit.jsonl",
        "workers": 2,
        "serving": {
            "gateway_url": compose_url("gateway"),
            "upstreams": dict(upstreams),
            **({"pods": pods} if pods else {}),
            **({"probe_model": options.model or DEMO_MODEL} if options.demo else {}),
        },
        "rollback": {"snapshot_root": SNAPSHOTS_DIR},
        "vector_index": {
            "redis_url": redis_url(options),
            "collections": {
                options.collection: {
                    key: value
                    for key, value in _index_targets(options).items()
                    if key != "collection"
                }
            },
        },
        "reroute": {**fast, "prometheus_url": compose_url("prometheus")},
    }


def build_index_settings(spec: Spec, options: ComposeOptions) -> dict[str, Any]:
    """The index replicator (and the demo writer): the delta log and the Milvus pair; the spec,
    for its `redis.min_replicas_ack` (an acknowledged write waits for the replica)."""
    return {
        "redis_url": redis_url(options),
        "spec": f"{CONTAINER_CONFIG}/spec.yaml",
        **_index_targets(options),
        "region": spec.regions[0],
        "log_level": "info",
    }


def build_session_settings(options: ComposeOptions) -> dict[str, Any]:
    """The session CDC consumer (and the demo writer): primary db 0, replica db 1."""
    return {
        "redis_url": redis_url(options),
        "replica_url": redis_url(options, database=1),
        "log_level": "info",
    }


def build_simulator_settings(region: str, name: str) -> dict[str, Any]:
    """One demo simulator: a region's OpenAI-compatible upstream with fault knobs."""
    return {
        "host": "0.0.0.0",
        "port": SERVICE_PORTS[name],
        "region": region,
        "base_model": DEMO_MODEL,
        "log_level": "warning",
    }


def build_loadgen_settings(options: ComposeOptions) -> dict[str, Any]:
    """The demo's chat traffic through the gateway (base model: the demo loads no adapter)."""
    return {
        "redis_url": redis_url(options),
        "gateway_url": compose_url("gateway"),
        "rate": 20.0,
        "base_model": DEMO_MODEL,
        "adapter_share": 0.0,
        "snapshots_root": SNAPSHOTS_DIR,
        "stats_file": f"{DATA_DIR}/loadgen-stats.json",
        "log_level": "info",
    }


def render_settings(settings: Mapping[str, Any]) -> str:
    """A settings file's YAML (stable key order)."""
    return HEADER + yaml.safe_dump(dict(settings), sort_keys=True, default_flow_style=False)


def render_env(options: ComposeOptions) -> str:
    """compose/.env: the profiles docker compose starts (it reads this file by itself)."""
    return HEADER + f"COMPOSE_PROFILES={','.join(options.compose_profiles)}\n"


def build_compose_config(spec: Spec, spec_text: str, options: ComposeOptions) -> dict[str, str]:
    """Every file of `compose/config/` (name -> text) and `compose/.env` (as `../.env`)."""
    upstreams = build_upstreams(spec, options)
    timed = apply_profile(spec, options.profile) if options.profile else spec
    groups = build_rule_groups(timed)
    source = "the spec in compose/config/spec.yaml"
    files = {
        "spec.yaml": spec_text,
        "prometheus.yml": render_yaml(build_compose_prometheus_config(timed), source),
        "alertmanager.yml": render_yaml(build_compose_alertmanager_config(timed), source),
        RULE_FILE: render_rule_file(groups, source),
        "gateway.yml": render_settings(build_gateway_settings(upstreams, options)),
        "exporters.yml": render_settings(build_exporter_settings(spec, upstreams, options)),
        "remediation.yml": render_settings(build_remediation_settings(upstreams, options)),
        "index.yml": render_settings(build_index_settings(spec, options)),
        "sessions.yml": render_settings(build_session_settings(options)),
        f"../{ENV_FILE}": render_env(options),
    }
    if options.demo:
        for region, name in zip(spec.regions, DEMO_SIMULATORS, strict=False):
            files[f"{name}.yml"] = render_settings(build_simulator_settings(region, name))
        files["loadgen.yml"] = render_settings(build_loadgen_settings(options))
    if options.redis == "sentinel":
        for name in SENTINELS:
            files[f"{name}.conf"] = render_sentinel_config(name)
    return files


__all__ = [
    "CONFIG_DIR",
    "ComposeConfigError",
    "ComposeOptions",
    "ENV_FILE",
    "REDIS_TOPOLOGIES",
    "SENTINELS",
    "redis_url",
    "render_sentinel_config",
    "SECRETS",
    "SECRETS_DIR",
    "build_compose_config",
    "build_upstreams",
]
