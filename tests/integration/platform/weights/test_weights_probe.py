"""The weights exporter probe on a real S3 server (SeaweedFS) with DEKs wrapped by a real HSM
KEK (SoftHSM2): a verified and a tampered version, a region synced to v1 only and one never
synced, a fresh, a deleted and a missing checkpoint, then a revoked DEK; the probe holds no KEK."""

from __future__ import annotations

import time
from pathlib import Path

from redline.exporters.probe import Sample
from redline.exporters.settings import WeightsSection
from redline.exporters.weights import WeightsProbe
from redline.platform.weights.checkpoints import checkpoint_key, write_checkpoint
from redline.platform.weights.keyring import Keyring
from redline.platform.weights.keys import Pkcs11KeyWrapper
from redline.platform.weights.s3store import S3RecordStore, open_s3_record_store
from redline.platform.weights.settings import ShardSettings
from redline.platform.weights.shards import select_verified, shard_key, write_shards
from redline.platform.weights.sync import Region, sync_weights
from redline.slo import catalog
from redline.slo.spec import Weights
from tests.integration.platform.weights.conftest import store_settings
from tests.support.seaweedfs import SeaweedS3, make_bucket

NAME = "org/chat-7b"
SMALL = ShardSettings(shard_size=4096)
POLICY = Weights(dek_rotation_hours=48)
"""Not the default: the probe publishes the spec's period."""
ROTATION = 48 * 3600.0


def _values(samples: list[Sample], metric: catalog.Metric) -> dict[tuple[str, ...], float]:
    """label values (sorted by label name) -> value, of one metric's samples."""
    return {
        tuple(v for _, v in sorted(s.labels.items())): s.value
        for s in samples
        if s.name == metric.family
    }


def test_the_probe_publishes_keys_verdicts_sync_lag_and_checkpoints(
    seaweed: SeaweedS3,
    locked_store: S3RecordStore,
    bucket_name: str,
    wrapper: Pkcs11KeyWrapper,
    tmp_path: Path,
) -> None:
    t0 = time.time() - 600
    keyring = Keyring(locked_store, wrapper)
    source = tmp_path / "w.bin"
    source.write_bytes(bytes(i % 251 for i in range(4 * 4096)))
    v1 = write_shards(locked_store, keyring, NAME, "v1", source, settings=SMALL, now=t0)
    assert select_verified(locked_store, keyring, NAME, "v1", now=t0).report.ok
    source.write_bytes(source.read_bytes()[:-10] + b"0123456789")
    v2 = write_shards(locked_store, keyring, NAME, "v2", source, settings=SMALL, now=t0 + 60)
    key = shard_key(NAME, v2.shards[-1].shard_id)
    found = locked_store.get(key)
    assert found is not None
    locked_store.put(key, found[0][:-1] + bytes([found[0][-1] ^ 1]))  # one bit of the tag
    assert select_verified(locked_store, keyring, NAME, "v2", now=t0 + 70).fell_back

    other = f"{bucket_name}-b"
    make_bucket(seaweed.client(), other)
    backup = open_s3_record_store(store_settings(seaweed, other), seaweed.session())
    primary = Region("eu-west", locked_store, locked_store.bucket)
    sync_weights(primary, Region("us-east", backup, other), NAME, locked_store,
                 versions=["v1"], now=t0 + 30)  # fmt: skip

    write_checkpoint(locked_store, "billing", b"adapter state")
    write_checkpoint(locked_store, "gone", b"adapter state")
    locked_store.client.delete_object(
        Bucket=locked_store.bucket, Key=locked_store.object_key(checkpoint_key("gone"))
    )

    settings = WeightsSection.model_validate(
        {
            "enabled": True,
            "store": store_settings(seaweed, bucket_name).model_dump(),
            "models": [NAME],
            "regions": ["us-east", "ap-south"],
            "adapters": ["billing", "gone", "never"],
        }
    )
    now = time.time()
    probe = WeightsProbe(settings, POLICY, locked_store, clock=lambda: now)
    samples = probe.run()

    [age] = _values(samples, catalog.WEIGHTS_DEK_AGE_SECONDS).values()
    assert abs(age - (now - t0)) < 1.0
    assert _values(samples, catalog.WEIGHTS_DEK_ROTATION_SECONDS) == {("default",): ROTATION}
    assert _values(samples, catalog.WEIGHTS_DEK_SECONDS_TO_ROTATION) == {
        ("default",): ROTATION - age
    }
    versions = _values(samples, catalog.WEIGHTS_DEK_VERSIONS)
    assert versions[("default", "current")] == 1 and versions[("default", "revoked")] == 0
    assert _values(samples, catalog.WEIGHTS_SHARDS_PAST_RETENTION) == {("default",): 0}

    failed = _values(samples, catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION)
    assert failed[(NAME, "v1")] == 0 and failed[(NAME, "v2")] >= 1

    lag = _values(samples, catalog.WEIGHTS_SYNC_LAG_SECONDS)
    assert lag[(NAME, "us-east")] == now - (t0 + 60)  # lacks v2
    assert lag[(NAME, "ap-south")] == now - t0  # never synced: lacks v1 too
    missing = _values(samples, catalog.WEIGHTS_SYNC_VERSIONS_MISSING)
    assert missing == {(NAME, "ap-south"): 2, (NAME, "us-east"): 1}
    expected_shards = len({e.shard_id for m in (v1, v2) for e in m.shards})
    shards = _values(samples, catalog.WEIGHTS_SYNC_SHARDS_MISSING)
    assert shards[(NAME, "ap-south")] == expected_shards
    assert 0 < shards[(NAME, "us-east")] < expected_shards
    last = _values(samples, catalog.WEIGHTS_SYNC_LAST_TIMESTAMP_SECONDS)
    assert last == {(NAME, "us-east"): t0 + 30}

    checkpoints = _values(samples, catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS)
    assert checkpoints[("gone",)] == 0 and checkpoints[("never",)] == 0
    assert now - 120 < checkpoints[("billing",)] <= now + 1

    # The DEK revoked: every shard of both versions is under a DEK that no longer decrypts.
    keyring.revoke(1, "drill", now=now - 1)
    past = _values(probe.run(), catalog.WEIGHTS_SHARDS_PAST_RETENTION)
    assert past == {("default",): expected_shards}
