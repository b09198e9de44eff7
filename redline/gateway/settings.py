"""Settings of `redline gateway`: upstreams, reroute budgets, routing store, ledger and spot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from redline.core.settings import ServiceSettings, SettingsError, read_secret
from redline.platform.promptlog import PromptLogSettings
from redline.platform.routing import DEFAULT_PREFIX
from redline.platform.spot import DEFAULT_LEDGER_PREFIX
from redline.slo.spec import Breakers

DEFAULT_GATEWAY_PORT = 8080
_REGION = re.compile(r"^[a-z][a-z0-9-]*$")


class GatewayConfigError(Exception):
    """The gateway cannot start with these settings (e.g. no upstreams)."""


class BreakerOverrides(BaseModel):
    """The gateway's changes to the spec's `breakers` section (unset fields keep the spec's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | None = None
    error_rate: float | None = None
    window: str | None = None
    p99_seconds: float | None = None
    min_requests: int | None = None
    open_for: str | None = None
    half_open_probes: int | None = None

    def apply(self, breakers: Breakers) -> Breakers:
        """The spec's section with these overrides, validated as the spec is (GatewayConfigError
        naming the field otherwise)."""
        changes = self.model_dump(exclude_none=True)
        if not changes:
            return breakers
        try:
            return Breakers.model_validate({**breakers.model_dump(), **changes})
        except ValidationError as exc:
            problems = "; ".join(
                f"breakers.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise GatewayConfigError(problems) from None


class GatewaySettings(ServiceSettings):
    """Settings of `redline gateway`."""

    upstreams: dict[str, str] = Field(
        default_factory=dict,
        description="Regional upstreams in failover order: region -> base URL (first = primary).",
    )
    first_byte_budget_seconds: float | None = Field(
        1.0,
        gt=0,
        description="Reroute when the first response byte takes longer (None: never).",
    )
    connect_timeout_seconds: float = Field(0.5, gt=0, description="TCP connect timeout.")
    request_timeout_seconds: float = Field(
        60.0, gt=0, description="Longest wait for any read from an upstream."
    )
    routing_refresh_seconds: float = Field(
        0.5, gt=0, le=1, description="How often the routing state is read from Redis."
    )
    routing_key_prefix: str = Field(DEFAULT_PREFIX, description="Key prefix of the routing store.")
    redis_timeout_seconds: float = Field(0.25, gt=0, description="Redis socket timeouts.")
    unhealthy_after_failures: int = Field(
        3, ge=0, description="Consecutive failures that mark a region unhealthy (0: never)."
    )
    unhealthy_cooldown_seconds: float = Field(
        5.0, gt=0, description="How long an unhealthy region is tried last."
    )
    max_body_bytes: int = Field(8 << 20, ge=1024, description="Largest request body accepted.")
    max_model_labels: int = Field(32, ge=1, description="Distinct `model` label values kept.")
    inject_stream_usage: bool = Field(
        True, description="Ask upstreams for usage in streams, and strip it if not asked for."
    )
    max_connections: int = Field(
        512, ge=1, description="Idle keep-alive connections kept per upstream."
    )
    first_byte_budget_streaming_only: bool = Field(
        False, description="Apply the first-byte budget to streamed requests only."
    )
    created_series: bool = Field(False, description="Expose the `_created` series.")
    admin_token_file: Path | None = Field(
        None,
        description="File with the bearer token every /admin endpoint requires. With neither "
        "it nor admin_token nor admin_open, /admin answers 403.",
    )
    admin_token: SecretStr | None = Field(
        None, description="The admin bearer token itself (env REDLINE_ADMIN_TOKEN; the file wins)."
    )
    admin_open: bool = Field(
        False,
        description="Serve /admin without a token (logged as a warning at start-up; a trusted "
        "network or tests only). Exclusive with a token.",
    )
    ledger_key_prefix: str = Field(
        DEFAULT_LEDGER_PREFIX, min_length=1, description="Key prefix of the request ledger."
    )
    ledger_ttl_seconds: float = Field(
        3600.0, gt=0, description="How long an interrupted request can be resumed."
    )
    spot_default_tpot_seconds: float = Field(
        0.05, gt=0, description="Time per output token assumed until a node's is measured."
    )
    spot_unknown_remaining_tokens: int = Field(
        512, ge=1, description="Tokens assumed left for a request without max_tokens."
    )
    spot_retry_after_ms: int = Field(
        0, ge=0, description="Retry hint of the SPOT_PREEMPTION error event."
    )
    balance: Literal["failover", "round_robin"] = Field(
        "failover",
        description="failover: the configured order; round_robin: spread requests over the "
        "open upstreams (replicas of one pool), in turn.",
    )
    snapshots_root: Path | None = Field(
        None,
        description="Snapshot registry root: `model_version` is the active version of the "
        "requested model there (cached version_ttl_seconds; no file read per request), then the "
        "upstream's x-redline-model-version header for a model the registry has no active "
        'snapshot of, then "unknown". Unset: the header only, which only redline\'s simulator '
        "sends (the local stack's drills); behind vLLM, SGLang or TGI set this, or every "
        'request is "unknown" and the two-signal gate cannot fire.',
    )
    version_ttl_seconds: float = Field(
        1.0, gt=0, description="Seconds a model's active version is cached (snapshots_root)."
    )
    breakers: BreakerOverrides = Field(
        default_factory=BreakerOverrides,
        description="Overrides of the spec's `breakers` (e.g. env REDLINE_BREAKERS="
        "'{\"enabled\": false}'); unset fields keep the spec's values.",
    )
    spill_regions: list[str] = Field(
        default_factory=list,
        description="Upstreams used only when every other one is closed, unhealthy or failed "
        "(an on-demand pool behind spot replicas).",
    )
    prompt_log: PromptLogSettings = Field(
        default_factory=PromptLogSettings,
        description="The tamper-evident prompt log (redline.platform.promptlog; off unless "
        "prompt_log.enabled): answered requests, redacted, appended by a background writer.",
    )
    tracing: bool | None = Field(
        None,
        description="OpenTelemetry traces (redline.gateway.tracing, configured by the OTEL_* "
        "variables). Unset: on only when OTEL_EXPORTER_OTLP_ENDPOINT or "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; OTEL_SDK_DISABLED=true turns it off.",
    )

    quotas: bool | None = Field(
        None,
        description="Enforce the token quotas (intent classification, token estimation, Redis "
        "buckets). Unset: as the spec's quotas.enabled (or quotas_file's) says.",
    )
    quotas_file: Path | None = Field(
        None,
        description="YAML file with a `quotas:` section replacing the spec's (validated as the "
        "spec is), so quotas change without touching the spec.",
    )
    quota_key_prefix: str = Field(
        "redline:quota:", min_length=1, description="Key prefix of the quota buckets in Redis."
    )
    intent_classifier: str | None = Field(
        None,
        description="Your intent classifier as 'module:attribute' (an object with "
        "classify(payload) or a callable(payload) -> intent); unset: rules + naive Bayes.",
    )
    tokenizer: str | None = Field(
        None, description="'tiktoken:<encoding>' to count prompt tokens with tiktoken."
    )
    tokenizer_file: Path | None = Field(
        None, description="A HuggingFace tokenizers JSON file to count prompt tokens with."
    )
    max_tenant_labels: int = Field(
        64, ge=1, description="Distinct header-named `tenant` label values kept."
    )

    @field_validator("upstreams")
    @classmethod
    def _check_upstreams(cls, value: dict[str, str]) -> dict[str, str]:
        for region, url in value.items():
            if not _REGION.match(region):
                raise ValueError(f"region {region!r} must be lowercase letters, digits and '-'")
            try:
                parsed = urlsplit(url)
                valid = parsed.scheme in ("http", "https") and bool(parsed.hostname)
                valid = valid and (parsed.port or 1) > 0
            except ValueError:
                valid = False
            if not valid:
                raise ValueError(f"upstream {region}: {url!r} is not an http(s) URL")
        return value

    @model_validator(mode="after")
    def _check_spill(self) -> GatewaySettings:
        unknown = [r for r in self.spill_regions if r not in self.upstreams]
        if unknown:
            raise ValueError(f"spill_regions {unknown} are not among the upstreams")
        return self

    @model_validator(mode="after")
    def _check_admin(self) -> GatewaySettings:
        if self.admin_open and (self.admin_token_file is not None or self.admin_token):
            raise ValueError(
                "admin_open: true and an admin token (admin_token_file or REDLINE_ADMIN_TOKEN) "
                "are exclusive; keep the token, or remove it to open /admin"
            )
        return self

    def resolve_admin_token(self) -> str | None:
        """The admin bearer token (file first, then env); None when neither is set;
        GatewayConfigError when the file cannot be read or is empty."""
        try:
            secret = read_secret(self.admin_token_file, self.admin_token, "admin_token_file")
        except SettingsError as exc:
            raise GatewayConfigError(str(exc)) from None
        if secret is None:
            return None
        token = secret.get_secret_value().strip()
        if not token:
            raise GatewayConfigError("admin_token (REDLINE_ADMIN_TOKEN) is empty")
        return token
