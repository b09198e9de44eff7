"""Spot preemption drills: a fleet of real processes, a real notice, real clients.

The fleet (`SpotFleet`): one upstream simulator process per node (`spot-a` on AWS, `spot-b` on
GCP, the on-demand pool `ondemand`), a gateway process balancing round robin over the spot nodes
with `ondemand` as the spill pool, one `redline spot-agent` process per spot node, a local
metadata server per spot node (AWS IMDSv2 or GCP, in this process), and a Prometheus scraping
the gateway and the agents and evaluating the generated spot alerts. Redis is given (the stack's,
or the tests'); every key lives under the fleet's own prefix.

Time is compressed by `time_scale` (default 0.05: the AWS 120 s window becomes 6 s, GCP's 30 s
1.5 s; detection delay, ingress removal, safety margin, the p95 target and the readiness timeout
scale the same way), and generation runs at `tokens_per_second` (50), so a drill takes seconds
and the triage sees the same ratios it would in production.

A preemption is what a cloud does: the notice appears in the node's metadata, the node's process
is SIGKILLed at the notice's termination time, and a replacement process starts on the node's
address after `boot_seconds` (its model loads for another `boot_seconds`), healthy or broken.

Clients (`SpotLoad`) stream (and, for a share, wait for whole) completions of unique prompts,
follow the retry contract (a recoverable `SPOT_PREEMPTION` event -> resend with
`x-redline-resume`; `x-redline-resumed: false` -> drop the prefix) and check every final answer
against the one an uninterrupted request gets. A client-visible non-recoverable failure is any
other outcome: an HTTP error, a cut stream, a non-recoverable event, a wrong answer.

Drills (each reports non-recoverable failures (target 0), wasted decode tokens, notice ->
DRAINING and replacement latency):

- `spot-one`: one node preempted under load;
- `spot-two`: both spot nodes at once, capacity below demand: traffic spills to `ondemand`;
- `spot-long-streams`: notice during long streams on the GCP node (a 1.5 s window): triage
  continues what fits and aborts the rest, whose retries resume after the served prefix;
- `spot-never-ready`: the replacement never passes the readiness gate (inference fails): the
  node stays TERMINATING with admission closed, `SpotReplacementSlow` fires; then a healthy
  replacement recovers it and the alert resolves.
"""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import redis
import yaml

from redline.devstack.fakes.metadata_server import MetadataSettings, build_metadata_app
from redline.devstack.fakes.simulator import ServerThread, build_answer, serve_in_thread
from redline.devstack.processes import (
    Service,
    ServiceError,
    free_port,
    start_prometheus,
    wait_until,
)
from redline.platform.routing import RoutingStore
from redline.platform.spot import (
    RESUME_HEADER,
    RESUMED_HEADER,
    parse_spot_error,
    scale_spot,
)
from redline.rules.build import build_spot_alerts
from redline.rules.render import render_rule_file
from redline.slo.spec import Spec

if TYPE_CHECKING:
    from redline.devstack.drills import DrillContext, DrillResult

MODEL = "redline-base"
HOST = "127.0.0.1"
SPOT_DRILL_ORDER = ("spot-one", "spot-two", "spot-long-streams", "spot-never-ready")
Say = Callable[[str], None]


class SpotDrillError(Exception):
    """The fleet could not start or a drill's step did not happen in time."""


@dataclass(frozen=True)
class FleetConfig:
    """What the fleet runs on and how fast its time goes."""

    workdir: Path
    redis_url: str
    spec: Spec
    time_scale: float = 0.05
    nodes: tuple[tuple[str, str], ...] = (("spot-a", "aws"), ("spot-b", "gcp"))
    ondemand: str = "ondemand"
    tokens_per_second: float = 50.0
    boot_seconds: float = 0.3
    key_prefix: str = "redline:spotdrill"
    scrape_seconds: float = 0.5


@dataclass(frozen=True)
class Preemption:
    """One preemption the fleet carries out: the notice and when the node goes."""

    node: str
    provider: str
    issued_at: float
    terminate_at: float


def _redline(*args: str) -> list[str]:
    return [sys.executable, "-m", "redline.cli", *args]


