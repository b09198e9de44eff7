"""Errors of the weights adapters: every message names the setting, object key or field."""

from __future__ import annotations


class WeightsError(Exception):
    """Base of the weights adapters' errors."""


class RecordStoreError(WeightsError):
    """A record store cannot be read or written (I/O, permissions, an unreachable endpoint)."""


class RecordConflictError(RecordStoreError):
    """A conditional write lost a race: the record changed (or appeared) since it was read."""


class StoreSettingsError(WeightsError):
    """Object storage settings or the bucket they name cannot be used."""


class UnprotectedBucketError(StoreSettingsError):
    """The bucket lacks versioning or an Object Lock default retention (and allow_unlocked is
    off)."""


class KeyWrapError(WeightsError):
    """A KEK could not wrap or unwrap a DEK."""


class KeyModuleError(KeyWrapError):
    """The PKCS#11 module (library) is missing or cannot be loaded."""


class TokenNotFoundError(KeyWrapError):
    """No PKCS#11 token carries the configured label."""


class TokenLoginError(KeyWrapError):
    """No user can log in: the token refused the PIN, its user PIN is locked, expired or not
    initialised, or the token is not initialised or in an error state."""


class KekNotFoundError(KeyWrapError):
    """The token or KMS has no KEK with the configured label or id."""


class UnwrapError(KeyWrapError):
    """A wrapped DEK was rejected: the wrong KEK, or the blob was corrupted."""


class KeyringError(WeightsError):
    """The DEK keyring cannot give the key asked for."""


class DekNotFoundError(KeyringError):
    """No DEK record of that version exists."""


class DekExpiredError(KeyringError):
    """The DEK was retired longer ago than the retention allows: it decrypts nothing any more."""


class DekRevokedError(KeyringError):
    """The DEK was revoked: it decrypts nothing."""


class ShardError(WeightsError):
    """A shard set or its manifest is unusable."""


class ManifestError(ShardError):
    """A manifest is missing, malformed, or inconsistent with itself."""


class ShardIntegrityError(ShardError):
    """A shard is missing, truncated or tampered with (hash or GCM tag mismatch)."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class SyncError(WeightsError):
    """A cross-region copy could not be made or verified."""
