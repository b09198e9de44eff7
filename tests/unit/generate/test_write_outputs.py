"""`redline generate` writes files any reader can open (containers mount them read-only)."""

from __future__ import annotations

import stat
from pathlib import Path

from redline.generate.outputs import write_outputs


def test_written_files_are_world_readable_and_unchanged_ones_are_left_alone(
    tmp_path: Path,
) -> None:
    outputs = {Path("rules/a.yml"): "a: 1\n", Path("compose/b.yml"): "b: 2\n"}
    assert sorted(write_outputs(tmp_path, outputs)) == sorted(outputs)
    for relative, text in outputs.items():
        path = tmp_path / relative
        assert path.read_text() == text
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert write_outputs(tmp_path, outputs) == []
    assert not list(tmp_path.rglob(".*.yml*")), "no temporary file is left behind"
