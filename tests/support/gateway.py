"""Helpers of the gateway tests: the real gateway app on a uvicorn thread with its own registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from prometheus_client import CollectorRegistry

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.gateway import GatewaySettings, build_gateway_app
from redline.slo.load import load_spec


@dataclass
class RunningGateway:
    """A gateway served in a thread, its private metrics registry and a client to it."""

    server: ServerThread
    registry: CollectorRegistry
    client: httpx.Client

    def value(self, name: str, **labels: str) -> float:
        """A sample's value, 0.0 when the series does not exist (yet)."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found


G = TypeVar("G", bound=RunningGateway)


@contextmanager
def simulators(regions: Iterable[str]) -> Iterator[dict[str, ServerThread]]:
    """An engine simulator per region (seeded by its position), served in threads."""
    servers = {
        region: serve_in_thread(build_simulator_app(SimulatorSettings(region=region, seed=i)))
        for i, region in enumerate(regions)
    }
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@contextmanager
def gateway_starter(
    redis_url: str, kind: type[G], client_timeout: float
) -> Iterator[Callable[..., G]]:
    """`start(upstreams, **settings)` serving gateways on the default spec; all stopped on exit."""
    started: list[G] = []
    spec = load_spec(None).spec

    def start(upstreams: dict[str, str], **overrides: Any) -> G:
        settings = GatewaySettings(
            upstreams=upstreams, redis_url=overrides.pop("redis_url", redis_url), **overrides
        )
        registry = CollectorRegistry()
        server = serve_in_thread(build_gateway_app(settings, spec, registry))
        gateway = kind(server, registry, httpx.Client(base_url=server.url, timeout=client_timeout))
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in started:
            gateway.client.close()
            gateway.server.stop()