class SpotFleet:
    """Simulators, gateway, agents, metadata servers and Prometheus for the spot drills."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.spot = scale_spot(config.spec.spot, config.time_scale)
        self.workdir = config.workdir
        self.nodes = dict(config.nodes)
        self.regions = [*self.nodes, config.ondemand]
        self.ports = {name: free_port() for name in [*self.regions, "gateway"]}
        self.agent_ports = {node: free_port() for node in self.nodes}
        self.simulators: dict[str, Service] = {}
        self.agents: dict[str, Service] = {}
        self.metadata: dict[str, ServerThread] = {}
        self.gateway: Service | None = None
        self.prometheus: Service | None = None
        self.http = httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0), trust_env=False)
        self.routing = RoutingStore.from_url(config.redis_url, f"{config.key_prefix}:routing")
        self.timers: list[threading.Timer] = []
        self.replaced: dict[str, threading.Event] = {}
        self._seed = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    def url(self, name: str) -> str:
        """Base URL of a simulator (node) or of the gateway."""
        return f"http://{HOST}:{self.ports[name]}"

    @property
    def gateway_url(self) -> str:
        """The gateway."""
        return self.url("gateway")

    def agent_url(self, node: str) -> str:
        """A node's spot agent."""
        return f"http://{HOST}:{self.agent_ports[node]}"

    def _write(self, name: str, data: Mapping[str, Any]) -> Path:
        path = self.workdir / "config" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
        return path

    def _spawn(self, name: str, argv: list[str], ready: str) -> Service:
        return self._ready(self._spawn_nowait(name, argv), ready)

    def _simulator_argv(self, node: str, broken: bool = False, boot: float = 0.0) -> list[str]:
        self._seed += 1
        faults: dict[str, Any] = {"tokens_per_second": self.config.tokens_per_second}
        if broken:
            faults["error_rate"] = 1.0  # up and listing its model, but every inference fails
        config = self._write(
            f"simulator-{node}-{self._seed}",
            {
                "host": HOST,
                "port": self.ports[node],
                "region": node,
                "base_model": MODEL,
                "seed": self._seed,
                "faults": faults,
                "load_seconds": boot,
                "log_level": "warning",
            },
        )
        return _redline("simulate", "upstream", "--config", str(config))

    def start_simulator(self, node: str, broken: bool = False, boot: float = 0.0) -> Service:
        """Start (or replace) a node's simulator process."""
        argv = self._simulator_argv(node, broken, boot)
        service = self._spawn(f"simulator-{node}", argv, f"{self.url(node)}/healthz")
        self.simulators[node] = service
        return service

    def start(self, say: Say = lambda _: None) -> SpotFleet:
        """Start every part; return once each answers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        spec_file = self._write("spec", self.config.spec.model_dump(mode="json"))
        self._clean_keys()
        argvs = {node: self._simulator_argv(node) for node in self.regions}
        processes = {
            node: self._spawn_nowait(f"simulator-{node}", argv) for node, argv in argvs.items()
        }
        gateway_config = self._write(
            "gateway",
            {
                "host": HOST,
                "port": self.ports["gateway"],
                "redis_url": self.config.redis_url,
                "upstreams": {r: self.url(r) for r in self.regions},
                "balance": "round_robin",
                "spill_regions": [self.config.ondemand],
                "routing_key_prefix": f"{self.config.key_prefix}:routing",
                "ledger_key_prefix": f"{self.config.key_prefix}:ledger",
                "routing_refresh_seconds": 0.25,
                "first_byte_budget_seconds": 5.0,
                "first_byte_budget_streaming_only": True,
                "log_level": "warning",
            },
        )
        gateway_argv = _redline("gateway", "--config", str(gateway_config))
        gateway_process = self._spawn_nowait("gateway", gateway_argv)
        for node, provider in self.nodes.items():
            self.metadata[node] = serve_in_thread(
                build_metadata_app(MetadataSettings(provider=provider, instance_id=f"i-{node}"))
            )
        agent_processes = {}
        for node, provider in self.nodes.items():
            config = self._write(
                f"agent-{node}",
                {
                    "host": HOST,
                    "port": self.agent_ports[node],
                    "redis_url": self.config.redis_url,
                    "spec": str(spec_file),
                    "node": node,
                    "provider": provider,
                    "metadata_url": self.metadata[node].url,
                    "upstream_url": self.url(node),
                    "gateway_urls": [self.gateway_url],
                    "model": MODEL,
                    "routing_key_prefix": f"{self.config.key_prefix}:routing",
                    "state_key_prefix": f"{self.config.key_prefix}:state",
                    "poll_interval_seconds": max(0.05, self.spot.detection_delay_seconds),
                    "gcp_wait_seconds": 5.0,
                    "time_scale": self.config.time_scale,
                    "flow_poll_seconds": 0.05,
                    "log_level": "warning",
                },
            )
            argv = _redline("spot-agent", "run", "--config", str(config))
            agent_processes[node] = self._spawn_nowait(f"agent-{node}", argv)
        for node, service in processes.items():
            self.simulators[node] = self._ready(service, f"{self.url(node)}/healthz")
        self.gateway = self._ready(gateway_process, f"{self.gateway_url}/healthz")
        for node, service in agent_processes.items():
            self.agents[node] = self._ready(service, f"{self.agent_url(node)}/healthz")
        self.prometheus = self._start_prometheus()
        say(f"fleet up: {', '.join(self.regions)} behind {self.gateway_url}")
        return self

    def _spawn_nowait(self, name: str, argv: list[str]) -> Service:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return Service(name, process, HOST, 0, self.workdir, log_path)

    def _ready(self, service: Service, url: str) -> Service:
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        service = Service(service.name, service.process, HOST, port, self.workdir, service.log_path)

        def up() -> bool:
            return self.http.get(url, timeout=1.0).status_code == 200

        wait_until(service, up, 60.0)
        time.sleep(0.05)
        if not service.alive():  # another process answered on its port
            raise ServiceError(f"{service.name} exited: {service.log_tail(5)}")
        return service

    def _start_prometheus(self) -> Service:
        scaled = self.config.spec.model_copy(
            update={
                "spot": self.spot,
                "timing": self.config.spec.timing.model_copy(
                    update={"evaluation_interval_seconds": self.config.scrape_seconds}
                ),
            }
        )
        rules = self.workdir / "prometheus" / "spot.rules.yml"
        rules.parent.mkdir(parents=True, exist_ok=True)
        rules.write_text(render_rule_file([build_spot_alerts(scaled)], "spot drills (scaled)"))
        interval = f"{round(self.config.scrape_seconds * 1000)}ms"
        targets = [f"{HOST}:{self.ports['gateway']}"]
        targets += [f"{HOST}:{port}" for port in self.agent_ports.values()]
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "spot-fleet",
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        path = self.workdir / "prometheus" / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        return start_prometheus(self.workdir / "prometheus", path)

    def _clean_keys(self) -> None:
        client = self.routing.client
        for key in client.scan_iter(match=f"{self.config.key_prefix}:*", count=500):
            client.delete(key)

    def stop(self) -> None:
        """Stop every part (timers first, so no replacement starts after)."""
        for timer in self.timers:
            timer.cancel()
        for service in [*self.agents.values(), *self.simulators.values()]:
            service.stop(5)
        if self.gateway is not None:
            self.gateway.stop(5)
        if self.prometheus is not None:
            self.prometheus.stop(5)
        for server in self.metadata.values():
            server.stop(5)
        self.http.close()
        self.routing.close()

    def __enter__(self) -> SpotFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- faults ------------------------------------------------------------------------------

    def preempt(self, node: str, broken_replacement: bool = False) -> Preemption:
        """Issue the node's cloud notice; kill it at the termination time; start a replacement
        (broken: inference fails, so it never passes the readiness gate)."""
        provider = self.nodes[node]
        window = self.spot.notice_for(provider)
        answer = self.http.post(
            f"{self.metadata[node].url}/admin/notice", json={"in_seconds": window}
        )
        answer.raise_for_status()
        issued = answer.json()
        preemption = Preemption(node, provider, issued["issued_at"], issued["terminate_at"])

        replaced = threading.Event()
        self.replaced[node] = replaced

        def terminate() -> None:
            self.simulators[node].kill()
            self.http.post(f"{self.metadata[node].url}/admin/reset")  # a new instance's metadata
            timer = threading.Timer(self.config.boot_seconds, replace)
            self.timers.append(timer)
            timer.start()

        def replace() -> None:
            try:
                self.start_simulator(node, broken_replacement, self.config.boot_seconds)
            except ServiceError:
                pass  # the drill sees the node never recover and says so
            finally:
                replaced.set()

        timer = threading.Timer(max(0.0, preemption.terminate_at - time.time()), terminate)
        self.timers.append(timer)
        timer.start()
        return preemption

    def replace(self, node: str) -> None:
        """Replace the node's (broken) replacement with a healthy one."""
        done = self.replaced.get(node)
        if done is not None and not done.wait(60):
            raise SpotDrillError(f"{node}: the first replacement never started")
        self.simulators[node].kill()
        self.start_simulator(node, False, self.config.boot_seconds)

    # ---- observations ------------------------------------------------------------------------

    def agent_state(self, node: str) -> dict[str, Any]:
        """The agent's `/state`."""
        response = self.http.get(f"{self.agent_url(node)}/state")
        response.raise_for_status()
        state: dict[str, Any] = response.json()
        return state

    def node_state(self, node: str) -> str:
        """The node's state name."""
        return str(self.agent_state(node)["state"])

    def drained_since(self, node: str, preemption: Preemption) -> bool:
        """The node went DRAINING for this preemption (not an earlier one)."""
        record = self.agent_state(node)["record"]
        return float(record.get("draining_at", 0)) >= preemption.issued_at - 0.5

    def recovered_since(self, node: str, preemption: Preemption) -> bool:
        """The node RECOVERED after this preemption."""
        state = self.agent_state(node)
        record = state["record"]
        return (
            state["state"] == "recovered"
            and float(record.get("recovered_at", 0))
            >= float(record.get("draining_at", 0))
            >= preemption.issued_at - 0.5
        )

    def gateway_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Samples of one family of the gateway's /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = self.http.get(f"{self.gateway_url}/metrics").text
        out = []
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    out.append((dict(sample.labels), float(sample.value)))
        return out

    def gateway_total(self, name: str, **labels: str) -> float:
        """Sum of a gateway family's samples whose labels include `labels`."""
        return sum(v for got, v in self.gateway_samples(name) if labels.items() <= got.items())

    def alerts(self, name: str, **labels: str) -> list[dict[str, Any]]:
        """Prometheus's active alerts called `name` with these labels."""
        assert self.prometheus is not None
        response = self.http.get(f"{self.prometheus.url}/api/v1/alerts")
        response.raise_for_status()
        wanted = {"alertname": name, **labels}
        return [
            a
            for a in response.json()["data"]["alerts"]
            if all(a["labels"].get(k) == v for k, v in wanted.items())
        ]

    def admission_open(self, node: str) -> bool:
        """Whether the routing store admits requests to the node."""
        return self.routing.get_admission(node).open

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        """Poll `check` every 20 ms; the time it first held (SpotDrillError on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return time.time()
            except (httpx.HTTPError, redis.RedisError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise SpotDrillError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.02)

    def _serving(self, node: str) -> bool:
        return self.node_state(node) in ("ready", "recovered") and self.admission_open(node)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Every spot node READY or RECOVERED, admission open, nothing draining."""
        for node in self.nodes:
            self.wait_for(f"{node} to serve", functools.partial(self._serving, node), timeout)
        self.wait_for(
            "the gateway to drain nothing",
            lambda: not self.http.get(f"{self.gateway_url}/healthz").json()["draining"],
            timeout,
        )


