"""bench.weights' next version differs from the first in exactly one shard, as its figures
assume."""

from __future__ import annotations

from pathlib import Path

from bench.weights import sha256_file, write_model, write_next_version

SHARD = 64 * 1024


def _shards(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[i : i + SHARD] for i in range(0, len(data), SHARD)]


def test_the_next_version_changes_one_shard_only(tmp_path: Path) -> None:
    first, second = tmp_path / "v1", tmp_path / "v2"
    write_model(first, 10 * SHARD + 123, chunk=SHARD)
    write_next_version(first, second, SHARD)
    before, after = _shards(first), _shards(second)
    assert len(before) == len(after) == 11
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [5]
    assert sha256_file(first, SHARD) != sha256_file(second, SHARD)
