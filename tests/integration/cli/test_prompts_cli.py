"""`redline prompts trace|verify` against a log anchored in a real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from redline.cli import app
from redline.platform.promptlog import PromptLog, PromptRecord

pytestmark = pytest.mark.integration


def test_trace_and_verify(redis_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = PromptLog(redis.Redis.from_url(redis_url), directory, "cli", fsync=False)
    for b in range(3):
        log.append(
            [
                PromptRecord(f"2026-01-01T00:0{b}:0{k}Z", f"s{k % 2}", f"r{b}{k}", "p", "a")
                for k in range(5)
            ]
        )
    where = ["--directory", str(directory), "--redis-url", redis_url, "--key-prefix", "cli"]
    runner = CliRunner()
    result = runner.invoke(app, ["prompts", "trace", "s1", "--json", *where])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["verified"] and len(document["records"]) == 6
    assert all(r["verified"] and r["proof"] for r in document["records"])
    result = runner.invoke(app, ["prompts", "verify", *where])
    assert result.exit_code == 0 and "ok: 3 batches, 15 records" in result.output

    lines = log.segment.read_bytes().splitlines(keepends=True)
    del lines[7]  # batch 1, leaf 2
    log.segment.write_bytes(b"".join(lines))
    result = runner.invoke(app, ["prompts", "verify", *where])
    assert result.exit_code == 1
    assert "records batch 1 leaf 2: missing: the record was deleted" in result.output
    result = runner.invoke(app, ["prompts", "verify", "--batch", "0", *where])
    assert result.exit_code == 0
    result = runner.invoke(app, ["prompts", "trace", "s0", *where])
    assert result.exit_code == 1 and "NOT VERIFIED" in result.output
