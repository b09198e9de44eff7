"""Settings of the remediation receiver and workers (`REDLINE_*` env, `--config FILE`, flags)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from redline.core.settings import ServiceSettings, SettingsError, read_secret
from redline.platform.endpoints import PodSource, check_base_url
from redline.platform.index import IndexTargetsFields
from redline.platform.routing import DEFAULT_PREFIX as ROUTING_PREFIX
from redline.slo.spec import PlaybookPolicy

DEFAULT_PORT = 9095
DEFAULT_REGISTRY = "redline.remediation.catalog:open_registry"


# ---------------------------------------------------------------------------------------------
# Dependencies of the built-in playbooks (remediation/playbooks/), read by their
# `from_settings`. Every section may stay unset: a playbook whose dependencies are not configured
# is still registered; the start-up check names the setting to set (its jobs would fail).

_REGION = re.compile(r"^[a-z][a-z0-9-]*$")
_CLASS_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServingSettings(_Section):
    """The serving layer the rollback and reroute playbooks talk to (over HTTP only)."""

    gateway_url: str | None = Field(
        None, description="Gateway base URL: golden set after a rollback, reroute verification."
    )
    upstreams: dict[str, str] = Field(
        default_factory=dict,
        description="Regional vLLM-compatible upstreams in failover order: region -> base URL.",
    )
    probe_model: str | None = Field(
        None, description="Model of dry-run probes (None: the first of the upstream's /v1/models)."
    )
    timeout_seconds: float = Field(10.0, gt=0, description="Timeout of each HTTP call.")
    pods: dict[str, PodSource] = Field(
        default_factory=dict,
        description="Per region, how to find every pod behind its URL (urls, dns or "
        "kubernetes); a region not listed is one pod, its upstream URL (rollback).",
    )

    @field_validator("gateway_url")
    @classmethod
    def _gateway(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value, "gateway_url")

    @field_validator("upstreams")
    @classmethod
    def _upstreams(cls, value: dict[str, str]) -> dict[str, str]:
        for region in value:
            if not _REGION.match(region):
                raise ValueError(f"region {region!r} must be lowercase letters, digits and '-'")
        return {region: check_base_url(url, f"upstream {region}") for region, url in value.items()}

    @field_validator("pods")
    @classmethod
    def _pods(cls, value: dict[str, PodSource]) -> dict[str, PodSource]:
        for region in value:
            if not _REGION.match(region):
                raise ValueError(f"region {region!r} must be lowercase letters, digits and '-'")
        return value


class RollbackSettings(_Section):
    """`semantic_rollback`: where snapshots live, how to tell the serving layer, the gates."""

    snapshot_root: Path | None = Field(None, description="Root of the snapshot registry.")
    hook_url: str | None = Field(
        None,
        description="POSTed the restored snapshot instead of calling the upstreams' LoRA API.",
    )
    hook_token_file: Path | None = Field(None, description="Bearer token file for the hook.")
    accuracy_tolerance: float = Field(
        0.008,
        ge=0,
        le=1,
        description="Golden accuracy may be this far below the snapshot's baseline (spec: 0.8 pp).",
    )
    similarity_threshold: float = Field(
        0.97, gt=0, le=1, description="Least mean answer-embedding similarity to the references."
    )
    max_candidates: int = Field(3, ge=1, description="Older verified snapshots tried at most.")
    golden_max_tokens: int = Field(32, ge=1, description="max_tokens of each golden request.")
    golden_concurrency: int = Field(
        4, ge=1, le=64, description="Golden prompts asked at once of one pod or the gateway."
    )

    @field_validator("hook_url")
    @classmethod
    def _hook(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value, "hook_url")


class IndexCollectionSettings(IndexTargetsFields, _Section):
    """One logical collection: its dimension and where its primary and replica live."""

    dim: int = Field(gt=0, description="Vector dimension.")
    # A playbook must never act on an index by default: both copies are named explicitly.
    primary_uri: str = Field(description="Milvus URI of the primary.")
    replica_uri: str = Field(description="Milvus URI of the replica.")


class VectorIndexSettings(_Section):
    """`freeze_writes`, `delta_log_replay`, `freeze_and_replay`: the delta log and its targets."""

    redis_url: str | None = Field(
        None, description="Redis holding the delta log (None: the receiver's redis_url)."
    )
    collections: dict[str, IndexCollectionSettings] = Field(
        default_factory=dict, description="Logical collection (the alert's label) -> targets."
    )
    milvus_token_file: Path | None = Field(None, description="File holding the Milvus token.")
    milvus_timeout_seconds: float = Field(10.0, gt=0, description="Timeout of Milvus calls.")
    batch_size: int = Field(1000, ge=1, description="Delta-log entries applied per batch.")
    lease_ttl_seconds: float = Field(15.0, gt=0, description="Applier lease on a target.")
    lease_wait_seconds: float = Field(
        60.0, gt=0, description="Longest wait for another applier to release a target."
    )
    max_rows_per_second: float | None = Field(
        None, gt=0, description="Throttle of the replay (None: as fast as Milvus takes it)."
    )
    compact: bool = Field(True, description="Compact the replica after the replay.")


class RerouteSettings(_Section):
    """`reroute`: the routing store the gateway reads, verification, hold-down and restore.

    The routing is restored when the region is healthy by the red line (the spec's
    `red_lines.latency_p99.threshold_seconds` x `restore.below_ratio`, without a break for
    `restore.for_seconds`): measured by this playbook's own dry-run probes of the region and,
    with `prometheus_url`, by the exporter's probe durations and the recorded P99 of the region.
    """

    redis_url: str | None = Field(
        None, description="Redis of the routing store (None: the receiver's redis_url)."
    )
    key_prefix: str = Field(ROUTING_PREFIX, min_length=1, description="Routing store key prefix.")
    hold_down_seconds: float = Field(
        300.0, ge=0, description="Wait after the alert resolved before restoring the routing."
    )
    healthy_checks: int = Field(
        3, ge=1, description="Dry-run probes of the region per check; all must be fast."
    )
    restore_check_seconds: float = Field(
        10.0, gt=0, description="Interval of the checks while the job waits to restore."
    )
    restore_for_seconds: float | None = Field(
        None, ge=0, description="Override of the spec's restore.for_seconds (drills)."
    )
    prometheus_url: str | None = Field(
        None, description="Prometheus with the exporter's probes and the recorded P99 (optional)."
    )
    verify_timeout_seconds: float = Field(
        10.0, gt=0, description="Longest wait for the gateway to serve from the new region."
    )
    poll_seconds: float = Field(0.25, gt=0, description="Interval of probes and re-checks.")
    override_ttl_seconds: float | None = Field(
        None, gt=0, description="The override lapses by itself after this (None: until cleared)."
    )

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value, "prometheus_url")


class RemediationSettings(ServiceSettings):
    """Receiver, job store, worker and audit-trail settings."""

    webhook_token: SecretStr | None = Field(
        None, description="Bearer token Alertmanager sends (env REDLINE_WEBHOOK_TOKEN)."
    )
    token_file: Path | None = Field(None, description="File holding the bearer token.")
    allow_unauthenticated: bool = Field(
        False,
        description="Serve every endpoint without a token (logged as a warning; tests only).",
    )
    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="Largest accepted request body; larger gets 413."
    )
    key_prefix: str = Field(
        "redline:remediation", min_length=1, description="Prefix of every Redis key used."
    )
    dry_run: bool = Field(False, description="Plan only: every job returns its plan, no change.")
    workers: int = Field(1, ge=0, description="Worker threads run beside the receiver.")
    playbooks: str = Field(
        DEFAULT_REGISTRY,
        description="`module:function(settings)` returning the registry (the default builds "
        "every playbook class: built-in, `redline.playbooks` entry points, playbook_classes).",
    )
    playbook_classes: list[str] = Field(
        default_factory=list,
        description="More playbook classes, each `module:ClassName` (a `Playbook` subclass), "
        "registered beside the built-in ones and the `redline.playbooks` entry points.",
    )
    playbook_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per-playbook options, keyed by playbook name; each validated against the "
        "playbook's `Options` at start-up.",
    )
    policies: dict[str, PlaybookPolicy] = Field(
        default_factory=dict,
        description="Per-playbook mode/budget/breaker/deadline; replaces the spec's "
        "remediation.playbooks entry of the same name.",
    )
    audit_file: Path | None = Field(None, description="JSONL mirror of the audit trail.")
    audit_verify_interval_seconds: float = Field(
        60.0,
        gt=0,
        description="How often `/metrics` re-verifies the whole audit chain (and the mirror).",
    )
    retention_seconds: int = Field(
        30 * 86400, ge=60, description="How long jobs and idempotency keys are kept."
    )
    lock_ttl_seconds: float = Field(
        30.0, gt=0, description="Expiry of a target lock; renewed every third of it."
    )
    claim_idle_seconds: float = Field(
        60.0, gt=0, description="A job idle this long (its worker died) is reclaimed."
    )
    max_attempts: int = Field(5, ge=1, description="Attempts before a job ends failed.")
    backoff_initial_seconds: float = Field(1.0, gt=0, description="First retry delay.")
    backoff_max_seconds: float = Field(60.0, gt=0, description="Longest retry delay.")
    lock_wait_seconds: float = Field(
        0.5, gt=0, description="Delay before retrying a job whose target is locked."
    )
    poll_seconds: float = Field(
        1.0, gt=0, description="Longest a worker blocks waiting for a job (also its reclaim tick)."
    )

    # ---- dependencies of the built-in playbooks (sections defined above) --------------------
    serving: ServingSettings = Field(
        default_factory=ServingSettings, description="Gateway and upstreams (rollback, reroute)."
    )
    rollback: RollbackSettings = Field(
        default_factory=RollbackSettings, description="semantic_rollback settings."
    )
    vector_index: VectorIndexSettings = Field(
        default_factory=VectorIndexSettings,
        description="freeze_writes / delta_log_replay / freeze_and_replay settings.",
    )
    reroute: RerouteSettings = Field(
        default_factory=RerouteSettings, description="reroute settings."
    )

    @property
    def playbook_state_prefix(self) -> str:
        """Prefix of the Redis keys the playbooks keep their own state under."""
        return f"{self.key_prefix}:playbook"

    @field_validator("playbook_classes")
    @classmethod
    def _class_references(cls, value: list[str]) -> list[str]:
        for index, reference in enumerate(value):
            if not _CLASS_REFERENCE.match(reference):
                raise ValueError(
                    f"item {index}, {reference!r}, is not of the form module:ClassName "
                    "(e.g. mycompany.playbooks:RestartPods)"
                )
        return value

    def resolve_token(self) -> SecretStr:
        """The bearer token (file first, then env); SettingsError when neither is set."""
        token = read_secret(self.token_file, self.webhook_token, "webhook token")
        if token is None or not token.get_secret_value():
            raise SettingsError(
                "webhook token: set --token-file FILE or the REDLINE_WEBHOOK_TOKEN variable"
            )
        return token
