"""The `prompt_log:` section of the gateway's settings: where the log lives, what it keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from redline.platform.redaction import DEFAULT_KINDS, RedactionError, Redactor, build_redactor


class PromptLogSettings(BaseModel):
    """The `prompt_log:` section of the gateway's settings (off unless `enabled`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Append every answered request to the prompt log.")
    directory: Path = Field(Path("prompt-log"), description="Directory of the log's files.")
    redis_url: str | None = Field(
        None, description="Redis of the anchors and the session index (None: the service's)."
    )
    key_prefix: str = Field("redline", min_length=1, description="Redis key prefix.")
    store: Literal["text", "hashes"] = Field(
        "text", description="text: the redacted prompt and answer; hashes: their SHA-256 only."
    )
    redact: list[str] = Field(
        default_factory=lambda: sorted(DEFAULT_KINDS),
        description="Built-in redaction kinds (card, api_key, bearer, secret, email, phone, ip).",
    )
    patterns: dict[str, str] = Field(
        default_factory=dict, description="Extra redactions: name -> regex ([REDACTED:name])."
    )
    batch_size: int = Field(512, ge=1, le=65536, description="Most records per batch.")
    flush_seconds: float = Field(0.5, gt=0, description="Longest a record waits for its batch.")
    queue_size: int = Field(10000, ge=1, description="Records waiting at most (more: dropped).")
    fsync: bool = Field(True, description="fsync the files before anchoring each batch.")
    segment_bytes: int = Field(
        16 << 20,
        ge=4096,
        description="A batch starts a new segment file once the current one holds this much.",
    )

    def redactor(self) -> Redactor:
        """The configured redactor (RedactionError when a kind or pattern is unusable)."""
        return build_redactor(frozenset(self.redact), self.patterns)

    @model_validator(mode="after")
    def _check_redaction(self) -> PromptLogSettings:
        try:
            self.redactor()
        except RedactionError as exc:
            raise ValueError(str(exc)) from None
        return self
