"""Encrypted shards on real object storage with DEKs wrapped by a real HSM KEK: write, full and
incremental verification, tampered and truncated shards named by key, the fallback to the last
verified version, and loads refusing an expired DEK."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from redline.platform.weights.errors import DekExpiredError, ManifestError, ShardIntegrityError
from redline.platform.weights.keyring import Keyring
from redline.platform.weights.keys import Pkcs11KeyWrapper
from redline.platform.weights.s3store import S3RecordStore
from redline.platform.weights.settings import DEFAULT_SHARD_SIZE, ShardSettings
from redline.platform.weights.shards import (
    list_versions,
    load_manifest,
    load_verdict,
    load_weights,
    manifest_key,
    read_shard,
    select_verified,
    shard_key,
    verify_full,
    verify_incremental,
    write_shards,
    write_verdict,
)

T0 = 1_800_000_000.0
SMALL = ShardSettings(shard_size=4096)
NAME = "org/chat-7b"


@pytest.fixture()
def keyring(locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper) -> Keyring:
    return Keyring(locked_store, wrapper)


def _weights(path: Path, size: int, seed: int = 1) -> Path:
    path.write_bytes(bytes((i * 31 + seed) % 251 for i in range(size)))
    return path


def _flip(store: S3RecordStore, key: str, at: int = 40) -> None:
    found = store.get(key)
    assert found is not None
    data = bytearray(found[0])
    data[at] ^= 0x01
    store.put(key, bytes(data))  # a new latest version (the old one stays, locked)


def test_default_shards_round_trip(
    locked_store: S3RecordStore, keyring: Keyring, tmp_path: Path
) -> None:
    assert ShardSettings().shard_size == DEFAULT_SHARD_SIZE == 4 * 1024 * 1024
    source = tmp_path / "weights.bin"
    source.write_bytes(os.urandom(DEFAULT_SHARD_SIZE * 2 + 1000))
    manifest = write_shards(locked_store, keyring, NAME, "v1", source, now=T0)
    assert [s.size for s in manifest.shards] == [DEFAULT_SHARD_SIZE, DEFAULT_SHARD_SIZE, 1000]
    assert len({s.shard_id for s in manifest.shards}) == 3
    report = verify_full(locked_store, keyring, manifest, now=T0)
    assert report.ok and report.weights_sha256_checked and len(report.checked) == 3
    out = tmp_path / "out.bin"
    assert load_weights(locked_store, keyring, manifest, out, now=T0) == manifest.weights_sha256
    assert out.read_bytes() == source.read_bytes()
    assert load_manifest(locked_store, NAME, "v1") == manifest
    with pytest.raises(ManifestError, match="exists already"):
        write_shards(locked_store, keyring, NAME, "v1", source, now=T0)


def test_tampered_shard_is_named(
    locked_store: S3RecordStore, keyring: Keyring, tmp_path: Path
) -> None:
    manifest = write_shards(
        locked_store,
        keyring,
        NAME,
        "v1",
        _weights(tmp_path / "w", 20_000),
        settings=SMALL,
        now=T0,
    )
    victim = manifest.shards[2]
    key = shard_key(NAME, victim.shard_id)
    _flip(locked_store, key)
    report = verify_full(locked_store, keyring, manifest, now=T0)
    assert not report.ok and not report.weights_sha256_checked
    assert len(report.problems) == 1 and locked_store.where(key) in report.problems[0]
    assert "was altered" in report.problems[0]
    with pytest.raises(ShardIntegrityError) as caught:
        load_weights(locked_store, keyring, manifest, tmp_path / "out", now=T0)
    assert caught.value.key == locked_store.where(key)
    assert not (tmp_path / "out").exists()  # no half-written file either
    assert read_shard(locked_store, keyring, manifest, 1, now=T0)  # the others still load


def test_truncated_shard_is_named(
    locked_store: S3RecordStore, keyring: Keyring, tmp_path: Path
) -> None:
    manifest = write_shards(
        locked_store, keyring, NAME, "v1", _weights(tmp_path / "w", 9000), settings=SMALL, now=T0
    )
    key = shard_key(NAME, manifest.shards[0].shard_id)
    found = locked_store.get(key)
    assert found is not None
    locked_store.put(key, found[0][:1000])
    with pytest.raises(ShardIntegrityError, match=r"shard 0 is truncated: 1000 of 4128 bytes"):
        read_shard(locked_store, keyring, manifest, 0, now=T0)


def test_incremental_verification_checks_only_changed_shards(
    locked_store: S3RecordStore, keyring: Keyring, tmp_path: Path
) -> None:
    source = _weights(tmp_path / "w", 10 * 4096)
    v1 = write_shards(locked_store, keyring, NAME, "v1", source, settings=SMALL, now=T0)
    base = verify_full(locked_store, keyring, v1, now=T0)
    assert base.ok and len(base.checked) == 10
    data = bytearray(source.read_bytes())
    data[3 * 4096 + 5] ^= 0xFF  # a LoRA update touches two of ten shards
    data[7 * 4096] ^= 0xFF
    source.write_bytes(bytes(data))
    v2 = write_shards(locked_store, keyring, NAME, "v2", source, settings=SMALL, base=v1, now=T0)
    changed = [v2.shards[3].shard_id, v2.shards[7].shard_id]
    report = verify_incremental(locked_store, keyring, v2, v1, base, now=T0)
    assert report.ok and report.mode == "incremental" and report.base_version == "v1"
    assert report.checked == changed
    assert len(report.reused) == 8 and set(report.reused).isdisjoint(changed)

    # An unchanged shard overwritten since its verdict is caught and checked, not reused.
    _flip(locked_store, shard_key(NAME, v2.shards[0].shard_id))
    again = verify_incremental(locked_store, keyring, v2, v1, base, now=T0)
    assert v2.shards[0].shard_id in again.checked and not again.ok


def test_failed_check_falls_back_to_last_verified(
    locked_store: S3RecordStore, keyring: Keyring, tmp_path: Path
) -> None:
    source = _weights(tmp_path / "w", 6 * 4096)
    write_shards(locked_store, keyring, NAME, "v1", source, settings=SMALL, now=T0)
    first = select_verified(locked_store, keyring, NAME, "v1", now=T0)
    assert not first.fell_back and first.report.mode == "full"
    assert load_verdict(locked_store, NAME, "v1") == first.report

    source.write_bytes(source.read_bytes()[:-10] + b"0123456789")
    v2 = write_shards(locked_store, keyring, NAME, "v2", source, settings=SMALL, now=T0 + 1)
    _flip(locked_store, shard_key(NAME, v2.shards[-1].shard_id))
    chosen = select_verified(locked_store, keyring, NAME, "v2", now=T0 + 2)
    assert chosen.fell_back and chosen.manifest.version == "v1"
    assert chosen.failed is not None and chosen.failed.checked == [v2.shards[-1].shard_id]
    assert chosen.failed.reused  # incremental: the five unchanged shards were not re-read
    stored = load_verdict(locked_store, NAME, "v2")
    assert stored is not None and not stored.ok


def test_loading_refuses_an_expired_dek(
    locked_store: S3RecordStore, keyring: Keyring, tmp_path: Path
) -> None:
    manifest = write_shards(
        locked_store, keyring, NAME, "v1", _weights(tmp_path / "w", 5000), settings=SMALL, now=T0
    )
    keyring.rotate(T0 + 72 * 3600)
    assert read_shard(locked_store, keyring, manifest, 0, now=T0 + 100 * 3600)
    later = T0 + 72 * 3600 + 31 * 86400
    with pytest.raises(DekExpiredError):
        load_weights(locked_store, keyring, manifest, tmp_path / "out", now=later)
    report = verify_full(locked_store, keyring, manifest, now=later)
    assert not report.ok and "expired" in report.problems[0]
    figures = keyring.figures(manifest.key_versions(), now=later)
    assert figures.shards_past_retention == 2


class _FailingSource(io.RawIOBase):
    """A source whose disk fails after `good` reads (EIO), as a dying volume would."""

    def __init__(self, data: bytes, good: int) -> None:
        self._data = io.BytesIO(data)
        self._left = good

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._left == 0:
            raise OSError(errno.EIO, "Input/output error")
        self._left -= 1
        return self._data.read(size)


def test_manifest_is_written_last(
    locked_store: S3RecordStore, keyring: Keyring, tmp_path: Path
) -> None:
    """A write that fails midway leaves its shards but no manifest, so no visible version;
    the retry reuses the shards already uploaded (content-addressed)."""
    data = _weights(tmp_path / "w", 5 * 4096).read_bytes()
    shards = f"weights/{'org%2Fchat-7b'}/shards/"
    with pytest.raises(OSError, match="Input/output error"):
        write_shards(
            locked_store, keyring, NAME, "v1", _FailingSource(data, 3), settings=SMALL, now=T0
        )
    assert len(locked_store.list(shards)) == 3
    assert locked_store.get(manifest_key(NAME, "v1")) is None
    assert list_versions(locked_store, NAME) == []
    manifest = write_shards(
        locked_store, keyring, NAME, "v1", io.BytesIO(data), settings=SMALL, now=T0
    )
    assert len(locked_store.list(shards)) == 5 and list_versions(locked_store, NAME) == ["v1"]
    for entry in manifest.shards[:3]:  # the retry found them and kept them (one version each)
        versions = locked_store.client.list_object_versions(
            Bucket=locked_store.bucket,
            Prefix=locked_store.object_key(shard_key(NAME, entry.shard_id)),
        )["Versions"]
        assert len(versions) == 1
    report = verify_full(locked_store, keyring, manifest, now=T0)
    assert report.ok
    write_verdict(locked_store, report)
    assert load_verdict(locked_store, NAME, "v1") == report
