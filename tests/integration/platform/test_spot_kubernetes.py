"""The spot agent on Kubernetes, against local fakes of the API server and of a cloud hook served
over HTTP (no cluster here), with a real Redis, real simulators and a real gateway: a notice
taints the node (its other taints kept), takes this node's serving pods (only those) out of their
Services, and asks for a replacement while the drain still runs; a second notice does not ask
twice; the recovery undoes the node actions. The last test runs the agent as a real process
configured like the DaemonSet (config file, NODE_NAME/POD_NAMESPACE from the environment) with a
slow cloud hook that the drain does not wait for."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from redline.agents.spot import SpotAgent, SpotAgentSettings, build_agent_app
from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.processes import free_port, http_ok, spawn, wait_until
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.spot import (
    RBAC_RULES,
    SCALE_RBAC_RULES,
    KubernetesClient,
    KubernetesScaleUp,
    ReplacementLog,
    ReplacementRunner,
    build_replacement_request,
    scale_spot,
)
from redline.platform.spot.state import Notice
from redline.slo import catalog
from redline.slo.load import load_spec
from tests.support.kubeapi import FakeHook, FakeKubernetes, build_hook_app, serve_kubeapi
from tests.support.remediation import wait_for

pytestmark = pytest.mark.integration

BASE = "redline-base"
GATE = "redline.dev/spot-safe"
KEY = "redline.dev/spot-preempted"
NODE = "ip-10-0-1-17.ec2.internal"
OTHER_NODE = "ip-10-0-2-9.ec2.internal"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SA_TOKEN = "spot-agent-sa-t0ken"
ADMIN_TOKEN = "spot-admin-t0ken"
HOOK_TOKEN = "cloud-hook-t0ken"


def grant_agent_rules(fake: FakeKubernetes) -> None:
    """Exactly the rules the agent declares it needs (the manifests grant these)."""
    for rule in (*RBAC_RULES, *SCALE_RBAC_RULES):
        for resource in rule["resources"]:
            fake.grant(SA_TOKEN, *((verb, resource) for verb in rule["verbs"]))


def cluster() -> FakeKubernetes:
    fake = FakeKubernetes()
    grant_agent_rules(fake)
    fake.add_node(NODE, taints=[GPU_TAINT])
    fake.add_node(OTHER_NODE)
    fake.add_pod("serving", "chat-0", NODE, {"app": "chat"})
    fake.add_pod("serving", "chat-1", NODE, {"app": "chat"})
    fake.add_pod("serving", "chat-2", OTHER_NODE, {"app": "chat"})
    fake.add_pod("serving", "spot-agent-x1", NODE, {"app": "spot-agent"}, gate=None)
    fake.add_deployment("serving", "chat", 2)
    return fake


def secret(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    return path


def scraped(text: str, metric: catalog.Metric, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric.name and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return float(sample.value)
    return None


@pytest.fixture()
def fake() -> FakeKubernetes:
    return cluster()


@pytest.fixture()
def kubeapi(fake: FakeKubernetes) -> Iterator[ServerThread]:
    with serve_kubeapi(fake) as server:
        yield server


def test_a_notice_taints_unreadies_and_scales_up_beside_the_drain(
    redis_url: str,
    fake: FakeKubernetes,
    kubeapi: ServerThread,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The downward API's variables, as the DaemonSet sets them.
    monkeypatch.setenv("NODE_NAME", NODE)
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    sims = {
        node: serve_in_thread(build_simulator_app(SimulatorSettings(region=node, seed=i)))
        for i, node in enumerate(("spot-a", "ondemand"))
    }
    for server in sims.values():
        httpx.post(f"{server.url}/admin/faults", json={"tokens_per_second": 50}).raise_for_status()
    admin = secret(tmp_path, "admin-token", ADMIN_TOKEN)
    gateway = serve_in_thread(
        build_gateway_app(
            GatewaySettings(
                upstreams={n: s.url for n, s in sims.items()},
                redis_url=redis_url,
                admin_token_file=admin,
            ),
            load_spec().spec,
        )
    )
    settings = SpotAgentSettings.model_validate(
        {
            "redis_url": redis_url, "node": "spot-a", "provider": "manual", "model": BASE,
            "upstream_url": sims["spot-a"].url, "gateway_urls": [gateway.url],
            "gateway_token_file": admin, "time_scale": 0.1, "flow_poll_seconds": 0.05,
            "kubernetes": {"enabled": True, "api_url": kubeapi.url, "pod_selector": "app=chat",
                           "token_file": str(secret(tmp_path, "sa-token", SA_TOKEN)),
                           "ready_interval_seconds": 0.2},
            "replacement": {"kind": "kubernetes", "deployment": "chat"},
        }
    )  # fmt: skip
    # The replacement of the same instance never passes the gate: recover gives up in 1.5 s.
    spot = scale_spot(load_spec().spec.spot, 0.1).model_copy(
        update={"readiness_timeout_seconds": 1.5}
    )
    app = build_agent_app(settings, spot)
    agent_state: SpotAgent = app.state.agent
    agent = serve_in_thread(app)
    client = httpx.Client(timeout=15.0, trust_env=False)
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}

    def state() -> dict[str, Any]:
        data: dict[str, Any] = client.get(f"{agent.url}/state").json()
        return data

    def conditions() -> dict[str, str | None]:
        return {name: fake.condition("serving", name, GATE)
                for name in ("chat-0", "chat-1", "chat-2", "spot-agent-x1")}  # fmt: skip

    try:
        # At start the agent marks its node's serving pods ready (their readiness gate).
        wait_for(lambda: conditions()["chat-1"] == "True", timeout=10, what="pods ready")
        assert conditions() == {"chat-0": "True", "chat-1": "True", "chat-2": None,
                                "spot-agent-x1": None}  # fmt: skip
        # A stream in flight that fits the budget keeps the drain running for about a second.
        body = {"model": BASE, "messages": [{"role": "user", "content": "keep going"}],
                "max_tokens": 60, "stream": True}  # fmt: skip
        stream = threading.Thread(
            target=lambda: client.post(f"{gateway.url}/v1/chat/completions", json=body)
        )
        stream.start()
        time.sleep(0.3)
        sent = time.time()
        first = client.post(f"{agent.url}/notice", json={"in_seconds": 4}, headers=auth)
        assert first.status_code == 200, first.text
        wait_for(lambda: state()["state"] in ("draining", "terminating"), timeout=5,
                 what="draining")  # fmt: skip
        # A second notice for the node while its preemption runs.
        second = client.post(f"{agent.url}/notice", json={"in_seconds": 4}, headers=auth)
        assert second.status_code == 200
        wait_for(lambda: state()["state"] == "terminating", timeout=10, what="terminating")
        record = state()["record"]
        draining_at = float(record["draining_at"])
        terminating_at = float(record["terminating_at"])
        assert terminating_at - draining_at > 0.3  # the drain really ran (the stream continued)

        # The node: tainted NoSchedule, its other taint kept, by a merge patch with a version.
        assert fake.taints(NODE) == [GPU_TAINT, {"key": KEY, "value": "manual",
                                                 "effect": "NoSchedule"}]  # fmt: skip
        assert fake.taints(OTHER_NODE) == []
        [taint] = fake.calls_of("patch", "nodes", 200)
        assert taint.body["metadata"]["resourceVersion"]
        # The pods: this node's serving pods not ready (the kubelet's conditions kept); the
        # other node's pod and the agent's own pod untouched.
        assert conditions() == {"chat-0": "False", "chat-1": "False", "chat-2": None,
                                "spot-agent-x1": None}  # fmt: skip
        assert fake.condition("serving", "chat-0", "ContainersReady") == "True"
        unready = [c for c in fake.calls_of("patch", "pods/status", 200)
                   if c.body["status"]["conditions"][0]["status"] == "False"]  # fmt: skip
        assert sorted(c.name for c in unready) == ["chat-0", "chat-1"]
        # The replacement: +1 replica, asked at notice time, while the drain was still running.
        assert fake.replicas("serving", "chat") == 3
        [scaled] = fake.calls_of("patch", "deployments/scale", 200)
        assert sent <= scaled.at < terminating_at
        assert scaled.at - sent < 1.0
        assert all(sent <= c.at < terminating_at for c in (taint, *unready))

        # The second notice is handled once the first recover gives up: no second scale-up.
        def notices() -> float | None:
            text = client.get(f"{agent.url}/metrics").text
            return scraped(text, catalog.LLM_SPOT_NOTICES_TOTAL, node="spot-a")

        wait_for(lambda: notices() == 2.0, timeout=10, what="second notice handled")
        assert agent_state.notices.qsize() == 0
        time.sleep(0.6)  # what a second scale-up would take, several reconcile intervals
        assert fake.replicas("serving", "chat") == 3
        assert len(fake.calls_of("patch", "deployments/scale")) == 1
        assert conditions()["chat-0"] == "False"  # the reconcile keeps a preempted node out
        metrics = client.get(f"{agent.url}/metrics").text
        replacements = catalog.LLM_SPOT_REPLACEMENT_REQUESTS_TOTAL
        assert scraped(metrics, replacements, node="spot-a", via="kubernetes",
                       outcome="requested") == 1.0  # fmt: skip
        last = state()["cluster"]["last"]
        assert last["replacement"]["outcome"] == "requested"
        assert last["kubernetes"]["tainted"] is True
        ledger = ReplacementLog(redis.Redis.from_url(redis_url), settings.state_key_prefix)
        assert (ledger.get("spot-a") or {})["outcome"] == "requested"
        ledger.client.close()

        # A new instance comes up on the node's address: RECOVERED, and the node actions undone
        # (a node that survived: a drill, or a notice that did not end in a reclaim).
        port = sims["spot-a"].port
        sims["spot-a"].stop()
        sims["spot-a"] = serve_in_thread(
            build_simulator_app(SimulatorSettings(region="spot-a", seed=7)), port=port
        )
        wait_for(lambda: state()["state"] == "recovered", timeout=15, what="recovered")
        ready = {"chat-0": "True", "chat-1": "True", "chat-2": None, "spot-agent-x1": None}
        wait_for(lambda: conditions() == ready, timeout=5, what="pods ready again")
        assert fake.taints(NODE) == [GPU_TAINT]
        stream.join(10)
    finally:
        client.close()
        for server in (agent, gateway, *sims.values()):
            server.stop()


def test_the_same_notice_seen_again_does_not_scale_twice(
    redis_url: str, fake: FakeKubernetes, kubeapi: ServerThread, tmp_path: Path
) -> None:
    kube = KubernetesClient(kubeapi.url, secret(tmp_path, "sa-token", SA_TOKEN))
    ledger = ReplacementLog(redis.Redis.from_url(redis_url), "redline:spot")
    results: list[str] = []
    runner = ReplacementRunner(
        KubernetesScaleUp(kube, "serving", "chat"), ledger, on_result=lambda r: results.append(
            r.outcome)
    )  # fmt: skip
    notice = Notice("spot-a", "aws", "interruption", "terminate", 100.0, 100.5, 220.0)
    try:
        request = build_replacement_request(notice, NODE)
        assert runner.run(request).outcome == "requested"
        # A restarted agent re-reads the same instance-action: the claim in Redis holds.
        again = ReplacementRunner(KubernetesScaleUp(kube, "serving", "chat"), ledger)
        assert again.run(build_replacement_request(notice, NODE)).outcome == "duplicate"
        assert fake.replicas("serving", "chat") == 3
        assert (ledger.get("spot-a") or {})["request_id"] == request.request_id
        # A failed request releases its claim: the next sight of that notice tries again.
        later = Notice("spot-a", "aws", "interruption", "terminate", 900.0, 900.5, 1020.0)
        fake.fail_next["patch deployments/scale"] = [500, 500, 500]
        assert runner.run(build_replacement_request(later)).outcome == "failed"
        assert (ledger.get("spot-a") or {})["outcome"] == "failed"
        assert runner.run(build_replacement_request(later)).outcome == "requested"
        assert fake.replicas("serving", "chat") == 4
        assert results == ["requested", "failed", "requested"]
    finally:
        kube.close()
        ledger.client.close()


def test_the_agent_process_with_a_slow_cloud_hook_drains_without_waiting(
    redis_url: str, fake: FakeKubernetes, kubeapi: ServerThread, tmp_path: Path
) -> None:
    hook = FakeHook(HOOK_TOKEN, fail_first=1, delay_seconds=1.0)
    hook_server = serve_in_thread(build_hook_app(hook))
    sim = serve_in_thread(build_simulator_app(SimulatorSettings(region="spot-b")))
    port = free_port()
    config = tmp_path / "spot-agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": "spot-b", "provider": "manual", "host": "127.0.0.1", "port": port,
                "redis_url": redis_url, "upstream_url": sim.url, "time_scale": 0.1,
                "flow_poll_seconds": 0.05, "admin_token_file": str(secret(tmp_path, "admin",
                                                                          ADMIN_TOKEN)),
                "kubernetes": {"enabled": True, "api_url": kubeapi.url,
                               "token_file": str(secret(tmp_path, "sa-token", SA_TOKEN)),
                               "pod_selector": "app=chat", "ready_interval_seconds": 0.2},
                "replacement": {"kind": "webhook", "url": f"{hook_server.url}/replace",
                                "token_file": str(secret(tmp_path, "hook", HOOK_TOKEN)),
                                "backoff_seconds": 0.2},
            }
        )
    )  # fmt: skip
    env = {**os.environ, "NODE_NAME": NODE, "POD_NAMESPACE": "serving"}
    url = f"http://127.0.0.1:{port}"
    process = spawn(
        [sys.executable, "-m", "redline.cli", "spot-agent", "run", "--config", str(config)],
        tmp_path / "agent.log",
        env,
    )
    client = httpx.Client(timeout=10.0, trust_env=False)
    try:
        wait_until(process, "spot agent", http_ok(f"{url}/healthz"), timeout=60)
        wait_for(lambda: fake.condition("serving", "chat-0", GATE) == "True", timeout=10,
                 what="pods ready")  # fmt: skip
        answer = client.post(f"{url}/notice", json={"in_seconds": 3},
                             headers={"authorization": f"Bearer {ADMIN_TOKEN}"})  # fmt: skip
        assert answer.status_code == 200, answer.text

        def record() -> dict[str, Any]:
            data: dict[str, Any] = client.get(f"{url}/state").json()
            return data

        wait_for(lambda: record()["state"] == "terminating", timeout=10, what="terminating")
        wait_for(lambda: hook.accepted(), timeout=10, what="the hook accepted")
        drained = record()
        draining_at = float(drained["record"]["draining_at"])
        assert drained["notice_to_draining"] < 1.0
        # DRAINING came before the hook had even answered its first call (1 s, then a 503).
        first = hook.deliveries[0]
        assert first.status == 503 and draining_at < first.at + hook.delay_seconds
        [accepted] = hook.accepted()
        assert accepted.headers["authorization"] == f"Bearer {HOOK_TOKEN}"
        assert accepted.body["node"] == "spot-b" and accepted.body["kubernetes_node"] == NODE
        assert accepted.body["provider"] == "manual"
        assert accepted.body["deadline_unix"] == pytest.approx(
            float(drained["record"]["terminate_at"])
        )
        assert accepted.headers["idempotency-key"] == accepted.body["request_id"]
        replacements = catalog.LLM_SPOT_REPLACEMENT_REQUESTS_TOTAL

        def requested() -> float | None:
            text = client.get(f"{url}/metrics").text
            return scraped(text, replacements, node="spot-b", via="webhook", outcome="requested")

        wait_for(lambda: requested() == 1.0, timeout=5, what="replacement counted")
        # The node of NODE_NAME is tainted, its serving pods out; the other node's untouched.
        assert fake.taints(NODE)[-1] == {"key": KEY, "value": "manual", "effect": "NoSchedule"}
        assert fake.condition("serving", "chat-1", GATE) == "False"
        assert fake.condition("serving", "chat-2", GATE) is None
        assert record()["cluster"]["last"]["replacement"]["via"] == "webhook"
    finally:
        client.close()
        process.stop()
        hook_server.stop()
        sim.stop()


def test_a_missing_rbac_rule_is_reported_naming_it(
    redis_url: str, fake: FakeKubernetes, kubeapi: ServerThread, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A token without `patch pods/status`: the agent starts, reports the missing rule."""
    monkeypatch.setenv("NODE_NAME", NODE)
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    fake.grant("no-status", ("get", "nodes"), ("patch", "nodes"), ("list", "pods"))
    settings = SpotAgentSettings.model_validate(
        {"redis_url": redis_url, "node": "spot-c", "provider": "manual", "admin_open": True,
         "kubernetes": {"enabled": True, "api_url": kubeapi.url, "pod_selector": "app=chat",
                        "token_file": str(secret(tmp_path, "t", "no-status")),
                        "ready_interval_seconds": 0.2}}
    )  # fmt: skip
    agent = serve_in_thread(build_agent_app(settings, load_spec().spec.spot))
    try:

        def error() -> str | None:
            value = httpx.get(f"{agent.url}/state").json()["last_error"]
            return None if value is None else str(value)

        message = wait_for(error, timeout=10, what="the RBAC error")
        assert "may not `patch` `pods/status` in namespace serving" in message
        assert 'resources: ["pods/status"], verbs: ["patch"]' in message
        metrics = httpx.get(f"{agent.url}/metrics").text
        assert (scraped(metrics, catalog.LLM_SPOT_AGENT_ERRORS_TOTAL, node="spot-c") or 0) >= 1
    finally:
        agent.stop()
