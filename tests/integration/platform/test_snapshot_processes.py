"""Snapshot registry across processes: a writer killed between its temp write and the rename
leaves the old state, and concurrent writer processes get unique sequences."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from redline.platform.snapshots import SnapshotRegistry
from tests.support.snapshots import MODEL, make_artifacts


@pytest.fixture()
def registry(tmp_path: Path) -> SnapshotRegistry:
    return SnapshotRegistry(tmp_path / "registry")


def _run_crashing(root: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` in a fresh interpreter where `os.replace` kills the process, as a crash would."""
    script = textwrap.dedent(
        """
        import os, sys
        from pathlib import Path
        from redline.platform.snapshots import SnapshotRegistry
        registry = SnapshotRegistry(Path(sys.argv[1]))
        def crash(src, dst):
            os._exit(17)  # the temp file is written and fsynced; the rename never happens
        os.replace = crash
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_crash_between_temp_write_and_replace_leaves_old_state(
    registry: SnapshotRegistry, tmp_path: Path
) -> None:
    first = registry.create(MODEL, "v1", *make_artifacts(tmp_path, "v1"))
    second = registry.create(MODEL, "v2", *make_artifacts(tmp_path, "v2"))
    registry.activate(MODEL, first.snapshot_id)

    result = _run_crashing(registry.root, f"registry.activate({MODEL!r}, {second.snapshot_id!r})")
    assert result.returncode == 17, result.stderr
    weights, config = make_artifacts(tmp_path, "v3")
    result = _run_crashing(
        registry.root,
        f"registry.create({MODEL!r}, 'v3', Path({str(weights)!r}), Path({str(config)!r}))",
    )
    assert result.returncode == 17, result.stderr
    result = _run_crashing(
        registry.root,
        "from redline.platform.snapshots import Baselines\n"
        f"registry.mark_verified({MODEL!r}, {first.snapshot_id!r}, "
        "Baselines(p99_seconds=1.0, accuracy_ratio=0.5))",
    )
    assert result.returncode == 17, result.stderr

    model_dir = registry.root / "models" / "org%2Fchat-7b"
    leftovers = sorted(p.name for p in model_dir.rglob(".*.tmp"))
    assert len(leftovers) == 3, leftovers  # the crashed writers' complete temp files
    fresh = SnapshotRegistry(registry.root)
    assert fresh.active(MODEL) == first
    assert fresh.list(MODEL) == [second, first]
    assert fresh.scan(MODEL)[1] == []
    assert not fresh.get(MODEL, first.snapshot_id).verified
    # The registry keeps working after the crash.
    fresh.activate(MODEL, second.snapshot_id)
    assert fresh.active(MODEL) == second


def test_concurrent_writers_get_unique_sequences(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from redline.platform.snapshots import SnapshotRegistry
        registry = SnapshotRegistry(Path(sys.argv[1]))
        base = Path(sys.argv[2])
        for i in range(15):
            d = base / f"w{i}"
            d.mkdir(parents=True)
            (d / "weights.bin").write_bytes(f"{base.name}-{i}".encode())
            (d / "config.json").write_text("{}")
            registry.create("m", f"{base.name}-{i}", d / "weights.bin", d / "config.json")
            registry.record_checkpoint("lora-a", when=float(i))
        """
    )
    writers = [
        subprocess.Popen([sys.executable, "-c", script, str(root), str(tmp_path / name)])
        for name in ("a", "b", "c")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    registry = SnapshotRegistry(root)
    snapshots = registry.list("m")
    assert sorted(s.sequence for s in snapshots) == list(range(1, 46))
    assert registry.checkpoints()[0].last_success == 14.0
