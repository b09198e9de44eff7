"""Cross-region sync between two buckets standing for two regions: missing shards copied and
verified, a second run copies nothing, a damaged copy repaired, a damaged source refused, the
DEK records copied so the other region decrypts, and the sync table's lag figures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from redline.platform.weights.errors import SyncError
from redline.platform.weights.keyring import Keyring
from redline.platform.weights.keys import Pkcs11KeyWrapper
from redline.platform.weights.s3store import S3RecordStore, open_s3_record_store
from redline.platform.weights.settings import ShardSettings
from redline.platform.weights.shards import (
    load_manifest,
    load_weights,
    shard_key,
    verify_full,
    write_shards,
)
from redline.platform.weights.sync import (
    Region,
    build_region_lag,
    load_sync_table,
    sync_weights,
)
from tests.integration.platform.weights.conftest import store_settings
from tests.support.seaweedfs import SeaweedS3, make_bucket

T0 = 1_800_000_000.0
NAME = "support-lora"
SMALL = ShardSettings(shard_size=4096)


@pytest.fixture()
def regions(
    seaweed: SeaweedS3, locked_store: S3RecordStore, bucket_name: str
) -> tuple[Region, Region]:
    other = f"{bucket_name}-b"
    make_bucket(seaweed.client(), other)
    backup = open_s3_record_store(store_settings(seaweed, other), seaweed.session())
    return (
        Region("eu-west", locked_store, locked_store.bucket),
        Region("us-east", backup, backup.bucket),
    )


def test_sync_copies_missing_shards_and_is_idempotent(
    regions: tuple[Region, Region], wrapper: Pkcs11KeyWrapper, tmp_path: Path
) -> None:
    primary, backup = regions
    keyring = Keyring(primary.store, wrapper)
    source = tmp_path / "w.bin"
    source.write_bytes(os.urandom(4 * 4096))
    v1 = write_shards(primary.store, keyring, NAME, "v1", source, settings=SMALL, now=T0)

    result = sync_weights(primary, backup, NAME, primary.store, now=T0 + 10)
    assert len(result.copied) == 4 and result.present == [] and result.manifests_copied == ["v1"]
    assert result.deks_copied == [1]
    again = sync_weights(primary, backup, NAME, primary.store, now=T0 + 20)
    assert again.copied == [] and len(again.present) == 4 and again.manifests_copied == []

    # The other region decrypts with its own copy of the DEK records (same KEK).
    remote = Keyring(backup.store, wrapper)
    manifest = load_manifest(backup.store, NAME, "v1")
    assert manifest == v1 and verify_full(backup.store, remote, manifest, now=T0 + 30).ok
    out = tmp_path / "restored.bin"
    load_weights(backup.store, remote, manifest, out, now=T0 + 30)
    assert out.read_bytes() == source.read_bytes()

    table = load_sync_table(primary.store, NAME, "us-east")
    assert {row.node for row in table.rows.values()} == {backup.node}
    assert {row.key_version for row in table.rows.values()} == {1}
    assert {row.last_sync for row in table.rows.values()} == {T0 + 20}

    # A new version: two shards change; only those are copied.
    data = bytearray(source.read_bytes())
    data[0] ^= 1
    data[3 * 4096] ^= 1
    source.write_bytes(bytes(data))
    write_shards(primary.store, keyring, NAME, "v2", source, settings=SMALL, base=v1, now=T0 + 100)
    lag = build_region_lag(
        [load_manifest(primary.store, NAME, v) for v in ("v1", "v2")],
        {"us-east": load_sync_table(primary.store, NAME, "us-east")},
        now=T0 + 160,
    )["us-east"]
    assert (lag.shards_expected, lag.shards_missing, lag.versions_missing) == (6, 2, ["v2"])
    assert lag.lag_seconds == 60 and lag.last_sync_age_seconds == 140 and lag.node == backup.node
    third = sync_weights(primary, backup, NAME, primary.store, now=T0 + 170)
    assert len(third.copied) == 2 and third.manifests_copied == ["v2"]
    lag = build_region_lag(
        [load_manifest(primary.store, NAME, v) for v in ("v1", "v2")],
        {"us-east": load_sync_table(primary.store, NAME, "us-east")},
        now=T0 + 180,
    )["us-east"]
    assert lag.shards_missing == 0 and lag.lag_seconds == 0


def test_damaged_copy_is_repaired_and_damaged_source_refused(
    regions: tuple[Region, Region], wrapper: Pkcs11KeyWrapper, tmp_path: Path
) -> None:
    primary, backup = regions
    keyring = Keyring(primary.store, wrapper)
    source = tmp_path / "w.bin"
    source.write_bytes(os.urandom(3 * 4096))
    manifest = write_shards(primary.store, keyring, NAME, "v1", source, settings=SMALL, now=T0)
    sync_weights(primary, backup, NAME, primary.store, now=T0)
    key = shard_key(NAME, manifest.shards[1].shard_id)
    backup.store.put(key, b"garbage")  # a bad copy in the other region
    repaired = sync_weights(primary, backup, NAME, primary.store, now=T0 + 1)
    assert repaired.copied == [key]
    assert verify_full(backup.store, Keyring(backup.store, wrapper), manifest, now=T0).ok

    primary.store.put(key, b"garbage")  # now the source region is the damaged one
    backup.store.put(key, b"also garbage")
    with pytest.raises(
        SyncError, match=rf"{primary.store.where(key)}: damaged in region 'eu-west'"
    ):
        sync_weights(primary, backup, NAME, primary.store, now=T0 + 2)
    found = backup.store.get(key)
    assert found is not None and found[0] == b"also garbage"  # nothing spread
