"""Settings of `redline exporters`: the service settings plus one section per probe.

Sources, highest first: command-line flags, `REDLINE_*` environment variables (nested with `__`,
e.g. `REDLINE_MODELS__INTERVAL_SECONDS=5`), the `--config` YAML file, defaults. Sections merge
field by field, so the environment can change one field of a section the file configures.
Thresholds (staleness, RPO, keep-alive, drift) come from the spec, not from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

from redline.core.settings import ServiceSettings, SettingsError, load_settings_file
from redline.exporters.consistency import ConsistencySettings
from redline.exporters.evaluations import EvaluationsSettings
from redline.exporters.index_consistency import MILVUS_GRACEFUL_TIME_SECONDS
from redline.exporters.keepalive import KeepaliveSettings
from redline.exporters.llm_probes import EndpointProbeSettings, GoldenSetSettings
from redline.exporters.mutation import MutationSettings
from redline.exporters.session_crdt import SessionCrdtSettings
from redline.exporters.session_rpo import SessionRpoSettings
from redline.platform.index import IndexTargetsFields
from redline.platform.weights.settings import KeyringSettings, S3StoreSettings

DEFAULT_PORT = 9109


class ProbeSection(BaseModel):
    """What every probe section has: an on/off switch and an interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Run this probe.")
    interval_seconds: PositiveFloat = Field(15.0, description="Seconds between two runs.")


class ModelsSection(ProbeSection):
    """Model versions, baselines and adapter checkpoints from the snapshot registry.

    The same registry gives the `model_version` of golden-set answers and evaluation verdicts
    (its active pointer per model), even when `enabled` is false.
    """

    root: Path = Field(Path("var/snapshots"), description="Root directory of the registry.")
    version_ttl_seconds: PositiveFloat = Field(
        1.0,
        description="Seconds a model's active version is cached when labelling golden answers "
        "and verdicts (a rollback shows within this).",
    )
    models: tuple[str, ...] = Field((), description="Models to publish; empty: every model.")
    max_versions: int = Field(10, ge=1, description="Verified versions with baselines per model.")


class IndexStalenessSection(IndexTargetsFields, ProbeSection):
    """Canary staleness and delta-log backlog of one replicated vector collection."""

    interval_seconds: PositiveFloat = Field(5.0, description="Seconds between two runs.")
    redis_url: str | None = Field(None, description="Redis of the delta log; default: service.")
    collection: str = Field("documents", description="Logical collection (names the delta log).")
    dim: PositiveInt = Field(384, description="Vector dimension.")
    region: str = Field("primary", description="Region the canary is written as.")
    milvus_token: SecretStr | None = Field(None, description="Milvus token (from env only).")
    milvus_token_file: Path | None = Field(None, description="File holding the Milvus token.")
    timeout_seconds: PositiveFloat = Field(2.0, description="Timeout of Redis and Milvus calls.")
    consistency_check: bool = Field(
        True,
        description="Also publish both collections' consistency level and its staleness bound "
        "(probe `index_consistency`, read-only; its first run logs a WARNING per collection "
        "whose reads may be staler than the red line).",
    )
    consistency_interval_seconds: PositiveFloat = Field(
        60.0, description="Seconds between two consistency-level checks."
    )
    bounded_staleness_seconds: PositiveFloat = Field(
        MILVUS_GRACEFUL_TIME_SECONDS,
        description="How stale a Bounded read may be: the Milvus servers' `common.gracefulTime` "
        "(milvus.yaml, 5000 ms by default), which no collection setting or API call exposes.",
    )


class WeightsSection(ProbeSection):
    """The `weights` section of `redline exporters`: which bucket, weights, regions, keyrings."""

    enabled: bool = Field(False, description="Run this probe (it needs `store`).")
    interval_seconds: PositiveFloat = Field(30.0, description="Seconds between two runs.")
    store: S3StoreSettings | None = Field(
        None, description="The source region's bucket (records, shards, sync tables)."
    )
    models: tuple[str, ...] = Field((), description="Weights names whose versions to watch.")
    regions: tuple[str, ...] = Field(
        (), description="Regions the weights are synced to (their sync tables in `store`)."
    )
    keyrings: tuple[KeyringSettings, ...] = Field(
        (KeyringSettings(),),
        description="Keyrings by name (rotation and retention: the spec's weights: section).",
    )
    adapters: tuple[str, ...] = Field(
        (), description="LoRA adapters whose checkpoint must exist; empty: every one found."
    )
    checkpoints: bool = Field(True, description="Publish checkpoint ages from object versions.")

    @model_validator(mode="after")
    def _store_when_enabled(self) -> WeightsSection:
        if self.enabled and self.store is None:
            raise ValueError("weights.store is required when weights.enabled is true")
        return self


