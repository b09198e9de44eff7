"""`gpu_node_failure` over real HTTP and a real Redis: a `GPUXidCritical` alert reaches the real
receiver, the real worker taints the node on the fake Kubernetes API, drains its serving
instance through the real gateway, waits for the replacement's readiness and reopens it; the
same job run again changes nothing."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.routing import RoutingStore
from redline.platform.spot import NodeState, SpotStateStore
from redline.remediation.audit import AuditLog
from redline.remediation.catalog import open_registry
from redline.remediation.models import Alert
from redline.remediation.playbook import PlaybookContext
from redline.remediation.playbooks.gpu import (
    DEFAULT_GPU_STATE_PREFIX,
    DEFAULT_GPU_TAINT_KEY,
    RBAC_RULES,
    GpuNodeFailure,
)
from redline.remediation.settings import RemediationSettings
from redline.slo import catalog
from redline.slo.load import load_spec
from tests.support.kubeapi import FakeKubernetes, serve_kubeapi
from tests.support.playbook import playbook_settings, records, run_jobs
from tests.support.remediation import alert, receiver, wait_for

pytestmark = pytest.mark.integration

BASE = "redline-base"
NODE = "gpu-node-7"  # the Kubernetes node; its serving instance is the upstream `gpu-a`
UPSTREAM = "gpu-a"
SA_TOKEN = "remediation-sa-t0ken"
ADMIN_TOKEN = "gpu-admin-t0ken"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SCALE = 0.1  # the shortest spot window (GCP, 30 s) scaled: a 3 s notice, a 1.3 s budget


@dataclass
class Fleet:
    fake: FakeKubernetes
    kubeapi: ServerThread
    sims: dict[str, ServerThread]
    gateway: ServerThread
    admin_token: Path
    sa_token: Path
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=15, trust_env=False))

    def replace(self) -> None:
        """The replacement instance, on the failed one's address: a rebuilt pod, its model
        loading for a moment after start (a cold recovery)."""
        port = self.sims[UPSTREAM].port
        self.sims[UPSTREAM].stop(timeout=30)
        app = build_simulator_app(SimulatorSettings(region=UPSTREAM, seed=9, load_seconds=0.3))
        self.sims[UPSTREAM] = serve_in_thread(app, port=port)

    def draining(self) -> list[str]:
        return list(self.client.get(f"{self.gateway.url}/healthz").json()["draining"])


def secret(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    return path


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path) -> Iterator[Fleet]:
    fake = FakeKubernetes()
    for rule in RBAC_RULES:  # exactly what the playbook declares it needs
        for resource in rule["resources"]:
            fake.grant(SA_TOKEN, *((verb, resource) for verb in rule["verbs"]))
    fake.add_node(NODE, taints=[GPU_TAINT])
    fake.add_node("gpu-node-8")
    admin = secret(tmp_path, "admin", ADMIN_TOKEN)
    sims = {
        name: serve_in_thread(build_simulator_app(SimulatorSettings(region=name, seed=i)))
        for i, name in enumerate((UPSTREAM, "gpu-b"))
    }
    gateway = serve_in_thread(
        build_gateway_app(
            GatewaySettings(
                upstreams={n: s.url for n, s in sims.items()},
                redis_url=redis_url,
                routing_refresh_seconds=0.1,
                admin_token_file=admin,
            ),
            load_spec().spec,
        )
    )
    with serve_kubeapi(fake) as kubeapi:
        fleet = Fleet(fake, kubeapi, sims, gateway, admin, secret(tmp_path, "sa", SA_TOKEN))
        yield fleet
        fleet.client.close()
        for server in (gateway, *fleet.sims.values()):
            server.stop()


def settings_for(redis_url: str, fleet: Fleet) -> RemediationSettings:
    return playbook_settings(
        redis_url,
        serving={"gateway_url": fleet.gateway.url, "probe_model": BASE,
                 "upstreams": {n: s.url for n, s in fleet.sims.items()}},
        playbook_options={"gpu_node_failure": {
            "time_scale": SCALE, "poll_seconds": 0.05, "readiness_timeout_seconds": 20,
            "gateway_token_file": str(fleet.admin_token), "node_upstreams": {NODE: UPSTREAM},
            "kubernetes_api_url": fleet.kubeapi.url, "kubernetes_token_file": str(fleet.sa_token),
            "kubernetes_ca_file": None}},
    )  # fmt: skip


def replace_once_gone(fleet: Fleet, redis_url: str, seen: dict[str, Any]) -> None:
    """Once the drained instance is gone (its notice's end), note what admission looked like
    meanwhile, and boot the replacement on its address."""
    store = SpotStateStore(redis.Redis.from_url(redis_url), DEFAULT_GPU_STATE_PREFIX)
    routing = RoutingStore(redis.Redis.from_url(redis_url))

    def gone() -> bool:
        record = store.get(UPSTREAM)
        return (
            record.state is NodeState.TERMINATING
            and record.preempted_instance != ""
            and time.time() >= (record.gone_at or math.inf)
        )

    try:
        wait_for(gone, timeout=60, what="the failed instance gone")
        seen["admission_open"] = routing.get_admission(UPSTREAM).open
        seen["draining"] = fleet.draining()
        seen["tainted"] = any(t["key"] == DEFAULT_GPU_TAINT_KEY for t in fleet.fake.taints(NODE))
    finally:
        store.close()
        routing.close()
    fleet.replace()


def rerun(settings: RemediationSettings, body: dict[str, Any], redis_url: str) -> list[str]:
    """The same job's plan, steps and verify run again, as a retried or reclaimed job would."""
    playbook = open_registry(settings).get("gpu_node_failure")
    assert isinstance(playbook, GpuNodeFailure)
    client = redis.Redis.from_url(redis_url)
    recorded: list[str] = []
    the_alert = Alert.model_validate_json(json.dumps(body))
    ctx = PlaybookContext(
        job_id="rerun", playbook=playbook.name, alert=the_alert, target=playbook.target(the_alert),
        dry_run=False, attempt=2, redis=client, firing_job=None,
        log=logging.getLogger("rerun"), recorder=lambda name, *_: recorded.append(name),
        lease_check=lambda: None,
    )  # fmt: skip
    try:
        steps = list(playbook.plan(ctx))
        for step in steps:
            result = playbook.execute(ctx, step)
            assert result.ok, result
        assert playbook.verify(ctx).ok
    finally:
        client.close()
    return [step.name for step in steps] + recorded


def recovery_samples(settings: RemediationSettings) -> dict[str, tuple[float, float]]:
    """mode -> (count, sum) of the recovery histogram on the real receiver's /metrics."""
    recovery = catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS
    with receiver(settings) as server:
        text = httpx.get(f"{server.url}/metrics", trust_env=False).text
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (recovery.count, recovery.sum):
                slot = 0 if sample.name == recovery.count else 1
                found.setdefault(sample.labels[catalog.LABEL_RECOVERY_MODE], [0.0, 0.0])[slot] = (
                    sample.value
                )
    return {mode: (count, total) for mode, (count, total) in found.items()}


def test_gpu_node_failure_cordons_drains_and_reopens_once_replaced(
    redis_url: str, fleet: Fleet
) -> None:
    settings = settings_for(redis_url, fleet)
    seen: dict[str, Any] = {}
    replacer = threading.Thread(target=replace_once_gone, args=(fleet, redis_url, seen))
    replacer.start()
    labels = {"alertname": "GPUXidCritical", "node": NODE, "gpu": "3", "severity": "critical"}
    body = alert("9a00000000000001", playbook="gpu_node_failure", labels=labels,
                 starts_at=datetime.now(UTC) - timedelta(seconds=1))  # fmt: skip
    [job] = run_jobs(settings, body)
    replacer.join()
    assert job.status == "succeeded", job.error
    ran = [s["name"] for s in job.steps if s["phase"] == "execute" and s["ok"]]
    assert list(dict.fromkeys(ran)) == ["cordon", "drain", "wait_drained", "recover"], job.steps
    # Tainted beside the GPU taint it had; the failed node stays cordoned after recovery.
    assert fleet.fake.taints(NODE) == [
        GPU_TAINT, {"key": DEFAULT_GPU_TAINT_KEY, "value": "gpu-xid", "effect": "NoSchedule"}
    ]  # fmt: skip
    assert fleet.fake.taints("gpu-node-8") == []
    # Closed while the replacement was missing, open again once it passed the gate.
    assert seen == {"admission_open": False, "draining": [UPSTREAM], "tainted": True}
    routing = RoutingStore(redis.Redis.from_url(redis_url))
    assert routing.get_admission(UPSTREAM).open
    routing.close()
    assert fleet.draining() == []
    store = SpotStateStore(redis.Redis.from_url(redis_url), DEFAULT_GPU_STATE_PREFIX)
    record, notice = store.get(UPSTREAM), store.get_notice(UPSTREAM)
    store.close()
    assert record.state is NodeState.RECOVERED and record.provider == "gpu-xid"
    assert record.budget_seconds == pytest.approx(1.3)
    assert notice is not None and notice.detail == f"GPUXidCritical on node {NODE}"
    # Spot's own records are untouched: no spot notice pending for the node.
    spot = SpotStateStore(redis.Redis.from_url(redis_url))
    assert spot.get_notice(UPSTREAM) is None and spot.get(UPSTREAM).state is NodeState.READY
    spot.close()
    [triage] = records(job, "triage")
    assert len(triage["data"]["reports"]) == 1
    verify = next(s for s in job.steps if s["phase"] == "verify")
    assert verify["ok"] and verify["data"]["tainted"] and verify["data"]["admission_open"]
    # Recovery observed once, cold (the gate waited on the rebuilt pod's model), drain start to
    # the gate passing, on the receiver's /metrics.
    [recovery] = records(job, "recovery")
    assert recovery["data"]["mode"] == "cold" and recovery["data"]["waits"] >= 1, recovery
    assert record.detected_at is not None and record.recovered_at is not None
    seconds = record.recovered_at - record.detected_at
    assert recovery["data"]["seconds"] == pytest.approx(seconds, abs=0.001)
    assert seconds >= 3.0  # the 3 s notice window: the failed instance stays until then
    assert recovery_samples(settings) == {"cold": (1.0, pytest.approx(seconds)), "warm": (0, 0)}
    # Audited: the job's trail names the playbook and ends succeeded.
    client = redis.Redis.from_url(redis_url)
    trail = [json.loads(line) for line in AuditLog(client, settings.key_prefix).records()]
    client.close()
    mine = [entry for entry in trail if entry.get("job_id") == job.id]
    kinds = [entry["kind"] for entry in mine]
    assert mine and "succeeded" in json.dumps(mine[-1]), kinds
    for kind in ("cordon", "drain", "recover"):
        assert any(kind in json.dumps(entry) for entry in mine), (kind, kinds)

    # The same job again: only the read-only check; no taint patch, no drain, no reopening.
    patches = len(fleet.fake.calls_of("patch", "nodes"))
    assert rerun(settings, body, redis_url) == ["check"]
    assert len(fleet.fake.calls_of("patch", "nodes")) == patches
    store = SpotStateStore(redis.Redis.from_url(redis_url), DEFAULT_GPU_STATE_PREFIX)
    assert store.get(UPSTREAM) == record
    store.close()
    assert fleet.draining() == []
    assert recovery_samples(settings)["cold"][0] == 1  # the re-run observed nothing
