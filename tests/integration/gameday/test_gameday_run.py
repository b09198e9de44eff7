"""`redline gameday run` as an SRE runs it, against a real Prometheus (the generated rules of the
local profile) and a real Alertmanager, with the fake Kubernetes API of the spot tests standing
in for the cluster: its create/delete hooks play Chaos Mesh's controller, taking a scrape
target's series away for the experiment's duration (a PodChaos on the exporters).

The game day applies the experiment, times detect and the Alertmanager hop from its polls,
deletes the experiment when its duration passes, waits for the recovery, and writes the §5
table, JSON and a verifiable audit file. Its detection time agrees with Prometheus's own record
(the ALERTS series) within one scrape interval plus one poll. An abort condition and Ctrl-C both
remove the experiment."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.processes import Service, start_alertmanager, start_prometheus
from redline.platform.prometheus import PrometheusClient
from redline.remediation.audit import read_file_records, verify_file
from redline.rules.build import build_rule_groups
from redline.rules.render import render_rule_file
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import parse_duration
from tests.support.kubeapi import FakeKubernetes, serve_kubeapi

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "gameday-t0ken"
NAMESPACE = "redline"
POLL = 0.25
SCRAPE = 1.0  # the local profile's scrape and evaluation interval


@dataclass
class Target:
    """A scrape target serving every series the rules' SLI guards look for, plus the request
    counters; `down` makes it answer 503 (its pods failed), `errors` fails requests."""

    names: list[str]
    down: bool = False
    erroring: bool = False
    requests: float = 0.0
    errors: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def page(self) -> str:
        with self.lock:
            self.requests += 10
            if self.erroring:
                self.errors += 10
            lines = [f"{name} 0" for name in self.names]
            lines.append(f"{catalog.LLM_REQUESTS_TOTAL} {self.requests}")
            lines.append(f"{catalog.LLM_REQUEST_ERRORS_TOTAL} {self.errors}")
        return "\n".join(lines) + "\n"


def build_target_app(target: Target) -> FastAPI:
    app = FastAPI()

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        if target.down:
            return PlainTextResponse("pod failed", status_code=503)
        return PlainTextResponse(target.page())

    return app


@dataclass
class Cluster:
    fake: FakeKubernetes
    kubeapi: ServerThread
    target: Target
    prometheus: Service
    alertmanager: Service
    token_file: Path
    timers: list[threading.Timer]


def _controller(fake: FakeKubernetes, target: Target, timers: list[threading.Timer]) -> None:
    """What Chaos Mesh does: a PodChaos fails the pods for its duration; an HTTPChaos-like
    error fault is played by `erroring` (the abort test)."""

    def created(obj: dict[str, Any]) -> None:
        if obj["kind"] != "PodChaos":
            return
        target.down = True
        timer = threading.Timer(parse_duration(obj["spec"]["duration"]), restore, (obj,))
        timers.append(timer)
        timer.start()

    def restore(obj: dict[str, Any]) -> None:
        target.down = False

    fake.on_create.append(created)
    fake.on_delete.append(restore)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    spec = apply_profile(load_spec().spec, "local")
    rules = render_rule_file(build_rule_groups(spec), "spec.yaml")
    names = sorted(set(re.findall(r"absent\((\w+)\)", rules)))
    target = Target(names)
    fake = FakeKubernetes()
    fake.grant(TOKEN, ("create", "podchaos"), ("delete", "podchaos"))
    timers: list[threading.Timer] = []
    _controller(fake, target, timers)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    (tmp_path / "rules.yml").write_text(rules)
    am_config = tmp_path / "alertmanager.yml"
    am_config.write_text(yaml.safe_dump({
        "route": {"receiver": "none", "group_wait": "1s", "group_interval": "2s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "none"}],
    }))  # fmt: skip
    started: list[Service] = []
    target_server = serve_in_thread(build_target_app(target))
    try:
        with serve_kubeapi(fake) as kubeapi:
            alertmanager = start_alertmanager(tmp_path / "am", am_config)
            started.append(alertmanager)
            config = tmp_path / "prometheus.yml"
            config.write_text(yaml.safe_dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [
                    {"targets": [f"127.0.0.1:{alertmanager.port}"]}]}]},
                "scrape_configs": [{"job_name": "redline", "static_configs": [
                    {"targets": [f"127.0.0.1:{target_server.port}"]}]}],
            }))  # fmt: skip
            prometheus = start_prometheus(tmp_path / "prom", config)
            started.append(prometheus)
            _wait_quiet(prometheus)
            yield Cluster(fake, kubeapi, target, prometheus, alertmanager, token_file, timers)
    finally:
        for timer in timers:
            timer.cancel()
        for service in reversed(started):
            service.stop()
        target_server.stop()


def _wait_quiet(prometheus: Service) -> None:
    """Until the target has been scraped and no SLI guard is pending or firing."""
    client = PrometheusClient(f"http://127.0.0.1:{prometheus.port}")
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            up = client.instant("up")
            absent = [a for a in client.alerts() if a["labels"]["alertname"] == Alert.SLI_ABSENT]
            if up and up[0][1] == 1 and not absent:
                time.sleep(2 * SCRAPE)  # an evaluation after the first scrape
                return
            time.sleep(0.5)
    finally:
        client.close()
    raise AssertionError("the target was not scraped, or an SLI guard stayed active")


def _gameday(
    cluster: Cluster, tmp_path: Path, drill: str, *extra: str, kubeconfig: Path | None = None
) -> list[str]:
    api = (["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else
           ["--api-url", cluster.kubeapi.url, "--token-file", str(cluster.token_file)])  # fmt: skip
    return [
        sys.executable, "-m", "redline.cli", "gameday", "run", drill, "--profile", "local",
        "--namespace", NAMESPACE,
        "--prometheus", f"http://127.0.0.1:{cluster.prometheus.port}",
        "--alertmanager", f"http://127.0.0.1:{cluster.alertmanager.port}",
        "--apply", *api,
        "--audit-file", str(tmp_path / "audit.jsonl"), "--out", str(tmp_path / "out"),
        "--poll", str(POLL), *extra,
    ]  # fmt: skip


def _kubeconfig(cluster: Cluster, tmp_path: Path) -> Path:
    """A kubeconfig as an SRE's: the API server and a token file beside it."""
    path = tmp_path / "kube" / "config"
    path.parent.mkdir()
    (path.parent / "gameday.token").write_text(cluster.token_file.read_text())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "clusters": [{"name": "prod", "cluster": {"server": cluster.kubeapi.url}}],
        "users": [{"name": "gameday", "user": {"tokenFile": "gameday.token"}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "gameday"}}],
    }))  # fmt: skip
    return path


