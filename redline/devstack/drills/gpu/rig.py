"""One GPU node failure under load, recovered cold or warm, over real components in this process
and two of its own (Prometheus, Alertmanager): what `run_mode` measures for the drill.

An XID is set on one GPU of the fake dcgm-exporter (`fakes.dcgm`) -> Prometheus, running the
generated GPU rules, fires `GPUXidCritical` -> Alertmanager, on the generated config, posts it
to the receiver -> a worker runs `gpu_node_failure` (the taint on the fake Kubernetes API,
`fakes.kubeapi`; the drain through the gateway; the readiness gate) -> the replacement passes
the gate and admission reopens.

The node's model is served by one instance only, behind a Service front (`fakes.service`), so
what the node's loss costs clients shows: from the XID on, the failing GPU answers every request
with a 500 (fully interrupted); once the drain is done (TERMINATING) "Kubernetes" takes the
failed pod out of the Service and puts the replacement in:

- cold: a pod rebuilt only now, loading its model for `boot_seconds` (the design notes' 42 s pod
  rebuild, scaled by `time_scale` like the spot timings);
- warm: a replacement started (and loaded) beforehand.

Closed-loop clients through the gateway count every answer by outcome: the failed requests are
counted, not assumed. Every Redis key lives under the rig's own prefix (the receiver's jobs and
run metrics, the routing store, the GPU drain records), so it runs beside a stack on its Redis.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml
from pydantic import SecretStr

from redline.core.redisconn import open_redis
from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.drills.base import matching_alerts, poll_until
from redline.devstack.fakes.dcgm import DcgmServer, FakeDcgm
from redline.devstack.fakes.kubeapi import FakeKubernetes, serve_kubeapi
from redline.devstack.fakes.service import (
    RoundRobin,
    ServiceFront,
    ServiceFrontSettings,
    build_service_app,
)
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.processes import start_alertmanager, start_prometheus
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.prometheus import PrometheusClient, PrometheusError
from redline.platform.spot import NodeState, SpotStateStore
from redline.remediation.app import build_receiver_app
from redline.remediation.catalog import open_registry
from redline.remediation.jobs import TERMINAL, Job, JobStore
from redline.remediation.playbooks.gpu import RBAC_RULES
from redline.remediation.settings import RemediationSettings
from redline.remediation.worker import Worker
from redline.rules.alertmanager import build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.rules.families import gpu
from redline.rules.render import render_rule_file
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Receiver, Spec

MODEL = "redline-base"
PLAYBOOK = "gpu_node_failure"
UPSTREAM = "gpu-a"
MODES = (catalog.RECOVERY_COLD, catalog.RECOVERY_WARM)
TRANSIENT = (httpx.HTTPError, redis.RedisError, PrometheusError)
"""Errors of a poll that count as "not yet" (a part starting, a key not written yet)."""


class GpuDrillError(Exception):
    """A part of the GPU drill did not start, or a step did not happen in time."""


@dataclass(frozen=True)
class GpuDrillConfig:
    """What the drill runs on (the stack's Redis and spec: its local profile) and how fast."""

    workdir: Path
    redis_url: str
    spec: Spec
    time_scale: float = 0.1
    """The spot timings scaled: a 3 s notice window, a 1.3 s drain budget."""
    clients: int = 4
    tail_seconds: float = 1.0
    """Load kept after the job ends: a recovery that did not hold would show as failures here."""
    xid: int = 79
    """"GPU has fallen off the bus": drain now."""
    key_prefix: str = "redline:gpudrill"
    job_timeout_seconds: float = 60.0

    @property
    def boot_seconds(self) -> float:
        """A rebuilt pod's model load: the notes' 42 s, scaled."""
        return 42 * self.time_scale


@dataclass
class Load:
    """Closed-loop clients through the gateway, counting answers by outcome since `take`."""

    url: str
    clients: int
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
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
        for index in range(self.clients):
            thread = threading.Thread(target=self._run, name=f"gpu-load-{index}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def served(self) -> int:
        """Successful answers since the last take."""
        with self.lock:
            return self.outcomes["ok"]

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
class ModeOutcome:
    """What one mode's run measured (unix times; seconds)."""

    mode: str
    node: str
    recovery_seconds: float
    requests: int
    failed: int
    failures: dict[str, int]
    injected_at: float
    firing_at: float | None
    notified_at: float
    playbook_started_at: float | None
    recovered_at: float | None
    job: Job

    @property
    def detect_seconds(self) -> float:
        """XID -> the receiver accepted the job."""
        return self.notified_at - self.injected_at

    @property
    def failed_share(self) -> float:
        """Failed requests / requests."""
        return self.failed / self.requests if self.requests else 0.0


def build_remediation_settings(
    config: GpuDrillConfig, gateway_url: str, front_url: str, kubeapi_url: str, secrets_dir: Path
) -> RemediationSettings:
    """The receiver's and worker's settings: short timings, the rig's key prefixes, the
    playbook pointed at the rig's gateway, Service front and Kubernetes API."""
    prefix = config.key_prefix
    return RemediationSettings.model_validate({
        "redis_url": config.redis_url,
        "key_prefix": f"{prefix}:remediation",
        "claim_idle_seconds": 1.5, "lock_ttl_seconds": 1.5, "backoff_initial_seconds": 0.05,
        "backoff_max_seconds": 0.2, "lock_wait_seconds": 0.05, "poll_seconds": 0.1,
        "max_attempts": 4,
        "serving": {"gateway_url": gateway_url, "probe_model": MODEL,
                    "upstreams": {UPSTREAM: front_url}},
        "playbook_options": {PLAYBOOK: {
            "time_scale": config.time_scale, "poll_seconds": 0.05,
            "readiness_timeout_seconds": 30,
            "routing_key_prefix": f"{prefix}:routing", "state_key_prefix": f"{prefix}:gpu",
            "gateway_token_file": str(secrets_dir / "admin"),
            "node_upstreams": {f"gpu-node-{mode}": UPSTREAM for mode in MODES},
            "kubernetes_api_url": kubeapi_url,
            "kubernetes_token_file": str(secrets_dir / "sa"), "kubernetes_ca_file": None}},
    })  # fmt: skip


def build_fake_kubernetes(node: str, token: str) -> FakeKubernetes:
    """The GPU node, and the playbook's service account holding exactly its RBAC rules."""
    fake = FakeKubernetes()
    for rule in RBAC_RULES:
        for resource in rule["resources"]:
            fake.grant(token, *((verb, resource) for verb in rule["verbs"]))
    fake.add_node(node, taints=[{"key": "nvidia.com/gpu", "value": "present",
                                 "effect": "NoSchedule"}])  # fmt: skip
    return fake


def build_prometheus_config(rules: Path, alertmanager: str, dcgm: str) -> dict[str, Any]:
    """Prometheus scraping the dcgm-exporter every second with the GPU rules."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": "dcgm-exporter", "static_configs": [{"targets": [dcgm]}]}],
    }  # fmt: skip


def clean_keys(redis_url: str, prefix: str) -> None:
    """Forget an earlier run's keys (jobs, run metrics, drain records) under the rig's prefix."""
    client = open_redis(redis_url)
    try:
        for key in client.scan_iter(match=f"{prefix}:*", count=500):
            client.delete(key)
    finally:
        client.close()


@contextmanager
def monitoring(workdir: Path, spec: Spec, dcgm: DcgmServer) -> Iterator[str]:
    """Alertmanager on the generated config, Prometheus scraping `dcgm` with the GPU rules and
    sending to it; Prometheus' URL."""
    am_config = workdir / "alertmanager.yml"
    built = build_alertmanager_config(spec, build_rule_groups(spec))
    am_config.write_text(yaml.safe_dump(built, sort_keys=False))
    rules = workdir / "gpu.rules.yml"
    rules.write_text(render_rule_file(gpu.build_rules(spec), "gpu-node-failure drill"))
    with ExitStack() as stack:
        am = start_alertmanager(workdir / "am", am_config)
        stack.callback(am.stop)
        config = workdir / "prometheus.yml"
        target = am.url.removeprefix("http://")
        config.write_text(yaml.safe_dump(build_prometheus_config(rules, target, dcgm.target)))
        prometheus = start_prometheus(workdir / "prom", config)
        stack.callback(prometheus.stop)
        yield prometheus.url


@contextmanager
def workers(settings: RemediationSettings, count: int = 1) -> Iterator[None]:
    """`count` worker threads on the built-in playbooks, stopped and joined on exit."""
    stop = threading.Event()
    clients = [open_redis(settings.redis_url, decode_responses=True)
               for _ in range(count)]  # fmt: skip
    threads = [
        threading.Thread(
            target=Worker(settings, open_registry(settings), client, name=f"gpu-drill-{i}").run,
            args=(stop,), daemon=True)
        for i, client in enumerate(clients)
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        for client in clients:
            client.close()


def serve_receiver(settings: RemediationSettings, token: str) -> ServerThread:
    """The receiver on a free loopback port, taking `token` from Alertmanager."""
    app = build_receiver_app(settings, token=SecretStr(token))
    return serve_in_thread(app, log_config=None, access_log=False, ws="none")


def replace_at_terminating(
    redis_url: str, state_prefix: str, swap: Callable[[], None], done: threading.Event
) -> None:
    """Once the drain is done (TERMINATING), take the failed pod out and the replacement in."""
    store = SpotStateStore(open_redis(redis_url), state_prefix)
    try:
        while not done.is_set():
            if store.get(UPSTREAM).state is NodeState.TERMINATING:
                swap()
                return
            time.sleep(0.02)
    finally:
        store.close()


def _simulator(seed: int, load_seconds: float = 0.0) -> ServerThread:
    """One serving pod of the node's model."""
    settings = SimulatorSettings(region=UPSTREAM, seed=seed, load_seconds=load_seconds)
    return serve_in_thread(build_simulator_app(settings))


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    return poll_until(lambda: check() or None, timeout, interval, what, GpuDrillError,
                      retry_on=TRANSIENT)  # fmt: skip


def _step_time(job: Job, name: str | None = None) -> float | None:
    steps = [s for s in job.steps if name is None or s.get("name") == name]
    return float(steps[0]["at"]) if steps and "at" in steps[0] else None


@dataclass
class Rig:
    """One mode's running parts (each stopped by the `ExitStack` that started it)."""

    config: GpuDrillConfig
    mode: str
    stack: ExitStack
    dcgm: FakeDcgm
    failed_pod: ServerThread
    standby: ServerThread | None
    front: ServiceFront
    prometheus: PrometheusClient
    store: JobStore
    load: Load

    @property
    def node(self) -> str:
        """The Kubernetes node that fails."""
        return f"gpu-node-{self.mode}"

    def swap(self, say: Callable[[str], None]) -> None:
        """The failed pod leaves the Service's endpoints and the replacement (rebuilt now: cold,
        or the loaded standby: warm) takes its place in one step."""
        # The failed pod's process ends at teardown: stopping it here could refuse a request the
        # front had already routed to it, and the gate would take that for a replacement not
        # ready.
        replacement = self.standby
        if replacement is None:
            replacement = _simulator(seed=3, load_seconds=self.config.boot_seconds)
            self.stack.callback(replacement.stop)
        self.front.balancer = RoundRobin([replacement.url], 2.0)
        say(f"{self.mode}: {self.node}'s pod replaced in the Service")


def _write_secrets(directory: Path) -> dict[str, str]:
    """The gateway's admin token, the service account's and the webhook's, each in a file."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens = {name: secrets.token_urlsafe(24) for name in ("admin", "sa", "webhook")}
    for name, token in tokens.items():
        (directory / name).write_text(token + "\n")
        (directory / name).chmod(0o600)
    return tokens


def start_rig(config: GpuDrillConfig, mode: str, stack: ExitStack) -> Rig:
    """Every part of one mode, serving, under load; Prometheus scraping the dcgm-exporter."""
    node, workdir = f"gpu-node-{mode}", config.workdir / mode
    secrets_dir = workdir / "secrets"
    tokens = _write_secrets(secrets_dir)
    dcgm_fake = FakeDcgm.healthy([node], gpus_per_node=4)
    failed_pod = _simulator(seed=1)
    stack.callback(failed_pod.stop)
    standby = _simulator(seed=2) if mode == catalog.RECOVERY_WARM else None
    if standby is not None:
        stack.callback(standby.stop)
    front_app = build_service_app(ServiceFrontSettings(region=UPSTREAM, pods=[failed_pod.url]))
    front = serve_in_thread(front_app)
    stack.callback(front.stop)
    gateway = serve_in_thread(build_gateway_app(
        GatewaySettings(upstreams={UPSTREAM: front.url}, redis_url=config.redis_url,
                        routing_refresh_seconds=0.1, admin_token_file=secrets_dir / "admin",
                        routing_key_prefix=f"{config.key_prefix}:routing",
                        ledger_key_prefix=f"{config.key_prefix}:ledger", quotas=False),
        config.spec))  # fmt: skip
    stack.callback(gateway.stop)
    kubeapi = stack.enter_context(serve_kubeapi(build_fake_kubernetes(node, tokens["sa"])))
    dcgm = stack.enter_context(DcgmServer(dcgm_fake))
    settings = build_remediation_settings(config, gateway.url, front.url, kubeapi.url, secrets_dir)
    receiver = serve_receiver(settings, tokens["webhook"])
    stack.callback(receiver.stop)
    webhook = Receiver(url=f"{receiver.url}/alerts", bearer_token_file=str(secrets_dir / "webhook"))
    spec = config.spec.model_copy(update={"receiver": webhook})
    prometheus_url = stack.enter_context(monitoring(workdir, spec, dcgm))
    prometheus = PrometheusClient(prometheus_url, 5.0, retries=0, trust_env=False)
    stack.callback(prometheus.close)
    stack.enter_context(workers(settings))
    client = open_redis(config.redis_url, decode_responses=True)
    stack.callback(client.close)
    store = JobStore(client, settings.key_prefix, settings.retention_seconds)
    load = Load(gateway.url, config.clients)
    stack.callback(load.close)
    load.start()
    _wait("healthy traffic through the gateway", lambda: load.served() >= 20, 20)
    _wait("Prometheus scraping the dcgm-exporter",
          lambda: prometheus.instant(str(catalog.GPU_XID_LAST_RECORD)), 20)  # fmt: skip
    return Rig(config, mode, stack, dcgm_fake, failed_pod, standby, front_app, prometheus, store,
               load)  # fmt: skip


def _finished(rig: Rig, firing: list[float]) -> Job | None:
    """The node's job once it ended (with its steps); notes when the alert first fired."""
    if not firing:
        alerts = matching_alerts(
            rig.prometheus.alerts(), Alert.GPU_XID_CRITICAL, {"node": rig.node}
        )
        if any(alert["state"] == "firing" for alert in alerts):
            firing.append(time.time())
    jobs = rig.store.list_jobs(playbook=PLAYBOOK)
    mine = [j for j in jobs if j.alert.get("labels", {}).get("node") == rig.node]
    mine = [j for j in mine if j.status in TERMINAL]
    return rig.store.get(mine[0].id) if mine else None


def run_mode(config: GpuDrillConfig, mode: str, say: Callable[[str], None]) -> ModeOutcome:
    """One GPU node failure under load, recovered `mode` (cold or warm); what it measured."""
    firing: list[float] = []
    with ExitStack() as stack:
        rig = start_rig(config, mode, stack)
        before = rig.load.take()
        if set(before) != {"ok"}:
            raise GpuDrillError(f"{mode}: requests failed before the fault: {dict(before)}")
        done = threading.Event()
        replacer = threading.Thread(
            target=replace_at_terminating,
            args=(config.redis_url, f"{config.key_prefix}:gpu", lambda: rig.swap(say), done),
        )
        replacer.start()
        stack.callback(replacer.join, 15)
        stack.callback(done.set)

        # The fault: the GPU falls off the bus; its pod fails every request from now on.
        injected = time.time()
        httpx.post(f"{rig.failed_pod.url}/admin/faults", json={"error_rate": 1.0},
                   trust_env=False).raise_for_status()  # fmt: skip
        rig.dcgm.set_xid(rig.node, 2, config.xid)
        say(f"{mode}: XID {config.xid} on {rig.node} GPU 2")
        job: Job = _wait(
            f"the {mode} job to end",
            lambda: _finished(rig, firing),
            config.job_timeout_seconds,
            0.1,
        )
        time.sleep(config.tail_seconds)
        outcomes = rig.load.take()
        done.set()
    if job.status != "succeeded":
        raise GpuDrillError(f"{mode}: the {PLAYBOOK} job {job.status}: {job.error}")
    recoveries = [s for s in job.steps if s.get("name") == "recovery"]
    if len(recoveries) != 1 or recoveries[0]["data"]["mode"] != mode:
        raise GpuDrillError(f"{mode}: the job recorded {recoveries} as its recovery")
    failures = {k: v for k, v in sorted(outcomes.items()) if k != "ok"}
    return ModeOutcome(
        mode=mode,
        node=rig.node,
        recovery_seconds=float(recoveries[0]["data"]["seconds"]),
        requests=sum(outcomes.values()),
        failed=sum(failures.values()),
        failures=failures,
        injected_at=injected,
        firing_at=firing[0] if firing else None,
        notified_at=datetime.fromisoformat(job.created_at).timestamp(),
        playbook_started_at=_step_time(job),
        recovered_at=_step_time(job, "recovery"),
        job=job,
    )


def recovery_histogram(config: GpuDrillConfig) -> dict[str, tuple[float, float]]:
    """mode -> (count, sum) of `llm_node_failure_recovery_seconds` on the receiver's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    recovery = catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS
    settings = RemediationSettings.model_validate(
        {"redis_url": config.redis_url, "key_prefix": f"{config.key_prefix}:remediation"}
    )
    server = serve_receiver(settings, secrets.token_urlsafe(24))
    try:
        text = httpx.get(f"{server.url}/metrics", trust_env=False, timeout=10).text
    finally:
        server.stop()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (recovery.count, recovery.sum):
                mode = sample.labels[catalog.LABEL_RECOVERY_MODE]
                found.setdefault(mode, {})[sample.name] = sample.value
    return {mode: (v[recovery.count], v[recovery.sum]) for mode, v in found.items()}


__all__ = [
    "GpuDrillConfig",
    "GpuDrillError",
    "Load",
    "MODES",
    "ModeOutcome",
    "clean_keys",
    "recovery_histogram",
    "run_mode",
]