# ---- clients --------------------------------------------------------------------------------


@dataclass
class RequestOutcome:
    """What one client request (all its attempts) came to."""

    ok: bool
    failure: str = ""
    attempts: int = 0
    interruptions: int = 0
    resumed: int = 0
    regenerated: int = 0
    served_by: list[tuple[float, str]] = field(default_factory=list)


def expected_answer(prompt: str, max_tokens: int) -> str:
    """What an uninterrupted request for `prompt` answers."""
    return " ".join(build_answer(prompt, MODEL, max_tokens, False)[0])


def run_request(
    client: httpx.Client,
    prompt: str,
    max_tokens: int,
    stream: bool,
    max_attempts: int = 6,
    on_served: Callable[[str], None] | None = None,
) -> RequestOutcome:
    """One request under the retry contract, checked against the uninterrupted answer."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    request_id = uuid.uuid4().hex
    headers = {"x-request-id": request_id}
    outcome = RequestOutcome(ok=False)
    text = ""
    while outcome.attempts < max_attempts:
        outcome.attempts += 1
        try:
            step = _attempt(client, body, headers, stream, on_served)
        except httpx.HTTPError as exc:
            outcome.failure = f"{type(exc).__name__}: {exc}"  # a cut stream, a refused connect
            return outcome
        status, served, resumed, content, error, done = step
        outcome.served_by.append((time.time(), served))
        if status != 200:
            outcome.failure = f"HTTP {status}: {content[:200]}"
            return outcome
        if resumed == "true":
            outcome.resumed += 1
        elif resumed == "false":
            outcome.regenerated += 1
            text = ""  # regenerated from scratch: the prefix held so far is void
        text += content
        if error is not None:
            outcome.interruptions += 1
            info = parse_spot_error(error)
            if info is None or not info.recoverable or info.resume_header is None:
                outcome.failure = f"non-recoverable error event: {json.dumps(error)[:300]}"
                return outcome
            headers = {"x-request-id": request_id, RESUME_HEADER: info.request_id}
            time.sleep(info.retry_after_ms / 1000)
            continue
        if not done:
            outcome.failure = "stream ended without [DONE]"
            return outcome
        expected = expected_answer(prompt, max_tokens)
        if text != expected:
            outcome.failure = f"wrong answer: {len(text.split())} words, expected {max_tokens}"
            return outcome
        outcome.ok = True
        return outcome
    outcome.failure = f"gave up after {max_attempts} attempts"
    return outcome


def _attempt(
    client: httpx.Client,
    body: dict[str, Any],
    headers: dict[str, str],
    stream: bool,
    on_served: Callable[[str], None] | None = None,
) -> tuple[int, str, str | None, str, dict[str, Any] | None, bool]:
    """(status, served region, resumed header, content, spot error, saw [DONE])."""
    if not stream:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        served = response.headers.get("x-redline-served-region", "")
        if response.status_code != 200:
            return response.status_code, served, None, response.text, None, False
        content = response.json()["choices"][0]["message"]["content"]
        return 200, served, response.headers.get(RESUMED_HEADER), content, None, True
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        served = response.headers.get("x-redline-served-region", "")
        if on_served is not None:
            on_served(served)  # the stream is committed to that node from here on
        if response.status_code != 200:
            return response.status_code, served, None, response.read().decode(), None, False
        parts: list[str] = []
        error: dict[str, Any] | None = None
        done = False
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                error = event
                continue
            for choice in event.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
        return 200, served, response.headers.get(RESUMED_HEADER), "".join(parts), error, done


@dataclass
class LoadMix:
    """The requests the load sends: lengths (max_tokens) and the share not streamed."""

    lengths: tuple[int, ...] = (30, 300)
    non_streaming_share: float = 0.2


class SpotLoad:
    """Client threads sending requests through the gateway until stopped."""

    def __init__(self, gateway_url: str, workers: int, mix: LoadMix, seed: int = 7) -> None:
        self.gateway_url = gateway_url
        self.mix = mix
        self.stop_event = threading.Event()
        self.outcomes: list[RequestOutcome] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(i, seed + i), daemon=True)
            for i in range(workers)
        ]

    def _run(self, worker: int, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(
            base_url=self.gateway_url, timeout=httpx.Timeout(60.0, connect=2.0), trust_env=False
        ) as client:
            n = 0
            while not self.stop_event.is_set():
                n += 1
                length = self.mix.lengths[(worker + n) % len(self.mix.lengths)]
                stream = rng.random() >= self.mix.non_streaming_share
                prompt = f"spot drill {uuid.uuid4().hex[:8]} worker {worker} request {n}"
                outcome = run_request(client, prompt, length, stream)
                with self.lock:
                    self.outcomes.append(outcome)

    def burst(self, count: int, max_tokens: int) -> list[str]:
        """`count` more streams of `max_tokens` at once, beside the workers; the list fills with
        the node each one streams from as soon as it does."""
        served: list[str] = []

        def one(index: int) -> None:
            with httpx.Client(
                base_url=self.gateway_url, timeout=httpx.Timeout(60.0, connect=2.0), trust_env=False
            ) as client:
                prompt = f"spot drill burst {uuid.uuid4().hex[:8]} {index}"
                outcome = run_request(client, prompt, max_tokens, True, on_served=served.append)
            with self.lock:
                self.outcomes.append(outcome)

        for index in range(count):
            thread = threading.Thread(target=one, args=(index,), daemon=True)
            self.threads.append(thread)
            thread.start()
        return served

    def __enter__(self) -> SpotLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(90)

    def failures(self) -> list[str]:
        """The failure of every request that failed."""
        with self.lock:
            return [o.failure for o in self.outcomes if not o.ok]

    def summary(self) -> dict[str, Any]:
        """Counts over every request so far."""
        with self.lock:
            outcomes = list(self.outcomes)
        return {
            "requests": len(outcomes),
            "succeeded": sum(1 for o in outcomes if o.ok),
            "failed": sum(1 for o in outcomes if not o.ok),
            "interrupted": sum(1 for o in outcomes if o.interruptions),
            "resumed": sum(o.resumed for o in outcomes),
            "regenerated": sum(o.regenerated for o in outcomes),
        }

    def served_between(self, start: float, end: float) -> Counter[str]:
        """Attempts answered by each upstream between two times."""
        with self.lock:
            outcomes = list(self.outcomes)
        return Counter(s for o in outcomes for at, s in o.served_by if start <= at <= end)


# ---- the drills -----------------------------------------------------------------------------


@dataclass
class SpotDrillReport:
    """What a spot drill measured."""

    drill: str
    nodes: list[str]
    time_scale: float
    notice_windows: dict[str, float]
    drain_budgets: dict[str, float]
    failures: list[str] = field(default_factory=list)
    wasted_decode_tokens: float = 0.0
    notice_to_draining: dict[str, float | None] = field(default_factory=dict)
    replacement_latency: dict[str, float | None] = field(default_factory=dict)
    triage: dict[str, dict[str, int]] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    alert_firing_after: float | None = None
    alert_resolved_after: float | None = None
    fault_at: float | None = None
    error: str | None = None

    @property
    def non_recoverable_failures(self) -> int:
        """Client-visible failures the retry contract could not absorb (target 0)."""
        return len(self.failures)

    @property
    def ok(self) -> bool:
        """Every check held, nothing failed for a client, no error."""
        return self.error is None and not self.failures and all(ok for _, ok, _ in self.checks)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Record a check."""
        self.checks.append((name, ok, detail))
        return ok

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "drill": self.drill,
            "ok": self.ok,
            "nodes": self.nodes,
            "time_scale": self.time_scale,
            "notice_windows": self.notice_windows,
            "drain_budgets": self.drain_budgets,
            "non_recoverable_failures": self.non_recoverable_failures,
            "failures": self.failures[:20],
            "wasted_decode_tokens": self.wasted_decode_tokens,
            "notice_to_draining_seconds": self.notice_to_draining,
            "replacement_ready_latency_seconds": self.replacement_latency,
            "triage": self.triage,
            "load": self.load,
            "served": self.served,
            "alert_firing_after": self.alert_firing_after,
            "alert_resolved_after": self.alert_resolved_after,
            "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in self.checks],
            "error": self.error,
        }


