"""GPU node failure, cold against warm recovery (#30), end to end over real components: an XID
injected into the fake dcgm-exporter -> a real Prometheus running the generated GPU rules fires
`GPUXidCritical` -> a real Alertmanager on the generated config -> the real receiver -> a real
worker runs `gpu_node_failure` (taint on the fake Kubernetes API, drain through the real gateway,
readiness gate) -> the replacement passes the gate, admission reopens.

The node's model is served by one instance only, behind a Service front (`fakes.service`), so
what the node's loss costs clients shows: when the XID comes, the failing GPU answers every
request with a 500 (fully interrupted); once the drain is done (TERMINATING) "Kubernetes" takes
the failed pod out of the Service and puts the replacement in:

- cold: a pod rebuilt only now, loading its model for `BOOT_SECONDS` (the design notes' 42 s pod
  rebuild, scaled like the spot timings by `SCALE`);
- warm: a replacement started (and loaded) beforehand.

Both run under the same client load through the gateway; each reports the recovery seconds from
the receiver's `llm_node_failure_recovery_seconds{mode}` and the client-visible failed requests
(counted, not assumed), as a Markdown table.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.dcgm import DcgmServer, FakeDcgm
from redline.devstack.fakes.service import RoundRobin, ServiceFrontSettings, build_service_app
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.processes import start_alertmanager, start_prometheus
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.spot import NodeState, SpotStateStore
from redline.remediation.jobs import TERMINAL, Job
from redline.remediation.playbooks.gpu import DEFAULT_GPU_STATE_PREFIX, RBAC_RULES
from redline.remediation.settings import RemediationSettings
from redline.rules.alertmanager import build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.rules.families import gpu
from redline.rules.render import render_rule_file
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Receiver, Spec
from tests.support.kubeapi import FakeKubernetes, serve_kubeapi
from tests.support.playbook import playbook_settings, real_workers, records
from tests.support.remediation import TOKEN, receiver, store_for, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE = "redline-base"
SCALE = 0.1  # the spot timings scaled: a 3 s notice window, a 1.3 s drain budget
BOOT_SECONDS = 42 * SCALE  # a rebuilt pod's model load
XID = 79  # "GPU has fallen off the bus": drain now
SA_TOKEN = "remediation-sa-t0ken"
ADMIN_TOKEN = "gpu-admin-t0ken"
CLIENTS = 4
TAIL_SECONDS = 1.0
"""Load kept after the job ends: a recovery that did not hold would show as failures here."""


@dataclass
class Load:
    """Closed-loop clients through the gateway, counting answers by outcome since `mark`."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        body = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        with httpx.Client(timeout=10, trust_env=False) as client:
            while not self.stop.is_set():
                try:
                    answer = client.post(f"{self.url}/v1/chat/completions", json=body)
                    outcome = "ok" if answer.is_success else f"HTTP {answer.status_code}"
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                with self.lock:
                    self.outcomes[outcome] += 1
                time.sleep(0.02)

    def start(self) -> None:
        """Start the clients."""
        for index in range(CLIENTS):
            thread = threading.Thread(target=self._run, name=f"load-{index}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def take(self) -> Counter[str]:
        """The outcomes since the last take."""
        with self.lock:
            taken, self.outcomes = self.outcomes, Counter()
        return taken

    def close(self) -> None:
        """Stop and join the clients."""
        self.stop.set()
        for thread in self.threads:
            thread.join(15)


@dataclass
class Outcome:
    """What one mode's run measured."""

    mode: str
    recovery_seconds: float
    requests: int
    failed: int
    failures: dict[str, int]
    detect_seconds: float
    job: Job


def simulator(seed: int, load_seconds: float = 0.0) -> ServerThread:
    """One serving pod of the node's model."""
    settings = SimulatorSettings(region="gpu-a", seed=seed, load_seconds=load_seconds)
    return serve_in_thread(build_simulator_app(settings))


def gpu_spec(receiver_url: str, token_file: Path) -> Spec:
    """The local profile (1 s scrape and evaluation, 1 s group_wait), alerts to `receiver_url`."""
    spec = apply_profile(load_spec().spec, "local")
    return spec.model_copy(
        update={"receiver": Receiver(url=f"{receiver_url}/alerts",
                                     bearer_token_file=str(token_file))}
    )  # fmt: skip


@contextmanager
def monitoring(tmp: Path, spec: Spec, dcgm: DcgmServer) -> Iterator[str]:
    """Alertmanager on the generated config, Prometheus scraping `dcgm` with the GPU rules and
    sending to it; Prometheus' URL."""
    am_config = tmp / "alertmanager.yml"
    built = build_alertmanager_config(spec, build_rule_groups(spec))
    am_config.write_text(yaml.safe_dump(built, sort_keys=False))
    rules = tmp / "gpu.rules.yml"
    rules.write_text(render_rule_file(gpu.build_rules(spec), "test"))
    with ExitStack() as stack:
        am = start_alertmanager(tmp / "am", am_config)
        stack.callback(am.stop)
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [am.url.removeprefix("http://")]}]}]},
            "scrape_configs": [
                {"job_name": "dcgm-exporter", "static_configs": [{"targets": [dcgm.target]}]}],
        }))  # fmt: skip
        prometheus = start_prometheus(tmp / "prom", config)
        stack.callback(prometheus.stop)
        yield prometheus.url


