"""Pure figures: DEK states and keyring figures, region lag, checkpoint RPO."""

from __future__ import annotations

from redline.platform.weights.checkpoints import CheckpointAge, build_rpo_figures
from redline.platform.weights.keyring import DekRecord, build_dek_state, build_keyring_figures
from redline.platform.weights.shards import ShardEntry, ShardManifest
from redline.platform.weights.sync import SyncRow, SyncTable, build_region_lag
from redline.slo.spec import Weights

DAY = 86400.0
SETTINGS = Weights()


def _dek(
    version: int, created: float, retired: float | None = None, revoked: float | None = None
) -> DekRecord:
    return DekRecord(
        keyring="default",
        version=version,
        kek_id="pkcs11:token=t;object=k",
        wrapped="AA==",
        created_at=created,
        retired_at=retired,
        revoked_at=revoked,
    )


def test_dek_states() -> None:
    assert build_dek_state(_dek(1, 0), SETTINGS, 10 * DAY) == "current"
    retired = _dek(1, 0, retired=3 * DAY)
    assert build_dek_state(retired, SETTINGS, 3 * DAY + 30 * DAY) == "retired"
    assert build_dek_state(retired, SETTINGS, 3 * DAY + 30 * DAY + 1) == "expired"
    assert build_dek_state(_dek(1, 0, revoked=5.0), SETTINGS, 6.0) == "revoked"


def test_keyring_figures() -> None:
    records = [_dek(1, 0, retired=3 * DAY), _dek(2, 3 * DAY, revoked=4 * DAY), _dek(3, 4 * DAY)]
    figures = build_keyring_figures(records, SETTINGS, 34 * DAY, [1, 1, 2, 3, 3, 3, 9])
    assert figures.current_version == 3
    assert figures.current_age_seconds == 30 * DAY and figures.seconds_to_rotation == 0
    assert figures.versions_by_state == {
        "current": [3],
        "retired": [],
        "expired": [1],
        "revoked": [2],
    }
    assert figures.shards_by_version == {1: 2, 2: 1, 3: 3, 9: 1}
    assert figures.shards_past_retention == 4  # v1 expired, v2 revoked, v9 unknown
    empty = build_keyring_figures([], SETTINGS, 0.0)
    assert empty.current_version is None and empty.seconds_to_rotation is None


def _manifest(version: str, created: float, shard_ids: list[str]) -> ShardManifest:
    entries = [
        ShardEntry.model_construct(
            index=i,
            offset=i,
            size=1,
            shard_id=s,
            key_version=1,
            plaintext_sha256=s[:64],
            ciphertext_sha256=s[:64],
            ciphertext_size=33,
        )
        for i, s in enumerate(shard_ids)
    ]
    return ShardManifest.model_construct(
        name="m",
        version=version,
        keyring="default",
        shard_size=1,
        total_size=len(entries),
        weights_sha256="0" * 64,
        created_at=created,
        shards=entries,
    )


def test_region_lag() -> None:
    a, b, c = ("a" * 64 + "-v1", "b" * 64 + "-v1", "c" * 64 + "-v1")
    manifests = [_manifest("v1", 100.0, [a, b]), _manifest("v2", 200.0, [a, c])]

    def row(shard: str, when: float, sha: str | None = None) -> SyncRow:
        return SyncRow(
            shard_id=shard,
            key_version=1,
            region="us",
            node="bucket-us",
            ciphertext_sha256=sha or shard[:64],
            last_sync=when,
        )

    tables = {
        "us": SyncTable(
            name="m", region="us", rows={a: row(a, 150), b: row(b, 150)}, versions={"v1": 150.0}
        ),
        "ap": SyncTable(
            name="m",
            region="ap",
            rows={a: row(a, 250), b: row(b, 250, "f" * 64), c: row(c, 250)},
            versions={"v1": 250.0, "v2": 250.0},
        ),
        "new": SyncTable(name="m", region="new"),
    }
    lag = build_region_lag(manifests, tables, now=300.0)
    assert lag["us"].shards_missing == 1 and lag["us"].versions_missing == ["v2"]
    assert lag["us"].lag_seconds == 100.0 and lag["us"].last_sync_age_seconds == 150.0
    assert lag["ap"].shards_missing == 1 and lag["ap"].lag_seconds == 0.0  # a stale copy of b
    assert lag["new"].lag_seconds == 200.0 and lag["new"].last_sync_age_seconds is None
    assert lag["new"].node is None and lag["us"].node == "bucket-us"


def test_rpo_figures() -> None:
    def age(adapter: str, seconds: float, deleted: bool = False) -> CheckpointAge:
        return CheckpointAge(adapter, "v", 0.0, seconds, deleted)

    ages = {"a": age("a", 30), "b": age("b", 91), "c": age("c", 5, deleted=True)}
    figures = build_rpo_figures(ages, ["a", "b", "c", "d"], rpo_seconds=90)
    assert figures.breaches == ["b", "c", "d"] and figures.worst_age_seconds == 91
