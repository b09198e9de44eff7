"""The rollback's served version without a version header: active pointer + serving API."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.platform.snapshots import UNKNOWN_VERSION, Snapshot, SnapshotRegistry
from redline.remediation.playbooks.rollback import (
    ServedVersion,
    build_served_version,
    lora_path,
)
from tests.support.snapshots import make_artifacts

MODEL = "chat-lora"


@pytest.fixture()
def snapshots(tmp_path: Path) -> dict[str, Snapshot]:
    registry = SnapshotRegistry(tmp_path / "registry")
    made = {}
    for version in ("v1", "v2"):
        weights, config = make_artifacts(tmp_path, version)
        made[version] = registry.create(MODEL, version, weights, config)
    return made


def test_the_active_snapshot_served_everywhere_is_its_version(
    snapshots: dict[str, Snapshot],
) -> None:
    v1 = snapshots["v1"]
    roots = {"primary": lora_path(v1), "secondary": lora_path(v1)}
    assert build_served_version(v1, v1, roots) == ServedVersion("v1")
    # A hook serves it: no serving API to ask, the pointer is trusted.
    assert build_served_version(v1, v1, None) == ServedVersion("v1")


def test_a_pointer_elsewhere_is_not_the_snapshots_version(snapshots: dict[str, Snapshot]) -> None:
    v1, v2 = snapshots["v1"], snapshots["v2"]
    served = build_served_version(v1, v2, {"primary": lora_path(v1)})
    assert served.version == UNKNOWN_VERSION
    assert served.problem == f"the active pointer names {v2.snapshot_id}, not {v1.snapshot_id}"
    assert build_served_version(v1, None, None).problem == (
        f"the active pointer names nothing, not {v1.snapshot_id}"
    )


def test_an_upstream_serving_other_files_is_named(snapshots: dict[str, Snapshot]) -> None:
    v1, v2 = snapshots["v1"], snapshots["v2"]
    roots = {"primary": lora_path(v1), "secondary": lora_path(v2), "tertiary": None}
    served = build_served_version(v1, v1, roots)
    assert served.version == UNKNOWN_VERSION
    assert served.problem == f"secondary serves {MODEL} from {lora_path(v2)}, not {lora_path(v1)}"
    served = build_served_version(v1, v1, {"primary": lora_path(v1), "tertiary": None})
    assert served.problem == f"tertiary serves {MODEL} from None, not {lora_path(v1)}"