def replace_at_terminating(
    redis_url: str, upstream: str, swap: Callable[[], None], done: threading.Event
) -> None:
    """Once the drain is done (TERMINATING), take the failed pod out and the replacement in."""
    store = SpotStateStore(redis.Redis.from_url(redis_url), DEFAULT_GPU_STATE_PREFIX)
    try:
        while not done.is_set():
            if store.get(upstream).state is NodeState.TERMINATING:
                swap()
                return
            time.sleep(0.02)
    finally:
        store.close()


def run_mode(mode: str, redis_url: str, tmp: Path) -> Outcome:  # noqa: PLR0915 - one story
    """One GPU node failure under load, recovered cold or warm; what it measured."""
    node, upstream = f"gpu-node-{mode}", "gpu-a"
    fake = FakeKubernetes()
    for rule in RBAC_RULES:
        for resource in rule["resources"]:
            fake.grant(SA_TOKEN, *((verb, resource) for verb in rule["verbs"]))
    fake.add_node(node, taints=[{"key": "nvidia.com/gpu", "value": "present",
                                 "effect": "NoSchedule"}])  # fmt: skip
    (tmp / "admin").write_text(ADMIN_TOKEN + "\n")
    (tmp / "sa").write_text(SA_TOKEN + "\n")
    (tmp / "webhook").write_text(TOKEN + "\n")
    dcgm_fake = FakeDcgm.healthy([node], gpus_per_node=4)
    with ExitStack() as stack:
        failed_pod = simulator(seed=1)
        stack.callback(failed_pod.stop)
        standby = simulator(seed=2) if mode == catalog.RECOVERY_WARM else None
        if standby is not None:
            stack.callback(standby.stop)
        front_app = build_service_app(ServiceFrontSettings(region="gpu-a", pods=[failed_pod.url]))
        front = serve_in_thread(front_app)
        stack.callback(front.stop)
        gateway = serve_in_thread(build_gateway_app(
            GatewaySettings(upstreams={upstream: front.url}, redis_url=redis_url,
                            routing_refresh_seconds=0.1, admin_token_file=tmp / "admin"),
            load_spec().spec))  # fmt: skip
        stack.callback(gateway.stop)
        kubeapi = stack.enter_context(serve_kubeapi(fake))
        dcgm = stack.enter_context(DcgmServer(dcgm_fake))
        settings: RemediationSettings = playbook_settings(
            redis_url,
            serving={"gateway_url": gateway.url, "probe_model": BASE,
                     "upstreams": {upstream: front.url}},
            playbook_options={"gpu_node_failure": {
                "time_scale": SCALE, "poll_seconds": 0.05, "readiness_timeout_seconds": 30,
                "gateway_token_file": str(tmp / "admin"), "node_upstreams": {node: upstream},
                "kubernetes_api_url": kubeapi.url, "kubernetes_token_file": str(tmp / "sa"),
                "kubernetes_ca_file": None}},
        )  # fmt: skip
        the_receiver = stack.enter_context(receiver(settings))
        spec = gpu_spec(the_receiver.url, tmp / "webhook")
        prometheus_url = stack.enter_context(monitoring(tmp, spec, dcgm))
        stack.enter_context(real_workers(settings))
        load = Load(gateway.url)
        stack.callback(load.close)
        load.start()

        def healthy_traffic() -> bool:
            return load.outcomes["ok"] >= 20

        wait_for(healthy_traffic, timeout=20, what="healthy traffic through the gateway")
        with httpx.Client(trust_env=False, timeout=5) as client:
            wait_for(
                lambda: client.get(f"{prometheus_url}/api/v1/query",
                                   params={"query": str(catalog.GPU_XID_LAST_RECORD)}
                                   ).json()["data"]["result"],
                timeout=20, what="Prometheus scraping the dcgm-exporter",
            )  # fmt: skip
        before = load.take()
        assert set(before) == {"ok"}, f"failures before the fault: {before}"

        def swap() -> None:
            # The failed pod leaves the Service's endpoints and the replacement (rebuilt now:
            # cold, or the loaded standby: warm) takes its place in one step. The failed pod's
            # process ends at teardown: stopping it here could refuse a request the front had
            # already routed to it, and the gate would take that for a replacement not ready.
            if standby is not None:
                replacement = standby
            else:
                replacement = simulator(seed=3, load_seconds=BOOT_SECONDS)
                stack.callback(replacement.stop)
            front_app.balancer = RoundRobin([replacement.url], 2.0)

        done = threading.Event()
        replacer = threading.Thread(target=replace_at_terminating,
                                    args=(redis_url, upstream, swap, done))  # fmt: skip
        replacer.start()
        stack.callback(replacer.join, 15)
        stack.callback(done.set)

        # The fault: the GPU falls off the bus; its pod fails every request from now on.
        injected = time.time()
        httpx.post(f"{failed_pod.url}/admin/faults", json={"error_rate": 1.0},
                   trust_env=False).raise_for_status()  # fmt: skip
        dcgm_fake.set_xid(node, 2, XID)

        store, store_client = store_for(settings)
        try:

            def finished() -> Job | None:
                jobs = store.list_jobs(playbook="gpu_node_failure")
                mine = [
                    j for j in jobs if j.alert.get("labels", {}).get("node") == node
                    and j.status in TERMINAL
                ]  # fmt: skip
                return store.get(mine[0].id) if mine else None  # with its steps

            job: Job = wait_for(finished, timeout=60, interval=0.1, what=f"{mode} job to end")
        finally:
            store_client.close()
        time.sleep(TAIL_SECONDS)
        outcomes = load.take()
        done.set()
    assert job.status == "succeeded", job.error
    [recovery] = records(job, "recovery")
    assert recovery["data"]["mode"] == mode, recovery
    failures = {k: v for k, v in outcomes.items() if k != "ok"}
    return Outcome(
        mode=mode,
        recovery_seconds=float(recovery["data"]["seconds"]),
        requests=sum(outcomes.values()),
        failed=sum(failures.values()),
        failures=failures,
        detect_seconds=datetime.fromisoformat(job.created_at).timestamp() - injected,
        job=job,
    )


