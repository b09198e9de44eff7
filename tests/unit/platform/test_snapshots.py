"""Snapshot registry: round trips, integrity, rollback choice, checkpoints (crash safety and
concurrent writers, which need processes, are in tests/integration/platform)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from redline.platform.snapshots import (
    Baselines,
    SnapshotCorruptError,
    SnapshotIntegrityError,
    SnapshotNotFoundError,
    SnapshotRegistry,
    hash_path,
)
from tests.support.snapshots import MODEL, make_artifacts


def _baselines(p99: float = 0.42, accuracy: float = 0.93) -> Baselines:
    return Baselines(p99_seconds=p99, accuracy_ratio=accuracy, samples=2500)


@pytest.fixture()
def registry(tmp_path: Path) -> SnapshotRegistry:
    return SnapshotRegistry(tmp_path / "registry")


def test_round_trip_and_idempotent_create(registry: SnapshotRegistry, tmp_path: Path) -> None:
    weights, config = make_artifacts(tmp_path, "v1")
    created = registry.create(MODEL, "v1", weights, config, adapter="support", created_at=100.0)
    assert created.weights_sha256 == hash_path(weights)
    assert created.config_sha256 == hash_path(config)
    assert created.sequence == 1 and not created.verified
    assert registry.get(MODEL, created.snapshot_id) == created
    assert registry.create(MODEL, "v1", weights, config, adapter="support") == created
    assert registry.models() == [MODEL]
    on_disk = list((registry.root / "models").iterdir())
    assert [p.name for p in on_disk] == ["org%2Fchat-7b"]

    verified = registry.mark_verified(
        MODEL,
        created.snapshot_id,
        Baselines(p99_seconds=0.5, accuracy_ratio=0.9, reference_answers={"q1": "Paris"}),
        verified_at=200.0,
    )
    reread = SnapshotRegistry(registry.root).get(MODEL, created.snapshot_id)
    assert reread == verified and reread.verified
    assert reread.baselines is not None and reread.baselines.reference_answers == {"q1": "Paris"}
    assert reread.verified_at == 200.0 and reread.created_at == 100.0


def test_list_is_newest_first(registry: SnapshotRegistry, tmp_path: Path) -> None:
    ids = []
    for version in ("v1", "v2", "v3"):
        weights, config = make_artifacts(tmp_path, version)
        ids.append(registry.create(MODEL, version, weights, config).snapshot_id)
    listed = registry.list(MODEL)
    assert [s.snapshot_id for s in listed] == ids[::-1]
    assert [s.sequence for s in listed] == [3, 2, 1]
    assert registry.list("unknown-model") == []


def test_directory_hash_changes_with_any_file(tmp_path: Path) -> None:
    weights, _ = make_artifacts(tmp_path, "v1")
    before = hash_path(weights)
    (weights / "nested" / "extra.bin").write_bytes(b"\x00\x02" * 10)
    assert hash_path(weights) != before
    (weights / "nested" / "extra.bin").write_bytes(b"\x00\x01" * 10)
    assert hash_path(weights) == before
    (weights / "nested" / "extra.bin").rename(weights / "nested" / "renamed.bin")
    assert hash_path(weights) != before


def test_tampered_weights_are_detected(registry: SnapshotRegistry, tmp_path: Path) -> None:
    weights, config = make_artifacts(tmp_path, "v1")
    snapshot = registry.create(MODEL, "v1", weights, config)
    assert registry.verify(snapshot)
    blob = weights / "adapter_model.safetensors"
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert not registry.verify(snapshot)
    problems = registry.check(snapshot)
    assert len(problems) == 1 and problems[0].startswith("weights ")
    with pytest.raises(SnapshotIntegrityError, match="cannot be activated"):
        registry.activate(MODEL, snapshot.snapshot_id)
    with pytest.raises(SnapshotIntegrityError, match="cannot be marked verified"):
        registry.mark_verified(MODEL, snapshot.snapshot_id, _baselines())
    assert registry.active(MODEL) is None

    config.unlink()
    problems = registry.check(snapshot)
    assert any(p.startswith("config ") and "cannot read" in p for p in problems)


def test_activate_switches_pointer_and_remembers_previous(
    registry: SnapshotRegistry, tmp_path: Path
) -> None:
    assert registry.active(MODEL) is None
    first = registry.create(MODEL, "v1", *make_artifacts(tmp_path, "v1"))
    second = registry.create(MODEL, "v2", *make_artifacts(tmp_path, "v2"))
    pointer = registry.activate(MODEL, first.snapshot_id, when=10.0)
    assert pointer.previous_snapshot_id is None
    pointer = registry.activate(MODEL, second.snapshot_id, when=20.0)
    assert pointer.previous_snapshot_id == first.snapshot_id
    assert registry.activate(MODEL, second.snapshot_id) == pointer  # idempotent
    assert registry.active(MODEL) == second
    with pytest.raises(SnapshotNotFoundError):
        registry.activate(MODEL, "v9-0000000000")


def test_previous_verified_picks_newest_intact_verified_older_snapshot(
    registry: SnapshotRegistry, tmp_path: Path
) -> None:
    snaps = {}
    for version in ("v1", "v2", "v3", "v4", "v5", "v6"):
        snaps[version] = registry.create(MODEL, version, *make_artifacts(tmp_path, version))
    for version in ("v1", "v2", "v3", "v6"):
        registry.mark_verified(MODEL, snaps[version].snapshot_id, _baselines())
    # v3 verified but its weights changed since; v4 never verified; v5 is active; v6 newer.
    (Path(snaps["v3"].weights_path) / "adapter_model.safetensors").write_bytes(b"tampered")
    registry.activate(MODEL, snaps["v5"].snapshot_id)

    chosen = registry.previous_verified(MODEL)
    assert chosen is not None and chosen.version == "v2"
    chosen = registry.previous_verified(MODEL, before=snaps["v2"].snapshot_id)
    assert chosen is not None and chosen.version == "v1"
    assert registry.previous_verified(MODEL, before=snaps["v1"].snapshot_id) is None
    assert registry.previous_verified("other-model") is None


def test_corrupt_and_missing_files_give_clear_errors(
    registry: SnapshotRegistry, tmp_path: Path
) -> None:
    good = registry.create(MODEL, "v1", *make_artifacts(tmp_path, "v1"))
    bad = registry.create(MODEL, "v2", *make_artifacts(tmp_path, "v2"))
    bad_path = registry.root / "models" / "org%2Fchat-7b" / "snapshots" / f"{bad.snapshot_id}.json"
    bad_path.write_text(bad_path.read_text()[:40])
    with pytest.raises(SnapshotCorruptError, match="malformed JSON") as caught:
        registry.get(MODEL, bad.snapshot_id)
    assert str(bad_path) in str(caught.value)
    snapshots, errors = registry.scan(MODEL)
    assert [s.snapshot_id for s in snapshots] == [good.snapshot_id]
    assert len(errors) == 1 and str(bad_path) in str(errors[0])
    assert registry.list(MODEL) == [good]

    bad_path.write_text(json.dumps({"snapshot_id": bad.snapshot_id, "sequence": 0}))
    with pytest.raises(SnapshotCorruptError, match="sequence"):
        registry.get(MODEL, bad.snapshot_id)

    with pytest.raises(SnapshotNotFoundError, match="no such snapshot"):
        registry.get(MODEL, "nope")
    with pytest.raises(SnapshotNotFoundError):
        registry.create(MODEL, "v3", tmp_path / "missing", tmp_path / "missing.json")

    registry.activate(MODEL, good.snapshot_id)
    active_path = registry.root / "models" / "org%2Fchat-7b" / "active.json"
    active_path.write_text("{")
    with pytest.raises(SnapshotCorruptError, match="active pointer"):
        registry.active(MODEL)
    active_path.write_text(
        json.dumps({"model": MODEL, "snapshot_id": "gone-1", "activated_at": 1.0})
    )
    with pytest.raises(SnapshotNotFoundError, match="is missing"):
        registry.active(MODEL)


def test_checkpoints_record_latest_success(registry: SnapshotRegistry, tmp_path: Path) -> None:
    assert registry.checkpoints() == []
    registry.record_checkpoint("support/lora", when=100.0, path=tmp_path)
    registry.record_checkpoint("billing", when=50.0)
    assert registry.record_checkpoint("support/lora", when=90.0).last_success == 100.0
    registry.record_checkpoint("support/lora", when=120.0)
    records = {c.adapter: c.last_success for c in registry.checkpoints()}
    assert records == {"billing": 50.0, "support/lora": 120.0}
    (registry.root / "checkpoints" / "billing.json").write_text("not json")
    with pytest.raises(SnapshotCorruptError, match="checkpoint record"):
        registry.checkpoints()
