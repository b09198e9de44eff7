"""Two gateway replicas on one real Redis in front of two real simulated regions: a routing
override set through the store moves both, its clearing moves both back, and tokens one replica
consumes empty the bucket the other one admits from."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from redline.core.servers import ServerThread
from redline.platform.routing import SERVED_REGION_HEADER, RoutingStore
from redline.slo import catalog
from tests.support.gateway import RunningGateway, gateway_starter, simulators

pytestmark = pytest.mark.integration

REGIONS = ("primary", "secondary")
SQL = "Write a SQL query that returns the top 10 orders by total amount last month."
QUOTAS: dict[str, Any] = {
    "enabled": True,
    "models": ["redline-base"],
    "tenants": {"header": "x-redline-tenant", "default": "anonymous"},
    "default_completion_tokens": 16,
    # A request reserves prompt + completion + buffer; what it did not use is refunded later.
    "limits": [
        {
            "intent": "sql",
            "tokens_per_minute": 1,
            "burst": 400,
            "safety_buffer_tokens": 60,
            "overflow": "reject",
        },
    ],
    "elastic": {"slope": 0.0},
}


@pytest.fixture()
def sims() -> Iterator[dict[str, ServerThread]]:
    with simulators(REGIONS) as servers:
        yield servers


@pytest.fixture()
def pair(
    redis_url: str, sims: dict[str, ServerThread], tmp_path: Path
) -> Iterator[list[RunningGateway]]:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(yaml.safe_dump({"quotas": QUOTAS}))
    upstreams = {region: server.url for region, server in sims.items()}
    with gateway_starter(redis_url, RunningGateway, 10.0) as start:
        yield [start(upstreams, routing_refresh_seconds=0.2, quotas_file=quotas) for _ in range(2)]


def ask(gw: RunningGateway, text: str = "hello", tenant: str = "acme") -> httpx.Response:
    body = {"model": "redline-base", "messages": [{"role": "user", "content": text}]}
    return gw.client.post("/v1/chat/completions", json=body, headers={"x-redline-tenant": tenant})


def served_by(gw: RunningGateway) -> str:
    answer = ask(gw)
    assert answer.status_code == 200, answer.text
    return answer.headers[SERVED_REGION_HEADER]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - started


def wait_served_by(gw: RunningGateway, region: str, what: str) -> float:
    """Seconds until the replica serves from `region`."""
    return wait_for(lambda: served_by(gw) == region, 2.0, what)


def test_both_replicas_follow_the_routing_override(
    pair: list[RunningGateway], redis_url: str
) -> None:
    store = RoutingStore.from_url(redis_url, regions=REGIONS)
    try:
        assert [served_by(gw) for gw in pair] == ["primary", "primary"]
        store.set_override("secondary", "drill: primary degraded")
        for gw in pair:
            assert wait_served_by(gw, "secondary", "the override") < 1.0
            assert gw.client.get("/healthz").json()["override"] == "secondary"
        assert [served_by(gw) for gw in pair for _ in range(3)] == ["secondary"] * 6
        store.clear_override()
        for gw in pair:
            wait_served_by(gw, "primary", "the override cleared")
        store.close_admission("primary", "spot notice")
        for gw in pair:
            wait_served_by(gw, "secondary", "admission closed")
        store.open_admission("primary")
        for gw in pair:
            wait_served_by(gw, "primary", "admission open")
    finally:
        store.close()


def test_tokens_consumed_through_one_replica_are_seen_by_the_other(
    pair: list[RunningGateway],
) -> None:
    one, two = pair
    name = catalog.LLM_QUOTA_REQUESTS_TOTAL.name

    def drain() -> int:
        count = 0
        while (answer := ask(one, SQL)).status_code == 200:
            count += 1
            assert count < 20, "the bucket never ran out"
        assert answer.status_code == 429
        return count

    # Spend the bucket through the first replica only; settlements are batched (~0.1 s), so a
    # refund may reopen room after a 429: drain until a settled bucket admits nothing more.
    admitted = drain()
    for _ in range(10):
        time.sleep(0.3)
        more = drain()
        admitted += more
        if more == 0:
            break
    assert more == 0 and admitted >= 2, admitted
    # The second replica never served this tenant, yet finds the bucket empty.
    refused = ask(two, SQL)
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert two.value(name, tenant="acme", intent="sql", outcome="throttled") == 1
    assert two.value(name, tenant="acme", intent="sql", outcome="admitted") == 0
    assert one.value(name, tenant="acme", intent="sql", outcome="admitted") == admitted
    # Another tenant's bucket is its own, on either replica.
    assert ask(two, SQL, tenant="globex").status_code == 200
