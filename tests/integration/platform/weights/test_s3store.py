"""The snapshot registry on a real S3 server (SeaweedFS): round trip, conditional writes, and a
race of activations that exactly one wins."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from redline.platform.snapshots import (
    Baselines,
    SnapshotConflictError,
    SnapshotNotFoundError,
    SnapshotRegistry,
)
from redline.platform.weights.errors import RecordConflictError
from redline.platform.weights.s3store import S3RecordStore
from tests.support.seaweedfs import SeaweedS3
from tests.support.snapshots import MODEL, make_artifacts


def test_server_started_quickly(seaweed: SeaweedS3) -> None:
    # `weed mini` answered writes in about 1 s on the 2-core machine; 30 s means it is broken.
    assert seaweed.started_in_seconds < 30


def test_registry_round_trip_on_s3(locked_store: S3RecordStore, tmp_path: Path) -> None:
    registry = SnapshotRegistry.on_store(locked_store)
    assert registry.root is None and registry.models() == []
    first = registry.create(MODEL, "v1", *make_artifacts(tmp_path, "v1"), adapter="support")
    second = registry.create(MODEL, "v2", *make_artifacts(tmp_path, "v2"))
    assert (first.sequence, second.sequence) == (1, 2)
    assert (
        registry.create(
            MODEL, "v1", Path(first.weights_path), Path(first.config_path), adapter="support"
        )
        == first
    )
    assert registry.models() == [MODEL]
    assert [s.snapshot_id for s in registry.list(MODEL)] == [second.snapshot_id, first.snapshot_id]

    verified = registry.mark_verified(
        MODEL, first.snapshot_id, Baselines(p99_seconds=0.4, accuracy_ratio=0.9), verified_at=5.0
    )
    assert registry.get(MODEL, first.snapshot_id) == verified and verified.verified
    registry.activate(MODEL, first.snapshot_id, when=10.0)
    pointer = registry.activate(MODEL, second.snapshot_id, when=20.0)
    assert pointer.previous_snapshot_id == first.snapshot_id
    assert registry.active(MODEL) == second
    assert registry.previous_verified(MODEL) == verified

    registry.record_checkpoint("support/lora", when=100.0)
    assert registry.record_checkpoint("support/lora", when=50.0).last_success == 100.0
    assert [c.adapter for c in registry.checkpoints()] == ["support/lora"]

    # The records are objects under the expected keys, and each overwrite kept a version.
    keys = locked_store.list("")
    assert "models/org%2Fchat-7b/active.json" in keys
    assert "checkpoints/support%2Flora.json" in keys
    versions = locked_store.client.list_object_versions(
        Bucket=locked_store.bucket, Prefix="models/org%2Fchat-7b/active.json"
    )["Versions"]
    assert len(versions) == 2
    with pytest.raises(SnapshotNotFoundError, match=f"s3://{locked_store.bucket}/models/"):
        registry.get(MODEL, "v9-0000000000")


def test_conditional_writes_are_honoured(locked_store: S3RecordStore) -> None:
    """SeaweedFS honours If-None-Match: * and If-Match on PutObject (412 to the loser)."""
    token = locked_store.put("race/record", b"base", if_absent=True)
    with pytest.raises(RecordConflictError, match="exists already"):
        locked_store.put("race/record", b"again", if_absent=True)
    assert locked_store.get("race/record") == (b"base", token)
    newer = locked_store.put("race/record", b"first", if_version=token)
    with pytest.raises(RecordConflictError, match="is no longer"):
        locked_store.put("race/record", b"second", if_version=token)  # the same stale token
    with pytest.raises(RecordConflictError):
        locked_store.put("race/missing", b"x", if_version=token)
    assert locked_store.get("race/record") == (b"first", newer)
    assert locked_store.digest("race/record") is not None
    assert locked_store.digest("race/missing") is None


def test_concurrent_activations_one_wins(
    seaweed: SeaweedS3, locked_store: S3RecordStore, tmp_path: Path
) -> None:
    """Two writers read the same pointer, then both write: exactly one wins, every round.

    The registry reads its clock between reading the pointer and writing it; a clock that
    waits at a barrier holds both writers there, so they always overlap.
    """
    setup = SnapshotRegistry.on_store(locked_store)
    snaps = [setup.create(MODEL, f"v{i}", *make_artifacts(tmp_path, f"v{i}")) for i in range(3)]
    setup.activate(MODEL, snaps[0].snapshot_id, when=1.0)
    barrier = threading.Barrier(2, timeout=30)

    def clock() -> float:
        barrier.wait()
        return 100.0

    # Two writers with clients of their own, as two processes would have.
    writers = [
        SnapshotRegistry.on_store(S3RecordStore(seaweed.client(), locked_store.bucket), clock)
        for _ in range(2)
    ]
    rounds = 3
    for round_ in range(rounds):
        outcomes: dict[str, object] = {}

        def activate(
            registry: SnapshotRegistry, target: str, outcomes: dict[str, object] = outcomes
        ) -> None:
            try:
                outcomes[target] = registry.activate(MODEL, target)
            except SnapshotConflictError as exc:
                outcomes[target] = exc

        current = setup.active_pointer(MODEL)
        assert current is not None
        targets = [s.snapshot_id for s in snaps if s.snapshot_id != current.snapshot_id]
        threads = [
            threading.Thread(target=activate, args=(writer, target))
            for writer, target in zip(writers, targets, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        won = [t for t, o in outcomes.items() if not isinstance(o, Exception)]
        lost = [o for o in outcomes.values() if isinstance(o, SnapshotConflictError)]
        assert len(won) == 1 and len(lost) == 1, (round_, outcomes)
        assert "another writer moved the active pointer" in str(lost[0])
        pointer = setup.active_pointer(MODEL)
        assert pointer is not None and pointer.snapshot_id == won[0]
        assert pointer.previous_snapshot_id == current.snapshot_id  # no lost update
    versions = locked_store.client.list_object_versions(
        Bucket=locked_store.bucket, Prefix="models/org%2Fchat-7b/active.json"
    )["Versions"]
    assert len(versions) == 1 + rounds  # one write per round: the loser wrote nothing


def test_concurrent_creates_get_unique_sequences(
    seaweed: SeaweedS3, locked_store: S3RecordStore, tmp_path: Path
) -> None:
    """No lock on object storage: the sequence counter's conditional write keeps them unique."""
    artifacts = [make_artifacts(tmp_path / str(i), f"v{i}") for i in range(4)]
    # Clients made here: a boto3 session is not thread-safe, its clients are.
    registries = [
        SnapshotRegistry.on_store(S3RecordStore(seaweed.client(), locked_store.bucket))
        for _ in artifacts
    ]
    barrier = threading.Barrier(len(artifacts), timeout=30)
    errors: list[BaseException] = []

    def create(index: int) -> None:
        barrier.wait()
        try:
            registries[index].create(MODEL, f"v{index}", *artifacts[index])
        except BaseException as exc:  # reported below, with the others'
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(artifacts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    sequences = sorted(s.sequence for s in SnapshotRegistry.on_store(locked_store).list(MODEL))
    assert sequences == list(range(1, len(artifacts) + 1))
