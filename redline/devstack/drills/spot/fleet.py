"""The spot drills' fleet: simulators, a gateway, spot agents, metadata servers and a Prometheus.

`SpotFleet` runs one upstream simulator process per node (`spot-a` on AWS, `spot-b` on GCP, the
on-demand pool `ondemand`), a gateway process balancing round robin over the spot nodes with
`ondemand` as the spill pool, one `redline spot-agent` process per spot node, a local metadata
server per spot node (AWS IMDSv2 or GCP, in this process), and a Prometheus scraping the gateway
and the agents and evaluating the generated spot alerts. Redis is given (the stack's, or the
tests'); every key lives under the fleet's own prefix. Every process is started by
`redline.devstack.processes.spawn`, its output in a log file under the fleet's workdir.

Time is compressed by `time_scale` (default 0.05: the AWS 120 s window becomes 6 s, GCP's 30 s
1.5 s; detection delay, ingress removal, safety margin, the p95 target and the readiness timeout
scale the same way), and generation runs at `tokens_per_second` (50), so a drill takes seconds
and the triage sees the same ratios it would in production.

A preemption is what a cloud does: the notice appears in the node's metadata, the node's process
is SIGKILLed at the notice's termination time, and a replacement process starts on the node's
address after `boot_seconds` (its model loads for another `boot_seconds`), healthy or broken.
"""

from __future__ import annotations

import functools
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.drills.base import exposition_total, matching_alerts, poll_until
from redline.devstack.fakes.metadata_server import MetadataSettings, build_metadata_app
from redline.devstack.processes import (
    Service,
    ServiceError,
    free_port,
    spawn,
    start_prometheus,
    wait_service,
)
from redline.platform.prometheus import PrometheusClient, PrometheusError
from redline.platform.routing import RoutingStore
from redline.platform.spot import scale_spot
from redline.rules.build import build_spot_alerts
from redline.rules.render import render_rule_file
from redline.slo.spec import Spec

MODEL = "redline-base"
HOST = "127.0.0.1"
Say = Callable[[str], None]
TRANSIENT = (httpx.HTTPError, redis.RedisError, KeyError, PrometheusError)
"""Errors of a poll that count as "not yet" (a node restarting, a key not written yet)."""


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
        self.prometheus_client: PrometheusClient | None = None
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
        # The gateway's admin API needs a token (secure by default); the agents present it.
        admin_token = self.workdir / "config" / "admin-token"
        admin_token.write_text(secrets.token_urlsafe(32) + "\n")
        admin_token.chmod(0o600)
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
                "admin_token_file": str(admin_token),
                # The spot drills test the drain/resume contract with time-compressed notices;
                # the breakers' 30 s `open_for` is not compressed with them (it kept traffic off
                # a released replacement once), and they have their own drill.
                "breakers": {"enabled": False},
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
                    "gateway_token_file": str(admin_token),
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
        log_path = self.workdir / "logs" / f"{name}.log"
        return Service(name, spawn(argv, log_path), HOST, 0, self.workdir, log_path)

    def _ready(self, service: Service, url: str) -> Service:
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        service = Service(service.name, service.process, HOST, port, self.workdir, service.log_path)

        def up() -> bool:
            return self.http.get(url, timeout=1.0).status_code == 200

        wait_service(service, up, 60.0)
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
        service = start_prometheus(self.workdir / "prometheus", path)
        self.prometheus_client = PrometheusClient(service.url, 10.0, retries=0, trust_env=False)
        return service

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
        if self.prometheus_client is not None:
            self.prometheus_client.close()
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

    def gateway_total(self, name: str, **labels: str) -> float:
        """Sum of a gateway family's samples whose labels include `labels`."""
        return exposition_total(self.http.get(f"{self.gateway_url}/metrics").text, name, labels)

    def alerts(self, name: str, **labels: str) -> list[dict[str, Any]]:
        """Prometheus's active alerts called `name` with these labels."""
        assert self.prometheus_client is not None
        return matching_alerts(self.prometheus_client.alerts(), name, labels)

    def admission_open(self, node: str) -> bool:
        """Whether the routing store admits requests to the node."""
        return self.routing.get_admission(node).open

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        """Poll `check` every 20 ms; the time it first held (SpotDrillError on timeout)."""

        def held() -> float | None:
            return time.time() if check() else None

        return poll_until(held, timeout, 0.02, what, SpotDrillError, retry_on=TRANSIENT)

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


__all__ = ["FleetConfig", "Preemption", "SpotDrillError", "SpotFleet"]