class DriftSection(ProbeSection):
    """Embedding drift of the newest window against the reference (method, window: the spec)."""

    interval_seconds: PositiveFloat = Field(60.0, description="Seconds between two runs.")
    source: Literal["milvus", "redis_stream"] = Field(
        "milvus", description="Where the window comes from."
    )
    reference: Path | None = Field(
        None, description="Reference .npy; default: spec drift.reference."
    )
    milvus_uri: str = Field("http://127.0.0.1:19530", description="Milvus holding the collection.")
    milvus_token: SecretStr | None = Field(None, description="Milvus token (from env only).")
    milvus_token_file: Path | None = Field(None, description="File holding the Milvus token.")
    vector_field: str = Field("embedding", description="Vector field of the collection.")
    time_field: str = Field("ts_ms", description="Insert-time field (ms since the epoch).")
    redis_url: str | None = Field(None, description="Redis of the stream; default: service.")
    stream: str = Field("embeddings", description="Stream of recent embeddings.")
    stream_field: str = Field("vector", description="Entry field holding one vector.")
    encoding: Literal["float32", "json"] = Field("float32", description="Vector encoding.")
    use_spec_threshold: bool = Field(
        False, description="Use the spec's fixed drift.threshold instead of the calibrated one."
    )


class CanaryLeaseSection(BaseModel):
    """The Redis lease that elects, among exporter replicas, the one running the probes that
    write canaries (index staleness, keep-alive, mutation, consistency)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | None = Field(
        None,
        description="Elect one canary runner through a Redis lease; unset: on when `redis_url` "
        "is set (file, environment or flag), off with the built-in default URL.",
    )
    redis_url: str | None = Field(None, description="Redis holding the lease; default: service.")
    key: str = Field("redline:exporters:canary-lease", min_length=1, description="Lease key.")
    ttl_seconds: PositiveFloat = Field(
        10.0,
        description="Lease TTL: a replica whose holder died takes over within this plus "
        "`renew_seconds`; the holder renews every `renew_seconds`.",
    )
    renew_seconds: PositiveFloat | None = Field(
        None, description="Seconds between two acquire-or-renew attempts; default: TTL / 3."
    )


class ExporterSettings(ServiceSettings):
    """Settings of the exporter process."""

    model_config = SettingsConfigDict(
        env_prefix="REDLINE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    created_series: bool = Field(
        False, description="Expose `_created` series of counters and histograms (off: cheaper)."
    )
    gzip: bool = Field(True, description="Compress /metrics when the scraper accepts gzip.")
    probe_timeout_seconds: PositiveFloat = Field(
        30.0,
        description="A probe run still going after max(this, the probe's interval) reports "
        "failure (the probe is hung).",
    )
    probe_timeouts: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="Per-probe hang timeouts by probe name."
    )
    models: ModelsSection = Field(default_factory=ModelsSection)
    endpoints: EndpointProbeSettings = Field(default_factory=EndpointProbeSettings)
    golden_set: GoldenSetSettings = Field(default_factory=GoldenSetSettings)
    consistency: ConsistencySettings = Field(default_factory=ConsistencySettings)
    mutation: MutationSettings = Field(default_factory=MutationSettings)
    evaluations: EvaluationsSettings = Field(default_factory=EvaluationsSettings)
    index_staleness: IndexStalenessSection = Field(default_factory=IndexStalenessSection)
    session_rpo: SessionRpoSettings = Field(default_factory=SessionRpoSettings)
    keepalive: KeepaliveSettings = Field(default_factory=KeepaliveSettings)
    session_crdt: SessionCrdtSettings = Field(default_factory=SessionCrdtSettings)
    drift: DriftSection = Field(default_factory=DriftSection)
    weights: WeightsSection = Field(default_factory=WeightsSection)
    canary_lease: CanaryLeaseSection = Field(default_factory=CanaryLeaseSection)

    @property
    def canary_lease_enabled(self) -> bool:
        """Whether the canary lease elects one runner (`canary_lease.enabled`, else whether
        `redis_url` was set rather than left at its built-in default)."""
        if self.canary_lease.enabled is not None:
            return self.canary_lease.enabled
        return "redis_url" in self.model_fields_set or self.canary_lease.redis_url is not None

    @property
    def listen_port(self) -> int:
        """The port to listen on (`port`, or the exporter's default when 0)."""
        return self.port or DEFAULT_PORT


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k).replace("-", "_"): _normalise(v) for k, v in value.items()}
    return value


def load_exporter_settings(config: Path | None = None, **overrides: Any) -> ExporterSettings:
    """Build ExporterSettings from defaults < config file < environment < non-None overrides."""
    file_values: dict[str, Any] = {}
    source = str(config) if config is not None else "environment"
    if config is not None:
        file_values = _normalise(load_settings_file(config))
    explicit = {k: v for k, v in overrides.items() if v is not None}
    try:
        from_env = ExporterSettings().model_dump(exclude_unset=True)
    except ValidationError as exc:
        raise SettingsError(_render("environment (REDLINE_*)", exc)) from None
    try:
        return ExporterSettings.model_validate(
            _deep_merge(_deep_merge(file_values, from_env), explicit)
        )
    except ValidationError as exc:
        raise SettingsError(_render(source, exc)) from None


def _render(source: str, exc: ValidationError) -> str:
    return "\n".join(
        f"{source}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )
