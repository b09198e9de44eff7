"""Settings of the remediation receiver and workers (`REDLINE_*` env, `--config FILE`, flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr

from redline.settings import ServiceSettings, SettingsError, read_secret

DEFAULT_PORT = 9095
DEFAULT_REGISTRY = "redline.remediation.catalog:build_registry"


class RemediationSettings(ServiceSettings):
    """Receiver, job store, worker and audit-trail settings."""

    webhook_token: SecretStr | None = Field(
        None, description="Bearer token Alertmanager sends (env REDLINE_WEBHOOK_TOKEN)."
    )
    token_file: Path | None = Field(None, description="File holding the bearer token.")
    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="Largest accepted request body; larger gets 413."
    )
    key_prefix: str = Field(
        "redline:remediation", min_length=1, description="Prefix of every Redis key used."
    )
    dry_run: bool = Field(False, description="Plan only: every job returns its plan, no change.")
    workers: int = Field(1, ge=0, description="Worker threads run beside the receiver.")
    playbooks: str = Field(
        DEFAULT_REGISTRY, description="`module:function(settings)` returning the registry."
    )
    playbook_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per-playbook options, keyed by playbook name."
    )
    audit_file: Path | None = Field(None, description="JSONL mirror of the audit trail.")
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

    def resolve_token(self) -> SecretStr:
        """The bearer token (file first, then env); SettingsError when neither is set."""
        token = read_secret(self.token_file, self.webhook_token, "webhook token")
        if token is None or not token.get_secret_value():
            raise SettingsError(
                "webhook token: set --token-file FILE or the REDLINE_WEBHOOK_TOKEN variable"
            )
        return token
