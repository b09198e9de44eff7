"""`model_version` from the snapshot registry: the real gateway in front of a simulated region."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.platform.golden import MODEL_VERSION_HEADER
from redline.platform.snapshots import SnapshotRegistry
from redline.slo import catalog
from tests.support.gateway import RunningGateway, gateway_starter

pytestmark = pytest.mark.integration

BASE = "redline-base"


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server: ServerThread = serve_in_thread(build_simulator_app(SimulatorSettings(region="primary")))
    yield server.url
    server.stop()


@pytest.fixture()
def start_gateway(redis_url: str) -> Iterator[Callable[..., RunningGateway]]:
    with gateway_starter(redis_url, RunningGateway, 10.0) as start:
        yield start


def activate(registry: SnapshotRegistry, root: Path, model: str, version: str) -> None:
    weights = root / f"{version}-weights"
    weights.mkdir(parents=True)
    (weights / "adapter_model.safetensors").write_bytes(version.encode() * 64)
    config = root / f"{version}-config.json"
    config.write_text(f'{{"version": "{version}"}}')
    registry.activate(model, registry.create(model, version, weights, config).snapshot_id)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": BASE, "messages": [{"role": "user", "content": "hello"}], **extra}


def requests_by_version(gw: RunningGateway) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in gw.registry.collect():
        for sample in family.samples:
            if sample.name == catalog.LLM_REQUESTS_TOTAL.name and sample.labels["model"] == BASE:
                version = sample.labels["model_version"]
                out[version] = out.get(version, 0.0) + sample.value
    return out


def test_the_registry_version_replaces_the_header(
    upstream: str, start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    registry = SnapshotRegistry(tmp_path / "snapshots")
    gw = start_gateway({"primary": upstream}, snapshots_root=registry.root, version_ttl_seconds=0.2)
    # No active snapshot of the model yet: the upstream's header is used.
    answer = gw.client.post("/v1/chat/completions", json=chat())
    assert answer.status_code == 200 and answer.headers[MODEL_VERSION_HEADER] == "base"
    assert requests_by_version(gw) == {"base": 1}

    activate(registry, tmp_path / "r1", BASE, "r1")
    time.sleep(0.3)  # one TTL
    answer = gw.client.post("/v1/chat/completions", json=chat())
    assert answer.headers[MODEL_VERSION_HEADER] == "r1"  # what the metrics record
    with gw.client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as streamed:
        assert streamed.headers[MODEL_VERSION_HEADER] == "r1"
        streamed.read()
    assert requests_by_version(gw) == {"base": 1, "r1": 2}
    tokens = {"served_region": "primary", "model": BASE, "model_version": "r1"}
    assert gw.value(catalog.LLM_GENERATED_TOKENS_TOTAL.name, **tokens) > 0
    assert gw.value(catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.count, **tokens) == 1

    # A rollback (the playbook switches the pointer) shows within one TTL, no restart.
    activate(registry, tmp_path / "r0", BASE, "r0")
    deadline = time.monotonic() + 5
    while gw.client.post("/v1/chat/completions", json=chat()).headers[MODEL_VERSION_HEADER] != "r0":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert requests_by_version(gw)["r0"] >= 1


def test_without_a_registry_the_header_is_kept(
    upstream: str, start_gateway: Callable[..., RunningGateway]
) -> None:
    gw = start_gateway({"primary": upstream})
    for _ in range(3):
        assert gw.client.post("/v1/chat/completions", json=chat()).status_code == 200
    assert requests_by_version(gw) == {"base": 3}


def test_a_missing_registry_root_falls_back_to_the_header(
    upstream: str, start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    gw = start_gateway({"primary": upstream}, snapshots_root=tmp_path / "does-not-exist")
    answer = gw.client.post("/v1/chat/completions", json=chat())
    assert answer.status_code == 200
    assert requests_by_version(gw) == {"base": 1}
    assert httpx.get(f"{gw.server.url}/healthz").status_code == 200
