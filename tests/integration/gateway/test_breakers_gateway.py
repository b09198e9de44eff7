"""The circuit breakers in the real gateway in front of two real simulated regions: a failing
primary opens its breaker, later requests go straight to the secondary without touching the
primary (counted at the primary's /admin/stats), then half-open probes close it again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from redline.core.servers import ServerThread
from redline.gateway.settings import BreakerOverrides
from redline.slo import catalog
from tests.support.gateway import RunningGateway, gateway_starter, simulators

pytestmark = pytest.mark.integration

REGIONS = ("primary", "secondary")
OPEN_FOR = 5.0  # long enough for 20 requests on a busy machine
BODY: dict[str, Any] = {"model": "redline-base", "messages": [{"role": "user", "content": "hi"}]}
BREAKERS = BreakerOverrides(window="10s", open_for="5s", min_requests=10, half_open_probes=3)


@pytest.fixture()
def sims() -> Iterator[dict[str, ServerThread]]:
    with simulators(REGIONS) as servers:
        yield servers


@pytest.fixture()
def start_gateway(redis_url: str) -> Iterator[Callable[..., RunningGateway]]:
    with gateway_starter(redis_url, RunningGateway, 10.0) as start:
        yield start


def attempts(url: str) -> int:
    """Chat requests the simulator saw (answered or failed by an injected fault)."""
    counts: dict[str, int] = httpx.get(f"{url}/admin/stats").json()["counts"]
    return counts.get("completions", 0) + counts.get("errors", 0)


def ask(gw: RunningGateway) -> httpx.Response:
    response = gw.client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200, response.text
    return response


def test_a_failing_primary_is_skipped_then_probed_and_closed(
    sims: dict[str, ServerThread], start_gateway: Callable[..., RunningGateway]
) -> None:
    primary, secondary = sims["primary"].url, sims["secondary"].url
    # The consecutive-failure demotion is off: the breaker alone decides here.
    gw = start_gateway(
        {"primary": primary, "secondary": secondary},
        breakers=BREAKERS,
        unhealthy_after_failures=0,
    )
    state = catalog.LLM_GATEWAY_BREAKER_STATE.name
    moves = catalog.LLM_GATEWAY_BREAKER_TRANSITIONS_TOTAL.name
    assert gw.value(state, region="primary", state="closed") == 1
    httpx.post(f"{primary}/admin/faults", json={"error_rate": 1.0}).raise_for_status()

    # Closed: every request tries the failing primary first, then the secondary answers.
    for _ in range(10):
        assert ask(gw).headers["x-redline-served-region"] == "secondary"
    assert attempts(primary) == 10
    assert gw.client.get("/healthz").json()["breakers"] == {
        "primary": "open",
        "secondary": "closed",
    }
    assert gw.value(state, region="primary", state="open") == 1
    assert gw.value(state, region="primary", state="closed") == 0
    assert gw.value(moves, region="primary", **{"from": "closed", "to": "open"}) == 1

    # Open: straight to the secondary, the primary never sees them; not counted as reroutes.
    started = time.monotonic()
    for _ in range(20):
        response = ask(gw)
        assert response.headers["x-redline-served-region"] == "secondary"
        assert response.headers["x-redline-rerouted"] == "false"
    assert time.monotonic() - started < OPEN_FOR, "the open period ended during the check"
    assert attempts(primary) == 10

    # The primary recovers; after open_for the next requests probe it, then it closes.
    httpx.post(f"{primary}/admin/faults", json={}).raise_for_status()
    time.sleep(OPEN_FOR + 0.2)
    served = [ask(gw).headers["x-redline-served-region"] for _ in range(3)]
    assert served == ["primary"] * 3
    assert gw.value(moves, region="primary", **{"from": "open", "to": "half_open"}) == 1
    assert gw.value(moves, region="primary", **{"from": "half_open", "to": "closed"}) == 1
    assert gw.value(state, region="primary", state="closed") == 1
    assert ask(gw).headers["x-redline-served-region"] == "primary"
    assert attempts(primary) == 14


def test_a_failing_probe_opens_again_and_the_last_region_is_still_tried(
    sims: dict[str, ServerThread], start_gateway: Callable[..., RunningGateway]
) -> None:
    primary, secondary = sims["primary"].url, sims["secondary"].url
    gw = start_gateway(
        {"primary": primary, "secondary": secondary},
        breakers=BREAKERS,
        unhealthy_after_failures=0,
    )
    moves = catalog.LLM_GATEWAY_BREAKER_TRANSITIONS_TOTAL.name
    httpx.post(f"{primary}/admin/faults", json={"error_rate": 1.0}).raise_for_status()
    for _ in range(10):
        ask(gw)
    time.sleep(OPEN_FOR + 0.2)
    assert ask(gw).headers["x-redline-served-region"] == "secondary"  # the probe failed
    assert gw.value(moves, region="primary", **{"from": "half_open", "to": "open"}) == 1
    assert attempts(primary) == 11

    # Both regions down, the primary's breaker open: it is still tried, last, as the only
    # region left (a 5xx from it beats a refusal without trying).
    httpx.post(f"{secondary}/admin/faults", json={"error_rate": 1.0}).raise_for_status()
    response = gw.client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 500
    assert response.headers["x-redline-served-region"] == "primary"
    assert attempts(primary) == 12


def test_breakers_can_be_turned_off(
    sims: dict[str, ServerThread], start_gateway: Callable[..., RunningGateway]
) -> None:
    primary, secondary = sims["primary"].url, sims["secondary"].url
    gw = start_gateway(
        {"primary": primary, "secondary": secondary},
        breakers=BreakerOverrides(enabled=False, min_requests=10),
        unhealthy_after_failures=0,
    )
    httpx.post(f"{primary}/admin/faults", json={"error_rate": 1.0}).raise_for_status()
    for _ in range(30):
        ask(gw)
    assert attempts(primary) == 30  # every request still tries the primary first
    assert gw.client.get("/healthz").json()["breakers"] is None
