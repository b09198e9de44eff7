"""The spot agent and `spot_drain` over real HTTP: an observe-only agent stores a GCP notice, the
alert reaches the real receiver, the real worker drains the node through the gateway, waits for
the replacement's readiness and reopens it; the manual trigger and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from redline.agents.spot import SpotAgentSettings, build_agent_app
from redline.cli import app as cli_app
from redline.devstack.fakes.metadata_server import MetadataSettings, build_metadata_app
from redline.devstack.fakes.simulator import (
    ServerThread,
    SimulatorSettings,
    build_answer,
    build_simulator_app,
    serve_in_thread,
)
from redline.devstack.processes import free_port
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.routing import RoutingStore
from redline.platform.spot import (
    RESUME_HEADER,
    NodeState,
    SpotStateStore,
    parse_spot_error,
    scale_spot,
)
from redline.slo import catalog
from redline.slo.load import load_spec
from tests.support.playbook import playbook_settings, records, run_jobs
from tests.support.remediation import alert, wait_for

pytestmark = pytest.mark.integration

BASE = "redline-base"
SCALE = 0.1  # GCP: a 3 s window, a 1.3 s budget
STARTUP_BOUND = 300.0
"""Only against a hang: a server process is awaited until it answers or exits."""


@dataclass
class Fleet:
    sims: dict[str, ServerThread]
    gateway: ServerThread
    metadata: ServerThread
    agent: ServerThread
    client: httpx.Client
    token_file: Path

    def metric(self, metric: catalog.Metric) -> float | None:
        text = self.client.get(f"{self.agent.url}/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == metric.name:
                    return float(sample.value)
        return None

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = self.client.get(f"{self.agent.url}/state").json()
        return data

    def replace_spot(self) -> None:
        """The node's replacement: a new instance on its address."""
        port = self.sims["spot-a"].port
        old = self.sims["spot-a"]
        old.stop(timeout=30)  # its port must be free again, however busy the machine
        assert not old.thread.is_alive(), "the preempted instance did not stop"
        app = build_simulator_app(SimulatorSettings(region="spot-a", seed=9))
        self.sims["spot-a"] = serve_in_thread(app, port=port)


def replace_once_drained(fleet: Fleet, redis_url: str) -> None:
    """The node goes and a new one boots on its address once the drained node is gone, as on a
    real cloud. A fixed delay raced a slow drain on a busy machine: the drain then read the
    replacement's id as the preempted one, and the readiness gate never passed it."""
    store = SpotStateStore(redis.Redis.from_url(redis_url))

    def gone() -> bool:
        record = store.get("spot-a")
        return record.preempted_instance != "" and time.time() >= (record.gone_at or math.inf)

    try:
        wait_for(gone, timeout=60, what="the preempted node gone")
    finally:
        store.close()
    fleet.replace_spot()


def agent_settings(redis_url: str, **values: Any) -> SpotAgentSettings:
    return SpotAgentSettings.model_validate(
        {
            "redis_url": redis_url,
            "node": "spot-a",
            "model": BASE,
            "time_scale": SCALE,
            "gcp_wait_seconds": 2.0,
            "poll_interval_seconds": 0.1,
            "flow_poll_seconds": 0.05,
            **values,
        }  # fmt: skip
    )


def token_file(tmp_path: Path) -> Path:
    """The gateway's admin token, which the agent and the playbook present."""
    path = tmp_path / "gateway-admin-token"
    path.write_text("spot-admin-t0ken\n")
    return path


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path) -> Iterator[Fleet]:
    token = token_file(tmp_path)
    sims = {
        node: serve_in_thread(build_simulator_app(SimulatorSettings(region=node, seed=i)))
        for i, node in enumerate(("spot-a", "ondemand"))
    }
    # The spot node streams slowly enough that, however late a busy machine starts the playbook,
    # the 200-token answer is far from done when it triages (10 tokens/s: 20 s in all).
    for node, rate in (("spot-a", 10), ("ondemand", 50)):
        httpx.post(
            f"{sims[node].url}/admin/faults", json={"tokens_per_second": rate}
        ).raise_for_status()
    gateway = serve_in_thread(
        build_gateway_app(
            GatewaySettings(
                upstreams={n: s.url for n, s in sims.items()},
                redis_url=redis_url,
                routing_refresh_seconds=0.1,
                admin_token_file=token,
            ),
            load_spec().spec,
        )
    )
    metadata = serve_in_thread(build_metadata_app(MetadataSettings(provider="gcp")))
    settings = agent_settings(
        redis_url,
        provider="gcp",
        metadata_url=metadata.url,
        upstream_url=sims["spot-a"].url,
        gateway_urls=[gateway.url],
        gateway_token_file=token,
        act=False,
    )
    agent = serve_in_thread(build_agent_app(settings, scale_spot(load_spec().spec.spot, SCALE)))
    client = httpx.Client(timeout=15.0, trust_env=False)
    yield Fleet(sims, gateway, metadata, agent, client, token)
    client.close()
    for server in (agent, metadata, gateway, *sims.values()):
        server.stop()


