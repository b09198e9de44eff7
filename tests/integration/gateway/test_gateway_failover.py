"""Every endpoint of the gateway while Redis is gone: a real Redis that was stopped, and Sentinels
whose primary was killed with nobody to promote (mid-failover). What needs Redis (a quota check
that fails closed, the spot ledger of a resumed or not-retry-safe request) answers 503 with
Retry-After; what does not (plain proxying when quotas fail open, the admin spot endpoints,
`/healthz`, `/metrics`) keeps answering; nothing answers 500."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.platform.spot import REQUEST_ID_HEADER, RESUME_HEADER, RETRY_SAFE_HEADER
from redline.slo import catalog
from tests.support.gateway import RunningGateway, gateway_starter
from tests.support.replicas import sentinels_without_primary, stopped_redis_url

pytestmark = pytest.mark.integration

SQL = "Write a SQL query that returns the top 10 orders by total amount last month."


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerThread]:
    server = serve_in_thread(build_simulator_app(SimulatorSettings(region="primary")))
    yield server
    server.stop()


@pytest.fixture(params=["stopped", "sentinel-no-primary"])
def dead_redis_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "stopped":
        yield stopped_redis_url(tmp_path)
        return
    with sentinels_without_primary(tmp_path) as url:
        yield url


@pytest.fixture()
def start_gateway(dead_redis_url: str) -> Iterator[Callable[..., RunningGateway]]:
    with gateway_starter(dead_redis_url, RunningGateway, 10.0) as start:
        yield start


def quotas_file(tmp_path: Path, action: str) -> Path:
    path = tmp_path / "quotas.yaml"
    quotas: dict[str, Any] = {
        "enabled": True,
        "on_store_error": action,
        "limits": [{"intent": "*", "tokens_per_minute": 100000, "safety_buffer_tokens": 300}],
    }
    path.write_text(yaml.safe_dump({"quotas": quotas}))
    return path


def chat(gw: RunningGateway, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": "redline-base", "messages": [{"role": "user", "content": SQL}]}
    return gw.client.post("/v1/chat/completions", json=body, headers=headers or {})


def assert_retry_later(answer: httpx.Response, what: str) -> None:
    assert answer.status_code == 503, f"{what}: {answer.status_code} {answer.text}"
    assert answer.headers["Retry-After"] == "1", what
    assert answer.json()["error"]["message"], what


def test_what_needs_redis_answers_503_with_retry_after(
    sim: ServerThread, start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    gw = start_gateway({"primary": sim.url}, quotas_file=quotas_file(tmp_path, "fail_closed"))
    assert_retry_later(chat(gw), "quota check, fail_closed")
    # Quotas aside, the ledger: a resumed request and a request that must run at most once.
    open_gw = start_gateway({"primary": sim.url}, admin_open=True)
    assert_retry_later(chat(open_gw, {RESUME_HEADER: "req-1"}), "resume")
    once = {REQUEST_ID_HEADER: "req-2", RETRY_SAFE_HEADER: "false"}
    assert_retry_later(chat(open_gw, once), "not retry-safe")
    refused = catalog.LLM_REQUESTS_TOTAL.name
    assert open_gw.value(refused, region="none", served_region="none", rerouted="false",
                         model="unknown", model_version="unknown", status="503") == 2  # fmt: skip
    # What needs no Redis keeps working: proxying, the admin spot endpoints, the probes.
    assert chat(open_gw).status_code == 200
    order = {"node": "primary", "budget_seconds": 1}
    drained = open_gw.client.post("/admin/spot/drain", json=order)
    assert drained.status_code == 200, drained.text
    assert open_gw.client.get("/admin/spot/nodes/primary").status_code == 200
    released = open_gw.client.post("/admin/spot/release", json={"node": "primary"})
    assert released.status_code == 200
    health = open_gw.client.get("/healthz")
    assert health.status_code == 200 and health.json()["routing_store_up"] is False
    assert open_gw.client.get("/metrics").status_code == 200


def test_quotas_failing_open_keep_serving(
    sim: ServerThread, start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    gw = start_gateway({"primary": sim.url}, quotas_file=quotas_file(tmp_path, "fail_open"))
    for _ in range(3):
        assert chat(gw).status_code == 200
