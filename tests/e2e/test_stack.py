"""`redline up`, `status`, `down` against the real binaries, and every way they can be misused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from redline.dashboards.render import BUILDERS
from redline.devstack.layout import StackLayout, build_part_names
from redline.devstack.parts import part_alive
from redline.devstack.state import load_running, read_state
from redline.rules.build import p99_record
from redline.slo import catalog
from tests.support.stack import RunningStack, processes_mentioning, redline

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_up_cleans_a_stale_run_dir_and_starts_every_part(stack: RunningStack) -> None:
    assert "stale run directory" in stack.up.stderr
    assert not (stack.run_dir / "logs" / "old.log").exists()
    state = load_running(stack.run_dir)  # the drills may have restarted a part since
    assert [p.name for p in state.parts] == list(
        build_part_names(state.regions, state.prometheus_regions)
    )
    assert all(part_alive(p) for p in state.parts)
    assert state.status == "running"
    for what in ("Prometheus", "Alertmanager", "Remediation receiver"):
        assert what in stack.up.stdout
    assert state.endpoints().prometheus_url in stack.up.stdout
    layout = StackLayout(stack.run_dir)
    for part in state.parts:
        assert Path(part.log).exists() and str(stack.run_dir) in part.log, part.name
    assert oct(layout.token_file.stat().st_mode & 0o777) == "0o600"


def test_status_shows_every_part_healthy(stack: RunningStack) -> None:
    deadline = time.monotonic() + 60
    while True:
        status = redline("status", "--run-dir", str(stack.run_dir), timeout=60)
        if status.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert status.returncode == 0, status.stdout + status.stderr
    for name in build_part_names(stack.state.regions, stack.state.prometheus_regions):
        assert name in status.stdout
    assert "unhealthy" not in status.stdout
    as_json = json.loads(redline("status", "--run-dir", str(stack.run_dir), "--json").stdout)
    assert {p["name"] for p in as_json["parts"]} == set(
        build_part_names(stack.state.regions, stack.state.prometheus_regions)
    )
    assert all(h["healthy"] and h["alive"] for h in as_json["health"].values())


def test_prometheus_and_alertmanager_run_the_generated_local_profile(stack: RunningStack) -> None:
    endpoints = stack.state.endpoints()
    with httpx.Client(timeout=5) as http:
        config = http.get(f"{endpoints.prometheus_url}/api/v1/status/config").json()
        assert "scrape_interval: 1s" in config["data"]["yaml"]
        groups = http.get(f"{endpoints.prometheus_url}/api/v1/rules").json()["data"]["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert rules["RedLineLatencyP99"]["duration"] == 2
        assert "p99_30s" in rules["RedLineLatencyP99"]["query"]
        am = http.get(f"{endpoints.alertmanager_url}/api/v2/status").json()
        assert f"{endpoints.receiver_url}/alerts" in am["config"]["original"]
        assert "group_wait: 1s" in am["config"]["original"]


def _series(http: httpx.Client, url: str, query: str) -> list[dict[str, str]]:
    body = http.get(f"{url}/api/v1/series", params={"match[]": query}).json()
    assert body["status"] == "success", body
    series: list[dict[str, str]] = body["data"]
    return series


def test_each_region_has_its_prometheus_and_the_global_one_federates_them(
    stack: RunningStack,
) -> None:
    """Regional Prometheus servers scrape their region's jobs and stamp `region`; the global
    one scrapes only their /federate endpoints, holds every job's series, evaluates the rules."""
    state = stack.state
    endpoints = state.endpoints()
    assert state.prometheus_regions == state.regions[:2] and endpoints.federated
    first, last = state.prometheus_regions[0], state.prometheus_regions[-1]
    expected_jobs = {first: {"gateway", "exporters"}, last: {"remediation", "alertmanager"}}
    with httpx.Client(timeout=5) as http:
        for region in state.prometheus_regions:
            url = endpoints.regional_prometheus_url(region)
            config = http.get(f"{url}/api/v1/status/config").json()["data"]["yaml"]
            assert f"region: {region}" in config
            assert not http.get(f"{url}/api/v1/rules").json()["data"]["groups"]
            jobs = {s["job"] for s in _series(http, url, "up")} - {"prometheus"}
            assert jobs == expected_jobs[region], region
        global_url = endpoints.prometheus_url
        targets = http.get(f"{global_url}/api/v1/targets").json()["data"]["activeTargets"]
        assert {t["labels"]["job"] for t in targets} == {
            *(f"federate-{r}" for r in state.prometheus_regions),
            "prometheus",
        }
        assert all(t["health"] == "up" for t in targets), targets
        federated = _series(http, global_url, 'up{job=~"gateway|exporters|remediation"}')
        assert {(s["job"], s["region"]) for s in federated} == {
            ("gateway", first),
            ("exporters", first),
            ("remediation", last),
        }
        for query in (str(catalog.REDLINE_PROBE_SUCCESS), 'up{job="alertmanager"}'):
            body = http.get(f"{global_url}/api/v1/query", params={"query": query}).json()
            assert body["data"]["result"], f"the global Prometheus has no {query}"


