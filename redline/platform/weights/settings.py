"""Settings of the weights adapters: object storage, the PKCS#11 KEK, AWS KMS, the keyring and
the shards. Pydantic models (frozen, extra fields refused) that a service's settings embed; a bad
value fails with the field's name. Secrets are never fields here: S3 credentials come from the
standard boto3 chain (environment, shared files, instance role), the PIN from a file or the
environment through `redline.core.settings.read_secret`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

DEFAULT_SHARD_SIZE = 4 * 1024 * 1024
DEFAULT_PKCS11_MODULE = Path("/usr/lib/softhsm/libsofthsm2.so")
"""Debian's SoftHSM2 module path (package softhsm2); production points at the HSM's module."""

# S3's bucket naming rules (no dots: virtual-host addressing over TLS breaks on them).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class S3StoreSettings(_Settings):
    """Where records and shards live on S3-compatible object storage (one region's bucket)."""

    bucket: str = Field(description="Bucket name (S3 rules: 3-63 of a-z, 0-9 and '-').")
    endpoint_url: str | None = Field(
        None, description="S3 endpoint (http(s)://host:port); None: AWS's for the region."
    )
    region: str = Field("us-east-1", min_length=1, description="Region name for signing.")
    prefix: str = Field("", description="Key prefix inside the bucket ('' or ending in '/').")
    allow_unlocked: bool = Field(
        False,
        description="Accept a bucket without versioning or Object Lock default retention "
        "(logged as a warning): development only.",
    )
    profile: str | None = Field(None, description="boto3 profile (None: the default chain).")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="S3 addressing style; 'path' for most self-hosted servers."
    )
    connect_timeout_seconds: float = Field(5.0, gt=0, description="TCP connect timeout.")
    read_timeout_seconds: float = Field(30.0, gt=0, description="Read timeout per request.")
    max_attempts: int = Field(3, ge=1, le=10, description="botocore attempts per request.")

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, value: str) -> str:
        if not _BUCKET.match(value) or "--" in value[:4]:
            raise ValueError(
                f"bucket {value!r} is not a valid S3 bucket name (3-63 characters of a-z, "
                "0-9 and '-', starting and ending with a letter or digit)"
            )
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+/?$", value):
            raise ValueError(f"endpoint_url {value!r} must look like http(s)://host:port")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if value and (value.startswith("/") or not value.endswith("/") or "//" in value):
            raise ValueError(f"prefix {value!r} must be empty or like 'a/b/' (no leading '/')")
        return value


class Pkcs11Settings(_Settings):
    """The HSM holding the KEK: module, token, KEK label and the user PIN."""

    module_path: Path = Field(DEFAULT_PKCS11_MODULE, description="PKCS#11 module (.so).")
    token_label: str = Field(min_length=1, description="Label of the token holding the KEK.")
    kek_label: str = Field(min_length=1, description="Label of the AES KEK on the token.")
    pin: SecretStr = Field(repr=False, description="User PIN (from a file or the environment).")


class KmsSettings(_Settings):
    """The AWS KMS key that wraps DEKs."""

    key_id: str = Field(min_length=1, description="KMS key id, ARN or alias/NAME.")
    region: str = Field("us-east-1", min_length=1, description="KMS region.")
    endpoint_url: str | None = Field(None, description="KMS endpoint (None: AWS's).")
    profile: str | None = Field(None, description="boto3 profile (None: the default chain).")


MOVED_TO_SPEC = {
    "rotation_hours": "weights.dek_rotation_hours",
    "retention_days": "weights.dek_retention_days",
}
"""Keyring settings that moved to the spec, and where they live now."""


class KeyringSettings(_Settings):
    """A keyring by name. Its rotation and retention are the spec's (`weights.dek_rotation_hours`,
    `weights.dek_retention_days`), never a service's setting: the rotation the alert judges, the
    one the exporter publishes and the one the playbooks rotate by must be one number."""

    name: str = Field("default", pattern=r"^[A-Za-z0-9._-]+$", description="Keyring name.")

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict):
            moved = [
                f"{key} (now the spec's {to})" for key, to in MOVED_TO_SPEC.items() if key in data
            ]
            if moved:
                raise ValueError(
                    f"{', '.join(moved)}: DEK rotation and retention are set in the spec's "
                    "weights: section, for every keyring"
                )
        return data


class ShardSettings(_Settings):
    """How weights are cut into encrypted shards."""

    shard_size: int = Field(
        DEFAULT_SHARD_SIZE,
        ge=4096,
        le=1024 * 1024 * 1024,
        description="Plaintext bytes per shard (the last one may be shorter).",
    )
