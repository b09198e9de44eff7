"""Shard encryption and its checks, pure: AES-256-GCM with a fresh nonce per shard, the name,
shard id and key version bound as associated data, and the manifest's own consistency."""

from __future__ import annotations

import hashlib
import secrets

import pytest
from pydantic import ValidationError

from redline.platform.weights.errors import ShardIntegrityError
from redline.platform.weights.keyring import Dek
from redline.platform.weights.shards import (
    MAGIC,
    NONCE_BYTES,
    OVERHEAD,
    ShardEntry,
    ShardManifest,
    decrypt_shard,
    encrypt_shard,
)

DEK = Dek(3, secrets.token_bytes(32))
WHERE = "s3://bucket/weights/m/shards/x"


def _entry(plaintext: bytes, blob: bytes, shard_id: str, index: int = 0) -> ShardEntry:
    return ShardEntry(
        index=index,
        offset=0,
        size=len(plaintext),
        shard_id=shard_id,
        key_version=DEK.version,
        plaintext_sha256=hashlib.sha256(plaintext).hexdigest(),
        ciphertext_sha256=hashlib.sha256(blob).hexdigest(),
        ciphertext_size=len(blob),
    )


def test_round_trip_with_a_fresh_nonce() -> None:
    plaintext = b"weights" * 1000
    shard_id, blob = encrypt_shard(DEK, "m", plaintext)
    _, again = encrypt_shard(DEK, "m", plaintext)
    assert shard_id == f"{hashlib.sha256(plaintext).hexdigest()}-v3"
    assert blob.startswith(MAGIC) and len(blob) == len(plaintext) + OVERHEAD
    assert blob[4 : 4 + NONCE_BYTES] != again[4 : 4 + NONCE_BYTES]  # never the same nonce
    assert decrypt_shard(DEK, "m", _entry(plaintext, blob, shard_id), blob, WHERE) == plaintext


def test_the_gcm_tag_catches_what_the_hashes_cannot() -> None:
    """A tamperer who also rewrote the manifest's ciphertext hash still fails the tag check."""
    plaintext = b"x" * 4096
    shard_id, blob = encrypt_shard(DEK, "m", plaintext)
    tampered = bytearray(blob)
    tampered[100] ^= 0x01
    entry = _entry(plaintext, bytes(tampered), shard_id)
    with pytest.raises(ShardIntegrityError, match="AES-GCM tag check") as caught:
        decrypt_shard(DEK, "m", entry, bytes(tampered), WHERE)
    assert caught.value.key == WHERE and WHERE in str(caught.value)


def test_associated_data_binds_name_and_key() -> None:
    plaintext = b"y" * 5000
    shard_id, blob = encrypt_shard(DEK, "m", plaintext)
    entry = _entry(plaintext, blob, shard_id)
    with pytest.raises(ShardIntegrityError, match="tag check"):
        decrypt_shard(DEK, "other-model", entry, blob, WHERE)  # moved to another name
    other_key = Dek(3, secrets.token_bytes(32))
    with pytest.raises(ShardIntegrityError, match="tag check"):
        decrypt_shard(other_key, "m", entry, blob, WHERE)


def test_size_and_hash_checks_come_first() -> None:
    plaintext = b"z" * 5000
    shard_id, blob = encrypt_shard(DEK, "m", plaintext)
    entry = _entry(plaintext, blob, shard_id)
    with pytest.raises(ShardIntegrityError, match=r"truncated: 10 of 5032 bytes"):
        decrypt_shard(DEK, "m", entry, blob[:10], WHERE)
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(ShardIntegrityError, match="was altered"):
        decrypt_shard(DEK, "m", entry, flipped, WHERE)


def test_manifest_must_be_contiguous() -> None:
    plaintext = b"a" * 10
    shard_id, blob = encrypt_shard(DEK, "m", plaintext)
    entry = _entry(plaintext, blob, shard_id)
    fields = {
        "name": "m",
        "version": "v1",
        "keyring": "default",
        "shard_size": 10,
        "weights_sha256": "0" * 64,
        "created_at": 1.0,
    }
    manifest = ShardManifest(
        **fields, total_size=20, shards=[entry, entry.model_copy(update={"index": 1, "offset": 10})]
    )
    assert manifest.key_versions() == [3]  # one distinct shard object
    with pytest.raises(ValidationError, match="cover 10 bytes"):
        ShardManifest(**fields, total_size=20, shards=[entry])
    with pytest.raises(ValidationError, match="out of order"):
        ShardManifest(**fields, total_size=20, shards=[entry, entry])
    with pytest.raises(ValidationError, match="shard_id does not match"):
        ShardEntry.model_validate({**entry.model_dump(), "key_version": 4})