def recovery_histogram(settings: RemediationSettings) -> dict[str, tuple[float, float]]:
    """mode -> (count, sum) of `llm_node_failure_recovery_seconds` on the receiver's /metrics."""
    recovery = catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS
    with receiver(settings) as server:
        text = httpx.get(f"{server.url}/metrics", trust_env=False).text
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (recovery.count, recovery.sum):
                mode = sample.labels[catalog.LABEL_RECOVERY_MODE]
                found.setdefault(mode, {})[sample.name] = sample.value
    return {mode: (v[recovery.count], v[recovery.sum]) for mode, v in found.items()}


def render_table(outcomes: list[Outcome]) -> str:
    """The cold/warm comparison as Markdown."""
    lines = [
        "| mode | XID -> job (s) | recovery (s) | requests | failed | failed share | failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        share = o.failed / o.requests if o.requests else 0.0
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(o.failures.items())) or "-"
        lines.append(
            f"| {o.mode} | {o.detect_seconds:.2f} | {o.recovery_seconds:.2f} | {o.requests} | "
            f"{o.failed} | {share:.1%} | {kinds} |"
        )
    return "\n".join(lines)


def test_warm_recovery_beats_a_pod_rebuild_and_fails_fewer_requests(
    redis_url: str, tmp_path: Path
) -> None:
    outcomes: list[Outcome] = []
    for mode in (catalog.RECOVERY_COLD, catalog.RECOVERY_WARM):
        (tmp_path / mode).mkdir()
        outcomes.append(run_mode(mode, redis_url, tmp_path / mode))
    print(
        f"\nGPU node failure, {SCALE:g}x time (spot timings; the notes' 42 s pod rebuild as "
        f"{BOOT_SECONDS:g} s), {CLIENTS} clients through the gateway:\n" + render_table(outcomes)
    )
    cold, warm = outcomes
    # Both measured against the same histogram the receiver serves: one observation each.
    histogram = recovery_histogram(playbook_settings(redis_url))
    for outcome in outcomes:
        count, total = histogram[outcome.mode]
        assert count == 1 and total == pytest.approx(outcome.recovery_seconds, abs=1e-3)
    # The rebuilt pod's model load is on the cold path only.
    assert cold.recovery_seconds >= BOOT_SECONDS
    assert warm.recovery_seconds < cold.recovery_seconds - BOOT_SECONDS / 2
    # The failing GPU fails requests in both until the drain; the rebuild keeps failing them.
    for outcome in outcomes:
        assert outcome.requests > 0 and outcome.failed > 0, outcome
    assert warm.failed < cold.failed, render_table(outcomes)
