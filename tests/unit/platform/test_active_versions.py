"""`ActiveVersions`: the registry's active version per model, through a short cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.platform.snapshots import (
    UNKNOWN_VERSION,
    ActiveVersions,
    Snapshot,
    SnapshotRegistry,
)
from tests.support.snapshots import MODEL, make_artifacts


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def registry(tmp_path: Path) -> SnapshotRegistry:
    return SnapshotRegistry(tmp_path / "registry")


def snapshot(registry: SnapshotRegistry, tmp_path: Path, version: str) -> Snapshot:
    weights, config = make_artifacts(tmp_path / "artifacts", version)
    return registry.create(MODEL, version, weights, config, adapter="support")


def test_unknown_until_a_snapshot_is_active(registry: SnapshotRegistry, tmp_path: Path) -> None:
    clock = Clock()
    versions = ActiveVersions(registry, ttl_seconds=2.0, clock=clock)
    assert versions.version(MODEL) == UNKNOWN_VERSION
    assert versions.models() == []
    v1 = snapshot(registry, tmp_path, "v1")
    assert versions.known(MODEL) == frozenset({"v1"})
    registry.activate(MODEL, v1.snapshot_id)
    # Cached: the model had no active snapshot a moment ago, and that holds for the TTL.
    assert versions.version(MODEL) == UNKNOWN_VERSION
    clock.now += 2.0
    assert versions.version(MODEL) == "v1"
    assert versions.models() == [MODEL]


def test_a_rollback_shows_within_one_ttl(registry: SnapshotRegistry, tmp_path: Path) -> None:
    clock = Clock()
    versions = ActiveVersions(registry, ttl_seconds=1.0, clock=clock)
    v1, v2 = snapshot(registry, tmp_path, "v1"), snapshot(registry, tmp_path, "v2")
    registry.activate(MODEL, v2.snapshot_id)
    assert versions.version(MODEL) == "v2"
    registry.activate(MODEL, v1.snapshot_id)
    clock.now += 0.5
    assert versions.version(MODEL) == "v2"
    clock.now += 0.5
    assert versions.version(MODEL) == "v1"
    assert versions.known(MODEL) == frozenset({"v1", "v2"})


def test_no_file_is_read_while_the_cache_is_fresh(
    registry: SnapshotRegistry, tmp_path: Path
) -> None:
    clock = Clock()
    versions = ActiveVersions(registry, ttl_seconds=5.0, clock=clock)
    registry.activate(MODEL, snapshot(registry, tmp_path, "v1").snapshot_id)
    assert versions.version(MODEL) == "v1"
    # Remove the whole registry: a fresh cache entry must not notice.
    for path in sorted(registry.root.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    assert versions.version(MODEL) == "v1"
    clock.now += 5.0
    assert versions.version(MODEL) == UNKNOWN_VERSION


def test_resolve_prefers_the_registry_then_the_reported_version(
    registry: SnapshotRegistry, tmp_path: Path
) -> None:
    versions = ActiveVersions(registry, ttl_seconds=0.0)
    assert versions.resolve(MODEL, "from-header") == "from-header"
    assert versions.resolve(MODEL, None) == UNKNOWN_VERSION
    assert versions.resolve(MODEL, "") == UNKNOWN_VERSION
    registry.activate(MODEL, snapshot(registry, tmp_path, "v1").snapshot_id)
    assert versions.resolve(MODEL, "from-header") == "v1"


def test_a_corrupt_pointer_keeps_the_last_good_version(
    registry: SnapshotRegistry, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    versions = ActiveVersions(registry, ttl_seconds=0.0)
    registry.activate(MODEL, snapshot(registry, tmp_path, "v1").snapshot_id)
    assert versions.version(MODEL) == "v1"
    pointer = next(registry.root.rglob("active.json"))
    pointer.write_text("{half a pointer")
    assert versions.version(MODEL) == "v1"
    assert "active version of 'org/chat-7b' unreadable" in caplog.text
    fresh = ActiveVersions(registry, ttl_seconds=0.0)
    assert fresh.version(MODEL) == UNKNOWN_VERSION


@pytest.mark.parametrize("model", ["", ".", ".."])
def test_names_that_are_not_models_read_nothing(registry: SnapshotRegistry, model: str) -> None:
    # `..` would otherwise resolve to the registry root's parent directory.
    (registry.root).mkdir(parents=True)
    (registry.root / "active.json").write_text('{"model": "..", "snapshot_id": "x"}')
    versions = ActiveVersions(registry)
    assert versions.version(model) == UNKNOWN_VERSION
    assert versions.known(model) == frozenset()


def test_the_cache_is_bounded(registry: SnapshotRegistry) -> None:
    versions = ActiveVersions(registry, ttl_seconds=60.0, max_models=3)
    for index in range(10):
        assert versions.version(f"client-made-up-{index}") == UNKNOWN_VERSION
        assert len(versions._active) <= 3


def test_a_negative_ttl_is_refused(registry: SnapshotRegistry) -> None:
    with pytest.raises(ValueError, match="ttl_seconds must be >= 0"):
        ActiveVersions(registry, ttl_seconds=-1)