def test_the_stack_writes_its_dashboards_for_the_local_profile(stack: RunningStack) -> None:
    layout = StackLayout(stack.run_dir)
    spec = stack.state.load_spec()
    names = sorted(path.name for path in layout.dashboards_dir.glob("*.json"))
    assert names == sorted(BUILDERS)
    red_lines = (layout.dashboards_dir / "red-lines.json").read_text("utf-8")
    assert p99_record(spec) in red_lines and "p99_30s" in red_lines


def test_a_second_up_on_a_live_run_dir_is_refused(stack: RunningStack) -> None:
    before = read_state(StackLayout(stack.run_dir))
    second = redline("up", "--run-dir", str(stack.run_dir), timeout=60)
    assert second.returncode == 4
    assert "already running" in second.stderr and "redline down" in second.stderr
    after = read_state(StackLayout(stack.run_dir))
    assert before is not None and after is not None
    assert [p.pid for p in after.parts] == [p.pid for p in before.parts]
    assert all(part_alive(p) for p in after.parts)


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "busy"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = redline("up", "--run-dir", str(run_dir), "--port", f"gateway={port}")
    assert result.returncode == 2
    assert f"gateway={port}" in result.stderr and "in use" in result.stderr
    assert not (run_dir / "state.json").exists()
    assert not processes_mentioning(str(run_dir))


def test_bad_port_option_and_unknown_part_are_clear(tmp_path: Path) -> None:
    result = redline("up", "--run-dir", str(tmp_path / "x"), "--port", "gateway")
    assert result.returncode == 2 and "expected PART=PORT" in result.stderr
    result = redline("up", "--run-dir", str(tmp_path / "y"), "--port", "grafana=3000")
    assert result.returncode == 1 and "unknown part(s) grafana" in result.stderr
    result = redline("up", "--run-dir", str(tmp_path / "z"), "--regions", "3")
    assert result.returncode == 1 and "--regions 3: the spec has 2 region(s)" in result.stderr
    assert "allowed: 1 to 2" in result.stderr and not (tmp_path / "z").exists()
    assert not processes_mentioning(str(tmp_path))


