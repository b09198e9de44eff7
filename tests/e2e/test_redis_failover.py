"""The redis-failover drill on a Sentinel stack of its own (`redline up --redis sentinel`): the
primary is SIGKILLed mid-burst; no alert answered 202 and no acknowledged index write is lost,
and the seconds of 503 are printed."""

from __future__ import annotations

import time
from pathlib import Path

from redline.devstack.drills.run import run_drills
from redline.devstack.parts import part_alive
from redline.devstack.state import load_running
from redline.slo.load import default_spec_text
from tests.support.stack import UP_TIMEOUT, processes_mentioning, redline


def test_redis_failover_loses_nothing_acknowledged(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    spec = tmp_path / "spec.yaml"
    text = default_spec_text()
    assert "  min_replicas_ack: 0" in text
    # A 202 waits for the replica, so the job survives the primary's death (docs/redis.md).
    spec.write_text(text.replace("  min_replicas_ack: 0", "  min_replicas_ack: 1", 1))
    up = redline("up", "--run-dir", str(run_dir), "--redis", "sentinel", "--spec", str(spec),
                 "--rate", "8", "--pods", "1", timeout=UP_TIMEOUT)  # fmt: skip
    assert up.returncode == 0, f"redline up failed:\n{up.stdout}\n{up.stderr}"
    try:
        state = load_running(run_dir)
        assert state.redis == "sentinel" and state.endpoints().redis_url.startswith(
            "redis+sentinel://"
        )
        started = time.monotonic()

        def progress(drill: str, message: str) -> None:
            print(f"[{time.monotonic() - started:6.1f} s] [{drill}] {message}", flush=True)

        [result] = run_drills(["redis-failover"], state, state.load_spec(), progress)
        for figure in result.figures:
            print(figure.text())
        failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
        assert result.error is None and not failed, (result.error, failed, result.as_dict())
        assert result.not_applicable is None
        assert result.lost == 0, result.lost_detail
        assert result.ok
    finally:
        state = load_running(run_dir)  # the drill restarted the old primary (new pid)
        down = redline("down", "--run-dir", str(run_dir), timeout=180.0)
        assert down.returncode == 0, down.stderr
        assert not [p.name for p in state.parts if part_alive(p)]
        assert not processes_mentioning(str(run_dir))