def _first_firing(prometheus: Service, since: float, until: float) -> float | None:
    """When Prometheus itself first recorded the alert firing (its ALERTS series)."""
    client = PrometheusClient(f"http://127.0.0.1:{prometheus.port}")
    try:
        query = f'ALERTS{{alertname="{Alert.SLI_ABSENT}", alertstate="firing"}}'
        series = client.range_raw(query, since, until, SCRAPE / 2)
    finally:
        client.close()
    stamps = [float(at) for s in series for at, _ in s["values"]]
    return min(stamps) if stamps else None


def test_a_game_day_applies_measures_removes_and_reports(cluster: Cluster, tmp_path: Path) -> None:
    began = time.time()
    done = subprocess.run(
        _gameday(cluster, tmp_path, "exporter-down", "--max-duration", "12",
                 "--abort-error-ratio", "0.5"),
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "gameday.json").read_text())[0]
    # Applied, then deleted when its 12 s passed.
    creates = cluster.fake.calls_of("create", "podchaos", 201)
    deletes = cluster.fake.calls_of("delete", "podchaos", 200)
    assert len(creates) == 1 and len(deletes) == 1, cluster.fake.calls
    assert creates[0].body["metadata"]["labels"]["redline.dev/drill"] == "exporter-down"
    assert 12 <= deletes[0].at - creates[0].at < 12 + 3
    assert not cluster.fake.custom
    # The loop's times: the guard's 5 s `for` after the first failed scrape, Alertmanager after.
    detect, rto = result["detect_seconds"], result["rto_seconds"]
    assert 5 <= detect <= result["budgets"]["detect_seconds"], result
    assert detect <= result["alertmanager_seconds"] <= detect + 3, result
    assert 12 <= rto <= 12 + 8, result
    assert result["verdict"] == "pass" and result["failed_requests"] == 0, result
    # Prometheus's own record agrees within a scrape interval and a poll.
    fault_at = result["fault_at"]
    first = _first_firing(cluster.prometheus, began, time.time())
    assert first is not None
    assert abs((first - fault_at) - detect) <= SCRAPE + POLL, (first - fault_at, detect)
    # The §5 table and an intact audit chain of every step.
    table = (tmp_path / "out" / "gameday.md").read_text()
    assert re.search(r"\| exporter-down \(PodChaos\) \| \d+\.\d s \| – \| 0 \| pass \|", table)
    assert done.stdout.startswith("game day exporter-down: PodChaos redline/redline-exporter-down")
    assert verify_file(tmp_path / "audit.jsonl").ok
    kinds = [json.loads(line)["kind"] for line in read_file_records(tmp_path / "audit.jsonl")]
    assert kinds[:2] == ["gameday.start", "gameday.applied"]
    assert kinds.count("gameday.step") >= 3 and kinds[-1] == "gameday.result"
    assert "gameday.removed" in kinds


