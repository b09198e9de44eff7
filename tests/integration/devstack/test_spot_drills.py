"""The spot drills on a fleet of real processes: simulators, the gateway, one spot agent per node
(processes), metadata servers, Prometheus with the generated spot alerts, the tests' Redis.

Every drill must end with zero client-visible non-recoverable failures, every answer equal to
what an uninterrupted request gets, and notice -> DRAINING within the spec's target.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from redline.dashboards.render import DASHBOARDS_DIR
from redline.devstack.dashcheck.check import (
    check_dashboard,
    fetch_context,
    load_dashboards,
    render_outcomes,
)
from redline.devstack.drills.registry import DRILLS
from redline.devstack.drills.spot.fleet import FleetConfig, SpotFleet
from redline.devstack.drills.spot.scenarios import SPOT_DRILL_ORDER, SpotDrillReport, run_spot_drill
from redline.devstack.processes import Service
from redline.platform.prometheus import PrometheusClient
from redline.slo import catalog
from redline.slo.load import load_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def fleet_started() -> float:
    """When the module's fleet started (the dashboard test queries from then on)."""
    return time.time()


@pytest.fixture(scope="module")
def fleet(
    redis_service: Service, tmp_path_factory: pytest.TempPathFactory, fleet_started: float
) -> Iterator[SpotFleet]:
    config = FleetConfig(
        tmp_path_factory.mktemp("spot-fleet"), redis_service.extra["url"], load_spec().spec
    )
    running = SpotFleet(config)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def run(fleet: SpotFleet, name: str) -> SpotDrillReport:
    lines: list[str] = []
    report = run_spot_drill(name, fleet, lines.append)
    out = Path(fleet.workdir) / f"{name}.json"
    out.write_text(json.dumps(report.as_dict(), indent=2))
    assert report.error is None, f"{report.error}\n" + "\n".join(lines)
    failed = [c for c in report.checks if not c[1]]
    assert not failed, failed
    assert report.non_recoverable_failures == 0, report.failures
    assert report.load["requests"] > 0 and report.load["succeeded"] == report.load["requests"]
    assert report.ok
    return report


def test_the_drills_are_registered_for_redline_drill() -> None:
    for name in SPOT_DRILL_ORDER:
        assert name in DRILLS


def test_one_node_preempted_under_load(fleet: SpotFleet) -> None:
    report = run(fleet, "spot-one")
    (node,) = report.nodes
    assert report.notice_windows == {"aws": 6.0} and report.drain_budgets == {"aws": 5.15}
    assert report.replacement_latency[node] is not None
    assert report.triage[node]  # requests were in flight on the node and were triaged


def test_two_nodes_at_once_spill_to_on_demand(fleet: SpotFleet) -> None:
    report = run(fleet, "spot-two")
    assert set(report.nodes) == {"spot-a", "spot-b"}
    assert report.served.get("ondemand", 0) > 0
    assert all(report.replacement_latency[n] is not None for n in report.nodes)


def test_notice_during_long_streams_triage_and_resume(fleet: SpotFleet) -> None:
    report = run(fleet, "spot-long-streams")
    (node,) = report.nodes
    assert report.triage[node].get("abort", 0) > 0
    assert report.triage[node].get("continue", 0) > 0
    assert report.load["resumed"] == report.load["interrupted"] > 0
    assert report.wasted_decode_tokens == 0  # every abort resumed after its prefix


def test_replacement_that_never_becomes_ready(fleet: SpotFleet) -> None:
    report = run(fleet, "spot-never-ready")
    (node,) = report.nodes
    assert report.alert_firing_after is not None and report.alert_resolved_after is not None
    assert report.alert_resolved_after > report.alert_firing_after
    latency = report.replacement_latency[node]
    assert latency is not None and latency > report.notice_windows["gcp"]


def test_the_spot_dashboard_shows_the_drills(fleet: SpotFleet, fleet_started: float) -> None:
    """After the four drills, every query of the committed spot dashboard returns data from the
    fleet's Prometheus (it scrapes the fleet's gateway and agents and evaluates the spot alerts).
    What the receiver publishes has no source here, the fleet runs none: the remediation-runs
    annotation and the GPU node recoveries (`gpu_node_failure`'s histogram, which the
    gpu-node-failure drill's test checks)."""
    assert fleet.prometheus is not None
    root = Path(__file__).resolve().parents[3]
    dashboard = load_dashboards(root / DASHBOARDS_DIR)["spot.json"]
    end = time.time()
    with PrometheusClient(fleet.prometheus.url, timeout=30, trust_env=False) as client:
        # From the fleet's start: a short range gives fine steps, so the alerts of the
        # time-compressed drills (firing for seconds) fall on a step as Grafana would draw them.
        start = fleet_started
        context = fetch_context(client, dashboard, start, end, fleet.config.scrape_seconds)
        outcomes = check_dashboard(client, "spot.json", dashboard, context)
    receiver_only = catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS.name
    bad = [
        o
        for o in outcomes
        if not o.has_data
        and o.where != "annotation 'Remediation runs'"
        and receiver_only not in o.expr
    ]
    assert len(outcomes) > 15 and not bad, render_outcomes(bad)
