"""compose-as-processes: compose/docker-compose.yml, configured by `redline compose init --demo`,
run service by service as local processes (tests/support/compose_processes.py says how), then
the `latency` and `staleness` drills against it through the real `redline drill`. A redline
service whose command, flags, settings or healthcheck do not work fails here."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from redline.slo import catalog
from redline.slo.load import load_spec
from tests.support.compose_processes import (
    REDLINE,
    ComposeRun,
    run_compose,
    wait_for,
    write_drill_state,
)

NOT_RUNNABLE_HERE = {
    "grafana", "thanos-sidecar", "thanos-query", "milvus-etcd", "milvus-minio", "jaeger"
}  # fmt: skip
"""No local binary: Grafana (its dashboards are checked against Prometheus and Grafana's schema
elsewhere), Thanos, Milvus standalone's etcd and MinIO (Milvus Lite needs neither), and Jaeger
(the gateway's exporter finds no one at its address and drops its spans; the local stack's
trace store, tests/integration/devstack/test_tracestore.py, takes them instead)."""


@pytest.fixture(scope="module")
def compose_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeRun]:
    yield from run_compose(tmp_path_factory.mktemp("compose"))


def _query(run: ComposeRun, promql: str) -> list[dict[str, object]]:
    response = httpx.get(
        f"{run.url('prometheus', 9090)}/api/v1/query", params={"query": promql}, timeout=5.0
    )
    response.raise_for_status()
    result: list[dict[str, object]] = response.json()["data"]["result"]
    return result


def test_every_service_runs_but_those_without_a_local_binary(compose_run: ComposeRun) -> None:
    services = compose_run.services
    redline = {name for name, s in services.items() if s["image"].startswith("redline:")}
    assert redline == {
        "exporters", "gateway", "remediation", "index-replicator", "session-replica",
        "simulator-primary", "simulator-secondary", "loadgen", "index-writer", "session-writer",
    }  # fmt: skip
    assert redline <= set(compose_run.started)
    assert set(compose_run.not_run) == NOT_RUNNABLE_HERE
    assert set(compose_run.started) | set(compose_run.not_run) == set(services)
    # the remediation receiver runs with the settings init wrote, its workers included
    assert "--config" in compose_run.argv["remediation"]


def test_prometheus_scrapes_every_redline_target_and_loads_the_rules(
    compose_run: ComposeRun,
) -> None:
    def all_up() -> bool:
        up = {str(r["metric"]["job"]): r["value"][1] for r in _query(compose_run, "up")}  # type: ignore[index]
        return all(up.get(job) == "1" for job in ("gateway", "exporters", "remediation"))

    wait_for(all_up, 60.0, "gateway, exporters and remediation up in Prometheus")
    rules = httpx.get(f"{compose_run.url('prometheus', 9090)}/api/v1/rules", timeout=5.0).json()
    assert len(rules["data"]["groups"]) > 5


def test_the_alertmanagers_form_a_cluster(compose_run: ComposeRun) -> None:
    def peers() -> bool:
        status = httpx.get(
            f"{compose_run.url('alertmanager-1', 9093)}/api/v2/status", timeout=5.0
        ).json()
        return len(status["cluster"]["peers"]) == 2

    wait_for(peers, 60.0, "two Alertmanager peers")


def test_the_signals_have_something_to_measure(compose_run: ComposeRun) -> None:
    """The replicator and the CDC consumer run: staleness and session RPO are measured."""

    def measured() -> bool:
        staleness = _query(compose_run, catalog.VECTORDB_INDEX_STALENESS_SECONDS.name)
        rpo = _query(compose_run, catalog.SESSION_CDC_RPO_SECONDS.name)
        return bool(staleness) and bool(rpo)

    wait_for(measured, 90.0, "index staleness and session RPO series")


def test_the_latency_and_staleness_drills_pass(compose_run: ComposeRun, tmp_path: Path) -> None:
    regions = list(load_spec(compose_run.compose_dir / "config" / "spec.yaml").spec.regions)
    run_dir = tmp_path / "run"
    write_drill_state(compose_run, run_dir, regions)
    out = tmp_path / "drills.json"
    done = subprocess.run(
        [REDLINE, "drill", "latency", "staleness", "--run-dir", str(run_dir),
         "--json-out", str(out)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    results = {r["drill"]: r for r in json.loads(out.read_text("utf-8"))["drills"]}
    assert set(results) == {"latency", "staleness"}
    for name, result in results.items():
        assert result["ok"], f"{name}: {result}"
