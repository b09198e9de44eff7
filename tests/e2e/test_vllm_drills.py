"""`redline up --source vllm`: the local stack with no gateway in the path, and the drills that
must close there too (`latency`, `regression`, `regression-negative`, `saturation`).

The simulators publish vLLM's exposition, Prometheus scrapes them with a `region` target label,
the rules come from the spec with `sources: {profile: vllm}`, and versions come from the
snapshot registry. The stack is started and stopped through the real CLI (one Prometheus: the
federated topology is the gateway suite's); the drills' timings go to
`.redline/artifacts/drills-vllm.json` (override with REDLINE_VLLM_DRILLS_ARTIFACT).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from redline.devstack.drills.base import DrillResult
from redline.devstack.drills.run import run_drills
from redline.devstack.layout import StackLayout, build_part_names
from redline.devstack.parts import part_alive
from redline.devstack.report import render_json, write_json
from redline.devstack.state import load_running
from redline.rules.records import rollback_records
from redline.slo import catalog
from tests.support.stack import UP_TIMEOUT, RunningStack, processes_mentioning, redline

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = Path(
    os.environ.get(
        "REDLINE_VLLM_DRILLS_ARTIFACT", REPO / ".redline" / "artifacts" / "drills-vllm.json"
    )
)
SOURCE = "vllm"
DRILLS = ("latency", "regression", "regression-negative", "saturation")


@pytest.fixture(scope="module")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """`redline up --source vllm`; `redline down` at the end, nothing left behind."""
    run_dir = tmp_path_factory.mktemp("vllm-stack") / "run"
    started = time.monotonic()
    up = redline("up", "--run-dir", str(run_dir), "--source", SOURCE, timeout=UP_TIMEOUT)
    seconds = time.monotonic() - started
    assert up.returncode == 0, f"redline up --source vllm failed:\n{up.stdout}\n{up.stderr}"
    state = load_running(run_dir)
    try:
        yield RunningStack(run_dir, state, up, seconds)
    finally:
        state = load_running(run_dir)
        down = redline("down", "--run-dir", str(run_dir), timeout=180.0)
        assert down.returncode == 0, down.stderr
        alive = [p.name for p in state.parts if part_alive(p)]
        assert not alive, f"still running after down: {alive}"
        assert not processes_mentioning(str(run_dir)), "processes of the run dir survived"


@pytest.fixture(scope="module")
def drills(vllm_stack: RunningStack) -> dict[str, DrillResult]:
    """Run the four drills once, in this order; write the artifact."""
    state = load_running(vllm_stack.run_dir)
    started = time.monotonic()

    def progress(drill: str, message: str) -> None:
        if not message.startswith("waiting for"):
            print(f"[{time.monotonic() - started:6.1f} s] [{drill}] {message}", flush=True)

    results = run_drills(list(DRILLS), state, state.load_spec(), progress)
    extra = {
        "run_dir": str(vllm_stack.run_dir),
        "source": SOURCE,
        "rate": state.rate,
        "up_seconds": round(vllm_stack.up_seconds, 1),
        "drills_seconds": round(time.monotonic() - started, 1),
    }
    write_json(ARTIFACT, render_json(results, extra))
    return {result.drill: result for result in results}


def _explain(result: DrillResult) -> str:
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    return f"{result.drill}: error={result.error} failed checks={failed} {result.as_dict()}"


def _query(http: httpx.Client, url: str, promql: str) -> list[dict[str, str]]:
    body = http.get(f"{url}/api/v1/query", params={"query": promql}).json()
    return [series["metric"] for series in body["data"]["result"]]


def test_up_starts_no_gateway_and_prometheus_scrapes_the_engines(
    vllm_stack: RunningStack,
) -> None:
    state = load_running(vllm_stack.run_dir)
    assert state.source == SOURCE and state.status == "running"
    names = [p.name for p in state.parts]
    assert names == list(build_part_names(state.regions, source=SOURCE))
    assert "gateway" not in names and "gateway" not in state.ports
    assert all(part_alive(p) for p in state.parts)
    assert "Gateway (OpenAI API)" not in vllm_stack.up.stdout
    endpoints = state.endpoints()
    with httpx.Client(timeout=5, trust_env=False) as http:
        url = endpoints.prometheus_url
        targets = http.get(f"{url}/api/v1/targets").json()["data"]["activeTargets"]
        engines = [t for t in targets if t["labels"]["job"] == SOURCE]
        assert {t["labels"]["region"] for t in engines} == set(state.regions)
        assert all(t["health"] == "up" for t in targets), targets
        assert "gateway" not in {t["labels"]["job"] for t in targets}
        served = _query(http, url, 'vllm:e2e_request_latency_seconds_count{model_name="chat-lora"}')
        assert {s["region"] for s in served} >= {state.regions[0]}
        assert _query(http, url, 'http_requests_total{status="2xx"}')
        # No copy of the engine's series: model_version is joined after the sum, on the
        # recorded requests by version the rollback gate reads.
        by_version = rollback_records(state.load_spec())["requests"]
        versions = {
            s["model_version"] for s in _query(http, url, f'{by_version}{{model="chat-lora"}}')
        }
        assert versions == {"v1"}, versions  # joined from the registry's active version
        assert not _query(http, url, str(catalog.LLM_REQUEST_DURATION_SECONDS) + "_count")
        groups = http.get(f"{url}/api/v1/rules").json()["data"]["groups"]
        assert "redline-sources" in {g["name"] for g in groups}
    status = redline("status", "--run-dir", str(vllm_stack.run_dir), "--json", timeout=60)
    health = json.loads(status.stdout)["health"]
    assert set(health) == set(names)


@pytest.mark.parametrize("name", DRILLS)
def test_the_drill_loop_closes_without_a_gateway(drills: dict[str, DrillResult], name: str) -> None:
    result = drills[name]
    assert result.error is None, _explain(result)
    assert all(check.ok for check in result.checks), _explain(result)
    if not result.expect_alert:
        assert result.firing_at is None, _explain(result)
        return
    fault = result.fault_at
    detected, notified, recovered = result.firing_at, result.notified_at, result.recovered_at
    assert fault is not None, _explain(result)
    assert detected is not None and notified is not None and recovered is not None, _explain(result)
    assert fault < detected < recovered and fault < notified < recovered, _explain(result)
    assert result.remediated_at is not None and result.remediated_at < recovered, _explain(result)
    if result.playbook is not None:
        started = result.playbook_started_at
        assert started is not None and notified <= started <= result.remediated_at
    assert result.within_budget, _explain(result)
    assert result.ok, _explain(result)


def test_the_latency_red_line_pages_and_nothing_pretends_to_reroute(
    drills: dict[str, DrillResult],
) -> None:
    result = drills["latency"]
    checks = {c.name: c for c in result.checks}
    assert result.playbook is None and result.job_id is None, _explain(result)
    assert checks["nothing rerouted (no gateway in the path)"].ok, _explain(result)
    assert checks["P99 of primary under the red line again"].ok, _explain(result)
    assert result.resolved_notified_at is not None, _explain(result)
    assert any("no gateway" in note for note in result.notes)


def test_the_gate_rolls_the_regressed_version_back_and_stays_silent_on_latency_alone(
    drills: dict[str, DrillResult],
) -> None:
    regression, negative = drills["regression"], drills["regression-negative"]
    checks = {(r.drill, c.name): c for r in (regression, negative) for c in r.checks}
    assert regression.playbook == "semantic_rollback" and regression.job_id, _explain(regression)
    assert checks[("regression", "v1 active again")].ok
    assert checks[("regression", "every region serves v1")].ok
    assert checks[("regression-negative", "latency signal on, with enough traffic")].ok
    assert checks[("regression-negative", "gate stays quiet")].ok
    assert checks[("regression-negative", "no rollback job")].ok


@pytest.mark.parametrize("name", ["latency", "regression-negative", "saturation"])
def test_users_see_no_failed_request(drills: dict[str, DrillResult], name: str) -> None:
    result = drills[name]
    assert result.failed_requests == 0, f"{result.failed_detail} {_explain(result)}"


def test_the_artifact_holds_the_timings(drills: dict[str, DrillResult]) -> None:
    data = json.loads(ARTIFACT.read_text())
    assert data["source"] == SOURCE
    assert [d["drill"] for d in data["drills"]] == list(DRILLS)
    for entry in data["drills"]:
        for key in ("time_to_detect", "time_to_notify", "time_to_remediate", "time_to_recover"):
            assert key in entry
    assert StackLayout(Path(data["run_dir"])).root.name == "run"


def test_every_dashboard_panel_returns_data_from_the_vllm_stack(
    vllm_stack: RunningStack, drills: dict[str, DrillResult], tmp_path: Path
) -> None:
    """The dashboards `redline up --source vllm` wrote read vLLM's own series through the rules'
    mirror: after the drills every panel query returns data from the stack's Prometheus (run by
    `redline dashboards check`); only annotations of incidents these four drills do not cause
    (RPO, staleness, burn rate) may find none. The spot board needs the spot fleet (checked in
    tests/integration), the quotas board the gateway stack's quota drill."""
    layout = StackLayout(vllm_stack.run_dir)
    copied = 0
    for path in layout.dashboards_dir.glob("*.json"):
        # The spot board needs the spot fleet, the quotas board redline's gateway (quotas are
        # enforced there; a stack without a gateway has none).
        if path.name not in ("spot.json", "quotas.json"):
            shutil.copy(path, tmp_path / path.name)
            copied += 1
    assert copied >= 5
    state = load_running(vllm_stack.run_dir)
    last = max(60.0, time.time() - state.started_at)
    check = redline(
        "dashboards", "check", "--prometheus", state.endpoints().prometheus_url,
        "--dir", str(tmp_path), "--profile", "local", "--last", f"{last:.0f}",
        timeout=300.0,
    )  # fmt: skip
    # Exit 1 means some query found nothing; which ones may is decided below.
    assert check.returncode in (0, 1), check.stdout + check.stderr
    *lines, summary = check.stdout.strip().splitlines()
    # The keep-alive canary's first verdict comes `min_seconds` (300 s) after a canary session
    # is written: this stack's four drills are over sooner (the gateway suite, longer, sees it).
    empty = [line for line in lines if not line.startswith("ok") and "annotation" not in line]
    assert [line for line in empty if "'Keep-alive canary'" not in line] == [], check.stdout