def test_spot_drain_playbook_drains_waits_for_the_replacement_and_reopens(
    redis_url: str, fleet: Fleet
) -> None:
    prompt = "a long answer the playbook interrupts"
    body = {"model": BASE, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 200, "stream": True}  # fmt: skip
    streamed: list[str] = []

    def client() -> None:
        with fleet.client.stream(
            "POST", f"{fleet.gateway.url}/v1/chat/completions", json=body
        ) as response:
            streamed.extend(line[6:] for line in response.iter_lines() if line.startswith("data:"))

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(0.5)
    fleet.client.post(f"{fleet.metadata.url}/admin/notice", json={"in_seconds": 3})
    # The agent only observes (act: false): the notice is pending until someone drains it.
    pending = catalog.LLM_SPOT_NOTICE_PENDING
    wait_for(lambda: fleet.metric(pending) == 1.0, timeout=5, what="pending")
    assert fleet.state()["state"] == "ready"
    settings = playbook_settings(
        redis_url,
        serving={"gateway_url": fleet.gateway.url, "upstreams": {
            n: s.url for n, s in fleet.sims.items()}, "probe_model": BASE},
        playbook_options={"spot_drain": {"time_scale": SCALE, "poll_seconds": 0.05,
                                         "readiness_timeout_seconds": 20,
                                         "gateway_token_file": str(fleet.token_file)}},
    )  # fmt: skip
    replacer = threading.Thread(target=replace_once_drained, args=(fleet, redis_url))
    replacer.start()
    start = datetime.now(UTC) - timedelta(seconds=1)
    labels = {"alertname": "SpotPreemptionNotice", "node": "spot-a", "provider": "gcp"}
    [job] = run_jobs(
        settings, alert("5a00000000000001", playbook="spot_drain", starts_at=start, labels=labels)
    )
    replacer.join()
    thread.join(10)
    assert job.status == "succeeded", job.error
    # Each step ran, in order. A worker that loses its lease (Redis slow on a busy machine) has
    # the job re-run from the node's state, so the last attempt's plan may hold only the rest.
    ran = [s["name"] for s in job.steps if s["phase"] == "execute" and s["ok"]]
    assert list(dict.fromkeys(ran)) == ["drain", "wait_drained", "recover"], job.steps
    assert [s["name"] for s in job.plan or []][-1] == "recover"
    [triage] = records(job, "triage")
    (report,) = triage["data"]["reports"]
    assert [d["action"] for d in report["decisions"]] == [
        "abort"
    ]  # ~190 tokens x 0.1 s do not fit 1.1 s
    verify = next(s for s in job.steps if s["phase"] == "verify")
    assert verify["ok"] and verify["data"]["replacement_latency"] > 0
    store = SpotStateStore(redis.Redis.from_url(redis_url))
    record = store.get("spot-a")
    store.close()
    assert record.state is NodeState.RECOVERED
    assert record.notice_to_draining is not None and record.budget_seconds == pytest.approx(1.3)
    routing = RoutingStore(redis.Redis.from_url(redis_url))
    assert routing.get_admission("spot-a").open
    routing.close()
    assert fleet.metric(pending) == 0.0
    assert fleet.metric(catalog.LLM_NODE_STATE) is not None
    # The client's stream ended with the contract's event; its retry resumes elsewhere.
    error = json.loads(next(e for e in streamed if e.startswith('{"error"')))
    info = parse_spot_error(error)
    assert info is not None and info.recoverable
    prefix = "".join(
        (json.loads(e)["choices"][0]["delta"].get("content") or "")
        for e in streamed
        if e.startswith('{"id"') and json.loads(e)["choices"]
    )
    retry = fleet.client.post(
        f"{fleet.gateway.url}/v1/chat/completions",
        json=body,
        headers={RESUME_HEADER: info.request_id},
    )
    rest = "".join(
        (json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
        for line in retry.text.splitlines()
        if line.startswith('data: {"id"') and json.loads(line[6:])["choices"]
    )
    assert prefix + rest == " ".join(build_answer(prompt, BASE, 200, False)[0])


def test_the_agent_acts_on_a_manual_trigger_from_the_cli(redis_url: str, tmp_path: Path) -> None:
    sims = {
        node: serve_in_thread(build_simulator_app(SimulatorSettings(region=node, seed=i)))
        for i, node in enumerate(("spot-a", "ondemand"))
    }
    token = token_file(tmp_path)
    gateway = serve_in_thread(
        build_gateway_app(
            GatewaySettings(
                upstreams={n: s.url for n, s in sims.items()},
                redis_url=redis_url,
                admin_token_file=token,
            ),
            load_spec().spec,
        )
    )
    # No token of its own: POST /notice takes the gateways' token the agent holds.
    settings = agent_settings(
        redis_url,
        provider="manual",
        upstream_url=sims["spot-a"].url,
        gateway_urls=[gateway.url],
        gateway_token_file=token,
    )
    agent = serve_in_thread(build_agent_app(settings, scale_spot(load_spec().spec.spot, SCALE)))
    runner = CliRunner()
    trigger = ["spot-agent", "trigger", "--agent-url", agent.url]
    try:
        anonymous = runner.invoke(cli_app, [*trigger, "--in-seconds", "2"])
        assert anonymous.exit_code == 1 and "401" in anonymous.output
        wrong = tmp_path / "wrong"
        wrong.write_text("nope\n")
        refused = runner.invoke(cli_app, [*trigger, "--token-file", str(wrong)])
        assert refused.exit_code == 1 and "401" in refused.output
        assert httpx.get(f"{agent.url}/state").json()["state"] == "ready"
        result = runner.invoke(cli_app, [*trigger, "--in-seconds", "2", "--token-file", str(token)])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["node"] == "spot-a"

        def state() -> str:
            return str(httpx.get(f"{agent.url}/state").json()["state"])

        wait_for(lambda: state() == "terminating", timeout=10, what="terminating")
        assert httpx.get(f"{gateway.url}/healthz").json()["draining"] == ["spot-a"]
        port = sims["spot-a"].port
        sims["spot-a"].stop()  # gone; a new instance takes its place
        sims["spot-a"] = serve_in_thread(build_simulator_app(SimulatorSettings(region="spot-a")),
                                         port=port)  # fmt: skip
        wait_for(lambda: state() == "recovered", timeout=15, what="recovered")
        assert httpx.get(f"{gateway.url}/healthz").json()["draining"] == []
        status = runner.invoke(
            cli_app, ["spot-agent", "status", "--node", "spot-a", "--redis-url", redis_url]
        )
        assert status.exit_code == 0, status.output
        line = json.loads(status.output)
        assert line["state"] == "recovered" and line["provider"] == "manual"
        metrics = httpx.get(f"{agent.url}/metrics").text
        assert f'{catalog.LLM_NODE_STATE}{{node="spot-a",state="recovered"}} 1.0' in metrics
        drained = catalog.LLM_SPOT_NOTICE_TO_DRAINING_SECONDS.count
        assert f'{drained}{{node="spot-a",provider="manual"}} 1.0' in metrics
        assert str(catalog.LLM_SPOT_REPLACEMENT_READY_LATENCY_SECONDS) in metrics
        checked = subprocess.run(
            ["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        bad = runner.invoke(cli_app, [*trigger, "--in-seconds", "-1", "--token-file",
                                      str(token)])  # fmt: skip
        assert bad.exit_code == 1 and "422" in bad.output
    finally:
        for server in (agent, gateway, *sims.values()):
            server.stop()


def test_cli_rejects_bad_agent_settings_and_serves_metadata(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli_app, ["spot-agent", "run", "--provider", "aws"])
    assert missing.exit_code == 2 and "node: required" in missing.output
    wrong = runner.invoke(cli_app, ["spot-agent", "run", "--node", "a", "--provider", "azure"])
    assert wrong.exit_code == 2 and "provider" in wrong.output
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "simulate", "metadata", "--provider", "gcp",
         "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/computeMetadata/v1/instance/preempted"

        def answer() -> httpx.Response | None:
            # Waits on the server's start-up, however long a busy machine makes the CLI's
            # imports take; a server that exits fails at once.
            assert process.poll() is None, f"metadata server exited {process.returncode}"
            try:
                return httpx.get(url, headers={"Metadata-Flavor": "Google"}, timeout=0.5)
            except httpx.HTTPError:
                return None

        response = wait_for(answer, timeout=STARTUP_BOUND, what="metadata server")
        assert response.text == "FALSE"
        assert httpx.get(url).status_code == 403
    finally:
        process.terminate()
        process.wait(10)