def test_missing_binaries_name_the_install_command(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    result = redline("up", "--run-dir", str(tmp_path / "run"), env=env)
    assert result.returncode == 3
    assert "apt-get install -y prometheus" in result.stderr
    assert "apt-get install -y prometheus-alertmanager" in result.stderr
    assert "apt-get install -y redis-server" in result.stderr
    assert not (tmp_path / "run" / "state.json").exists()


def test_specs_the_stack_cannot_run_are_refused(tmp_path: Path) -> None:
    spec = tmp_path / "one.yaml"
    local = "profiles:\n  local: {scrape_interval_seconds: 1, evaluation_interval_seconds: 1}\n"
    spec.write_text("version: v1\nservice: chat\nregions: [eu]\n" + local)
    result = redline("up", "--run-dir", str(tmp_path / "run"), "--spec", str(spec))
    assert result.returncode == 1
    assert f"{spec}: the local stack needs at least two regions" in result.stderr
    spec.write_text("version: v1\nservice: chat\nregions: [eu, us]\n")
    result = redline("up", "--run-dir", str(tmp_path / "run"), "--spec", str(spec))
    assert result.returncode == 1
    assert f"{spec}: profiles: unknown profile 'local'" in result.stderr
    assert "add one under `profiles:`" in result.stderr
    spec.write_text("version: v1\nservice: chat\n")
    result = redline("up", "--run-dir", str(tmp_path / "run"), "--spec", str(spec))
    assert result.returncode == 1 and f"{spec}: regions: required field is missing" in result.stderr
    assert not processes_mentioning(str(tmp_path / "run"))


def test_down_without_a_stack_and_status_without_one_are_clear(tmp_path: Path) -> None:
    for command in ("down", "status"):
        result = redline(command, "--run-dir", str(tmp_path))
        assert result.returncode == 1
        assert "no stack in" in result.stderr


def _start_up(run_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "up", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_parts(run_dir: Path, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = read_state(StackLayout(run_dir)) if (run_dir / "state.json").exists() else None
        if state is not None and len(state.parts) >= count:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError(f"up did not record {count} parts")


def _interrupt(process: subprocess.Popen[str], sig: int) -> str:
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    return stderr


def test_an_interrupted_up_stops_what_it_started(scratch_run_dir: Path) -> None:
    run_dir = scratch_run_dir
    process = _start_up(run_dir)
    try:
        _wait_parts(run_dir, 7, process)
    finally:
        stderr = _interrupt(process, signal.SIGTERM)
    assert process.returncode == 1
    assert "interrupted by SIGTERM" in stderr
    assert "stopping the parts already started" in stderr
    assert not (run_dir / "state.json").exists()
    assert not processes_mentioning(str(run_dir)), stderr


@pytest.fixture()
def scratch_run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run directory for one test; whatever the test leaves running there is stopped."""
    run_dir = tmp_path / "scratch"
    yield run_dir
    if (run_dir / "state.json").exists():
        redline("down", "--run-dir", str(run_dir), timeout=120)


def test_a_killed_up_is_cleaned_up_by_down(scratch_run_dir: Path) -> None:
    run_dir = scratch_run_dir
    process = _start_up(run_dir)
    try:
        _wait_parts(run_dir, 8, process)
    finally:
        _interrupt(process, signal.SIGKILL)
    state = load_running(run_dir)
    assert state.status == "starting"
    recorded = {p.pid for p in state.parts}
    down = redline("down", "--run-dir", str(run_dir), timeout=120)
    assert down.returncode == 0, down.stderr
    leftovers = [pid for pid, _ in processes_mentioning(str(run_dir))]
    assert not leftovers, f"orphans (recorded: {sorted(recorded)}): {leftovers}"


def test_drill_from_the_cli_prints_json_and_writes_it(stack: RunningStack, tmp_path: Path) -> None:
    unknown = redline("drill", "nope", "--run-dir", str(stack.run_dir))
    assert unknown.returncode == 1 and "unknown drill 'nope'" in unknown.stderr
    out = tmp_path / "drill.json"
    result = redline("drill", "session-rpo", "--run-dir", str(stack.run_dir), "--json",
                     "--json-out", str(out), timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    printed = json.loads(result.stdout)
    assert printed["ok"] is True and [d["drill"] for d in printed["drills"]] == ["session-rpo"]
    assert json.loads(out.read_text())["drills"][0]["time_to_detect"] > 0
    assert list((stack.run_dir / "drills").glob("drills-*.json"))