def _new_report(fleet: SpotFleet, drill: str, nodes: list[str]) -> SpotDrillReport:
    providers = {fleet.nodes[n] for n in nodes}
    return SpotDrillReport(
        drill=drill,
        nodes=nodes,
        time_scale=fleet.config.time_scale,
        notice_windows={p: fleet.spot.notice_for(p) for p in sorted(providers)},
        drain_budgets={p: round(fleet.spot.drain_budget(p), 3) for p in sorted(providers)},
    )


def _finish(
    fleet: SpotFleet, report: SpotDrillReport, load: SpotLoad, wasted_before: float
) -> None:
    report.failures = load.failures()
    report.load = load.summary()
    report.wasted_decode_tokens = (
        fleet.gateway_total("llm_spot_wasted_decode_tokens_total") - wasted_before
    )
    for node in report.nodes:
        state = fleet.agent_state(node)
        report.notice_to_draining[node] = _rounded(state["notice_to_draining"])
        report.replacement_latency[node] = _rounded(state["replacement_latency"])
        decisions = [d for r in state["drain_reports"] for d in r.get("decisions", [])]
        report.triage[node] = dict(Counter(str(d["action"]) for d in decisions))
    report.check(
        "no client-visible non-recoverable failure",
        not report.failures,
        f"{report.load.get('requests', 0)} requests, {len(report.failures)} failed"
        + (f": {report.failures[0]}" if report.failures else ""),
    )
    for node in report.nodes:
        waited = report.notice_to_draining.get(node)
        # Only the detection delay scales with the drill's time; the drain itself (Redis, the
        # gateways' triage) takes real time, so the spec's own target is the fair bar.
        target = fleet.config.spec.spot.notice_to_draining_p95_seconds
        report.check(
            f"{node}: notice -> DRAINING within the spec's p95 target",
            waited is not None and waited <= target,
            f"{waited} s (target {target:g} s; detection delay scaled to "
            f"{fleet.spot.detection_delay_seconds:.3g} s)",
        )