def test_the_abort_condition_stops_the_game_day_and_removes_the_experiment(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.target.erroring = True  # every request fails from now on: ratio 1 > 0.2
    done = subprocess.run(
        _gameday(cluster, tmp_path, "exporter-down", "--max-duration", "30",
                 "--abort-error-ratio", "0.2"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "gameday.json").read_text())[0]
    assert result["aborted"].startswith("the client error ratio over the last minute is")
    assert result["verdict"].startswith("ABORTED")
    assert len(cluster.fake.calls_of("delete", "podchaos", 200)) == 1
    assert not cluster.fake.custom
    kinds = [json.loads(line)["kind"] for line in read_file_records(tmp_path / "audit.jsonl")]
    assert "gameday.abort" in kinds and "gameday.removed" in kinds


def test_ctrl_c_removes_the_experiment(cluster: Cluster, tmp_path: Path) -> None:
    """Through a kubeconfig this time, as `kubectl` would reach the cluster."""
    log = tmp_path / "gameday.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            _gameday(cluster, tmp_path, "exporter-down", "--max-duration", "60",
                     "--abort-error-ratio", "0.5", kubeconfig=_kubeconfig(cluster, tmp_path)),
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not cluster.fake.custom and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.2)
        assert cluster.fake.custom, "the experiment was never applied"
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not cluster.fake.custom, "Ctrl-C left the experiment on the cluster: " + log.read_text()
    assert len(cluster.fake.calls_of("delete", "podchaos", 200)) == 1
    kinds = [json.loads(line)["kind"] for line in read_file_records(tmp_path / "audit.jsonl")]
    assert kinds[-1] == "gameday.removed"


def test_without_its_safety_bounds_a_game_day_will_not_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "redline.cli", "gameday", "run", "latency", "--prometheus",
         "http://127.0.0.1:1", "--alertmanager", "http://127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 2
    for needed in ("--namespace: required", "--max-duration: required", "abort condition"):
        assert needed in done.stderr, done.stderr
    assert not (tmp_path / "audit.jsonl").exists()
