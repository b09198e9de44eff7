"""`redline prompts trace|verify` against a log anchored in a real Redis."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import cast

import pytest
import redis
from typer.testing import CliRunner, Result

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

    lines = log.segment_path(0).read_bytes().splitlines(keepends=True)
    del lines[7]  # batch 1, leaf 2
    log.segment_path(0).write_bytes(b"".join(lines))
    result = runner.invoke(app, ["prompts", "verify", *where])
    assert result.exit_code == 1
    assert "records batch 1 leaf 2: missing: the record was deleted" in result.output
    result = runner.invoke(app, ["prompts", "verify", "--batch", "0", *where])
    assert result.exit_code == 0
    result = runner.invoke(app, ["prompts", "trace", "s0", *where])
    assert result.exit_code == 1 and "NOT VERIFIED" in result.output


def test_verify_names_every_tampered_batch(redis_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = PromptLog(redis.Redis.from_url(redis_url), directory, "cli", fsync=False)
    for b in range(3):
        log.append([PromptRecord(f"t{b}{k}", "s", f"r{b}{k}", "p", "a") for k in range(4)])
    lines = log.segment_path(0).read_bytes().splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]  # batch 0, leaves 1 and 2
    lines[9] = lines[9].replace(b'"answer":"a"', b'"answer":"b"')  # batch 2, leaf 1
    log.segment_path(0).write_bytes(b"".join(lines))
    where = ["--directory", str(directory), "--redis-url", redis_url, "--key-prefix", "cli"]
    result = CliRunner().invoke(app, ["prompts", "verify", *where])
    assert result.exit_code == 1
    assert "TAMPERED: 3 problems in batches 0, 2 (3 batches, 12 records verified" in result.output
    assert "  records batch 0 leaf 2: found at position 1: reordered" in result.output
    assert "  records batch 2 leaf 1: request r21: content does not match" in result.output


def test_watch(redis_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "log"
    client = redis.Redis.from_url(redis_url)
    log = PromptLog(client, directory, "cli", fsync=False)
    log.append([PromptRecord(f"t{k}", "s", f"r{k}", "p", "a") for k in range(4)])
    where = ["--directory", str(directory), "--redis-url", redis_url, "--key-prefix", "cli"]
    runner = CliRunner()
    result = runner.invoke(app, ["prompts", "watch", "--max-seconds", "0.3", *where])
    assert result.exit_code == 0, result.output
    assert "baseline ok, 1 batches, 4 records verified" in result.output
    assert "file events inotify, roots keyspace notifications" in result.output

    outcome: list[Result] = []
    command = ["prompts", "watch", "--exit-on-tamper", "--max-seconds", "30", *where]
    thread = threading.Thread(target=lambda: outcome.append(runner.invoke(app, command)))
    thread.start()
    time.sleep(1.0)  # the baseline, then the watch (were it slower, the baseline would report)
    forged = json.loads(cast(bytes, client.lindex(log.keys.roots, 0))) | {"root": "00" * 32}
    client.lset(log.keys.roots, 0, json.dumps(forged))
    thread.join(30)
    assert outcome and outcome[0].exit_code == 1, outcome and outcome[0].output
    assert "TAMPERED: redis batch 0: " in outcome[0].output