def _rounded(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _preempt_and_recover(
    fleet: SpotFleet, report: SpotDrillReport, say: Say, nodes: list[str]
) -> None:
    preemptions = [fleet.preempt(node) for node in nodes]
    report.fault_at = min(p.issued_at for p in preemptions)
    for p in preemptions:
        say(f"{p.node} ({p.provider}): notice, termination in {p.terminate_at - time.time():.2f} s")
    for p in preemptions:
        fleet.wait_for(
            f"{p.node} DRAINING", functools.partial(fleet.drained_since, p.node, p), 10.0
        )
        say(f"{p.node}: draining")
    window = max(fleet.spot.notice_for(p.provider) for p in preemptions)
    timeout = window + fleet.spot.readiness_timeout_seconds + 10
    for p in preemptions:
        fleet.wait_for(
            f"{p.node} RECOVERED", functools.partial(fleet.recovered_since, p.node, p), timeout
        )
        say(f"{p.node}: recovered")
    for node in nodes:
        report.check(
            f"{node}: admission open again after recovery",
            fleet.admission_open(node),
            "routing store admission",
        )


def drill_spot_one(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """One spot node (AWS) preempted under load: its traffic moves to the other spot node."""
    node = next(n for n, p in fleet.nodes.items() if p == "aws")
    report = _new_report(fleet, "spot-one", [node])
    fleet.wait_ready()
    wasted = fleet.gateway_total("llm_spot_wasted_decode_tokens_total")
    with SpotLoad(fleet.gateway_url, 6, LoadMix((30, 250), 0.2)) as load:
        time.sleep(1.5)
        _preempt_and_recover(fleet, report, say, [node])
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    return report


def drill_spot_two(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """Both spot nodes preempted at once: capacity falls under demand, traffic spills to the
    on-demand pool."""
    nodes = list(fleet.nodes)
    report = _new_report(fleet, "spot-two", nodes)
    fleet.wait_ready()
    wasted = fleet.gateway_total("llm_spot_wasted_decode_tokens_total")
    with SpotLoad(fleet.gateway_url, 6, LoadMix((30, 150), 0.2)) as load:
        time.sleep(1.5)
        before = load.served_between(0, time.time())
        _preempt_and_recover(fleet, report, say, nodes)
        during = load.served_between(report.fault_at or 0.0, time.time())
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    report.served = dict(during)
    spill = fleet.config.ondemand
    report.check(
        "the on-demand pool served nothing before the preemption",
        before.get(spill, 0) == 0,
        f"served before: {dict(before)}",
    )
    report.check(
        "traffic spilled to the on-demand pool while both spot nodes drained",
        during.get(spill, 0) > 0,
        f"served after the notice: {dict(during)}",
    )
    return report


def drill_spot_long_streams(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """A notice during long streams on the GCP node: triage continues what fits the 1.5 s
    (scaled) window and aborts the rest; every aborted stream resumes after its prefix."""
    node = next(n for n, p in fleet.nodes.items() if p == "gcp")
    report = _new_report(fleet, "spot-long-streams", [node])
    fleet.wait_ready()
    wasted = fleet.gateway_total("llm_spot_wasted_decode_tokens_total")
    with SpotLoad(fleet.gateway_url, 6, LoadMix((200, 160, 240), 0.0)) as load:
        time.sleep(2.0)
        # Short streams in flight on the node when the notice lands: 24 tokens always fit.
        served = load.burst(6, 24)
        fleet.wait_for(f"a short stream on {node}", lambda: node in served, 10.0)
        _preempt_and_recover(fleet, report, say, [node])
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    triage = report.triage.get(node, {})
    report.check(
        "triage aborted the streams that could not finish in the budget",
        triage.get("abort", 0) > 0,
        f"decisions: {triage}",
    )
    report.check(
        "triage let the streams that fit the budget finish on the node",
        triage.get("continue", 0) > 0,
        f"decisions: {triage}",
    )
    report.check(
        "aborted streams resumed after their served prefix (no regeneration)",
        report.load.get("resumed", 0) > 0 and report.load.get("regenerated", 0) == 0,
        f"resumed {report.load.get('resumed')}, regenerated {report.load.get('regenerated')}",
    )
    return report


def drill_spot_never_ready(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """The replacement never passes the readiness gate: admission stays closed, the node stays
    TERMINATING and SpotReplacementSlow fires; a healthy replacement then recovers it."""
    node = next(n for n, p in fleet.nodes.items() if p == "gcp")
    report = _new_report(fleet, "spot-never-ready", [node])
    fleet.wait_ready()
    wasted = fleet.gateway_total("llm_spot_wasted_decode_tokens_total")
    with SpotLoad(fleet.gateway_url, 4, LoadMix((30, 120), 0.2)) as load:
        time.sleep(1.0)
        preemption = fleet.preempt(node, broken_replacement=True)
        report.fault_at = preemption.issued_at
        fleet.wait_for(
            f"{node} TERMINATING",
            lambda: (
                fleet.drained_since(node, preemption) and fleet.node_state(node) == "terminating"
            ),
            15,
        )
        terminated = time.time()
        say(f"{node}: terminating; its replacement fails every inference")
        firing = fleet.wait_for(
            "SpotReplacementSlow to fire",
            lambda: any(a["state"] == "firing" for a in fleet.alerts("SpotReplacementSlow",
                                                                      node=node)),
            30,
        )  # fmt: skip
        report.alert_firing_after = round(firing - preemption.issued_at, 3)
        say(f"SpotReplacementSlow firing after {report.alert_firing_after} s")
        state = fleet.agent_state(node)
        report.check(
            "the node stays TERMINATING while its replacement is not ready",
            state["state"] == "terminating",
            f"state {state['state']}, readiness: {state.get('readiness')}",
        )
        report.check(
            "admission stays closed while the replacement is not ready",
            not fleet.admission_open(node),
            "routing store admission",
        )
        report.check(
            "no request was answered by the broken replacement",
            load.served_between(terminated, time.time()).get(node, 0) == 0,
            f"served since termination: {dict(load.served_between(terminated, time.time()))}",
        )
        fleet.replace(node)
        say(f"{node}: healthy replacement started")
        fleet.wait_for(f"{node} RECOVERED", lambda: fleet.recovered_since(node, preemption), 30)
        resolved = fleet.wait_for(
            "SpotReplacementSlow to resolve",
            lambda: not fleet.alerts("SpotReplacementSlow", node=node),
            30,
        )
        report.alert_resolved_after = round(resolved - preemption.issued_at, 3)
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    window = fleet.spot.notice_for("gcp")
    latency = report.replacement_latency.get(node)
    report.check(
        "the replacement latency shows the wait beyond the notice window",
        latency is not None and latency > window,
        f"{latency} s (window {window:g} s)",
    )
    return report


SCENARIOS: dict[str, Callable[[SpotFleet, Say], SpotDrillReport]] = {
    "spot-one": drill_spot_one,
    "spot-two": drill_spot_two,
    "spot-long-streams": drill_spot_long_streams,
    "spot-never-ready": drill_spot_never_ready,
}
"""The spot drills by name; each runs on a started fleet."""


def run_spot_drill(name: str, fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """Run one scenario; a step that does not happen in time is the report's error."""
    try:
        return SCENARIOS[name](fleet, say)
    except (SpotDrillError, ServiceError, httpx.HTTPError, redis.RedisError) as exc:
        report = SpotDrillReport(name, [], fleet.config.time_scale, {}, {})
        report.error = f"{type(exc).__name__}: {exc}"
        return report


def _in_stack(name: str) -> Callable[[DrillContext], DrillResult]:
    """The scenario as a `redline drill` of the running stack (its Redis, its spec)."""

    def run(ctx: DrillContext) -> DrillResult:
        from redline.devstack.drills import DrillResult

        workdir = ctx.state.layout().data_dir / "spot-drills" / name
        config = FleetConfig(workdir, ctx.endpoints.redis_url, ctx.spec)
        started = time.time()
        fleet = SpotFleet(config)
        try:
            fleet.start(lambda message: ctx.say(name, message))
            report = run_spot_drill(name, fleet, lambda message: ctx.say(name, message))
        finally:
            fleet.stop()
        expect_alert = name == "spot-never-ready"
        result = DrillResult(
            name,
            "SpotReplacementSlow" if expect_alert else "",
            None,
            0.0,
            fault=f"spot preemption of {', '.join(report.nodes)} (time scale "
            f"{report.time_scale:g})",
            fault_at=report.fault_at or started,
            expect_alert=expect_alert,
        )
        if report.fault_at is not None and report.alert_firing_after is not None:
            result.firing_at = report.fault_at + report.alert_firing_after
        if report.fault_at is not None and report.alert_resolved_after is not None:
            result.recovered_at = report.fault_at + report.alert_resolved_after
        for check, ok, detail in report.checks:
            result.check(check, ok, detail)
        result.lost = report.non_recoverable_failures
        result.lost_detail = "client-visible non-recoverable failures" + (
            f": {report.failures[0]}" if report.failures else ""
        )
        result.notes.append(json.dumps(report.as_dict(), sort_keys=True))
        result.error = report.error
        return result

    return run


SPOT_DRILLS: dict[str, Callable[[DrillContext], DrillResult]] = {
    name: _in_stack(name) for name in SPOT_DRILL_ORDER
}
"""The spot drills as `redline drill NAME` runs them on the local stack."""


__all__ = [
    "SCENARIOS",
    "SPOT_DRILLS",
    "SPOT_DRILL_ORDER",
    "FleetConfig",
    "LoadMix",
    "Preemption",
    "RequestOutcome",
    "SpotDrillError",
    "SpotDrillReport",
    "SpotFleet",
    "SpotLoad",
    "expected_answer",
    "run_request",
    "run_spot_drill",
]
