"""The redis-failover drill on a Sentinel stack of its own (`redline up --redis sentinel
--replicas 2`: two gateways, two receivers, two exporters): the primary is SIGKILLed mid-burst;
no alert answered 202 and no acknowledged index write is lost, no alert is run twice although
both receivers get each, no canary is doubled, and the seconds of 503 are printed."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from redline.devstack.drills.run import run_drills
from redline.devstack.parts import part_alive
from redline.devstack.state import load_running
from redline.slo import catalog
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
                 "--rate", "8", "--pods", "1", "--replicas", "2", timeout=UP_TIMEOUT)  # fmt: skip
    assert up.returncode == 0, f"redline up failed:\n{up.stdout}\n{up.stderr}"
    try:
        state = load_running(run_dir)
        assert state.redis == "sentinel" and state.endpoints().redis_url.startswith(
            "redis+sentinel://"
        )
        replicas = ("gateway-2", "remediation-2", "exporters-2")
        assert state.replicas == 2
        assert all(part_alive(p) for p in state.parts if p.name in replicas)
        assert {p.name for p in state.parts} >= {"gateway", "remediation", "exporters", *replicas}
        status = redline("status", "--run-dir", str(run_dir), timeout=120.0)
        assert all(name in status.stdout for name in replicas), status.stdout
        endpoints = state.endpoints()
        # Both gateways serve the load generator's traffic, and Prometheus scrapes every replica.
        for url in endpoints.gateway_urls:
            text = httpx.get(f"{url}/metrics", timeout=5).text
            assert f"{catalog.LLM_REQUESTS_TOTAL.name}{{" in text, url
        targets = httpx.get(f"{endpoints.prometheus_url}/api/v1/targets", timeout=5).json()
        jobs = [t["labels"]["job"] for t in targets["data"]["activeTargets"]]
        for job in ("gateway", "remediation", "exporters"):
            assert jobs.count(job) == 2, jobs
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
        checks = {c.name for c in result.checks}
        assert {"no duplicate playbook run", "never two canary runners at once",
                "index_staleness canaries not doubled"} <= checks  # fmt: skip
        assert result.ok
    finally:
        state = load_running(run_dir)  # the drill restarted the old primary (new pid)
        down = redline("down", "--run-dir", str(run_dir), timeout=180.0)
        assert down.returncode == 0, down.stderr
        assert not [p.name for p in state.parts if part_alive(p)]
        assert not processes_mentioning(str(run_dir))
