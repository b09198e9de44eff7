"""Token quotas in the real gateway, against real Redis and a real simulated region: two
gateways share one tenant's bucket, an empty bucket rejects with Retry-After or downgrades,
unused reservations are refunded, and a Redis outage fails open or closed as configured."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.slo import catalog
from tests.support.gateway import RunningGateway, gateway_starter

pytestmark = pytest.mark.integration

SQL = "Write a SQL query that returns the top 10 orders by total amount last month."
SUMMARY = "Summarise the meeting notes below in three bullet points. " + "word " * 200
CHAT = "Hi! What's a good name for a golden retriever puppy?"
QUOTAS: dict[str, Any] = {
    "enabled": True,
    "models": ["redline-base", "redline-small"],
    "tenants": {"header": "x-redline-tenant", "default": "anonymous"},
    "default_completion_tokens": 16,
    "limits": [
        # The notes' examples, scaled so a few requests empty the bucket.
        {
            "intent": "sql",
            "tokens_per_minute": 60,
            "burst": 350,
            "safety_buffer_tokens": 300,
            "overflow": "reject",
        },
        {
            "intent": "summarise",
            "tokens_per_minute": 60,
            "burst": 300,
            "overflow": "downgrade",
            "downgrade_to": "redline-small",
        },
    ],
    "elastic": {"slope": 0.0},
}


@pytest.fixture()
def sim(tmp_path: Path) -> Iterator[ServerThread]:
    adapter = tmp_path / "small" / "v1"
    adapter.mkdir(parents=True)
    settings = SimulatorSettings(region="primary", adapters={"redline-small": str(adapter)})
    server = serve_in_thread(build_simulator_app(settings))
    yield server
    server.stop()


@pytest.fixture()
def start_gateway(redis_url: str) -> Iterator[Callable[..., RunningGateway]]:
    with gateway_starter(redis_url, RunningGateway, 10.0) as start:
        yield start


def quotas_file(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "quotas.yaml"
    path.write_text(yaml.safe_dump({"quotas": {**QUOTAS, **changes}}))
    return path


def ask(gw: RunningGateway, text: str, tenant: str = "acme", **extra: Any) -> httpx.Response:
    body = {"model": "redline-base", "messages": [{"role": "user", "content": text}], **extra}
    return gw.client.post("/v1/chat/completions", json=body, headers={"x-redline-tenant": tenant})


def quota_requests(gw: RunningGateway, tenant: str, intent: str, outcome: str) -> float:
    name = catalog.LLM_QUOTA_REQUESTS_TOTAL.name
    return gw.value(name, tenant=tenant, intent=intent, outcome=outcome)


def wait_for_refund(gw: RunningGateway, tenant: str, intent: str) -> float:
    """The tokens refunded to the bucket, once the batched settlement has reached Redis."""
    name = catalog.LLM_QUOTA_REFUNDED_TOKENS_TOTAL.name
    deadline = time.monotonic() + 5.0
    while (refunded := gw.value(name, tenant=tenant, intent=intent)) == 0:
        assert time.monotonic() < deadline, "no settlement within 5 s"
        time.sleep(0.005)
    return refunded


def test_two_gateways_share_a_bucket_and_reject_with_retry_after(
    sim: ServerThread, start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    file = quotas_file(tmp_path)
    one = start_gateway({"primary": sim.url}, quotas_file=file)
    two = start_gateway({"primary": sim.url}, quotas_file=file)
    # A SQL request reserves ~30 + 300 tokens; after its refund the 350-token bucket holds ~320.
    assert ask(one, SQL).status_code == 200
    wait_for_refund(one, "acme", "sql")  # settlements are batched, sent within ~0.1 s
    refused = ask(two, SQL)  # the other replica sees the same, now nearly empty, bucket
    assert refused.status_code == 429, refused.text
    retry = int(refused.headers["retry-after"])
    assert 1 <= retry <= 40  # seconds until 60 tokens/min refill the ~12-token shortfall
    assert refused.json()["error"]["type"] == "RateLimitError"
    assert "sql" in refused.json()["error"]["message"]
    assert quota_requests(two, "acme", "sql", "throttled") == 1
    assert quota_requests(one, "acme", "sql", "admitted") == 1
    # Another tenant has its own bucket.
    assert ask(two, SQL, tenant="globex").status_code == 200
    # Chat has no limit: never throttled.
    assert ask(one, CHAT).status_code == 200
    assert quota_requests(one, "acme", "chat", "unlimited") == 1


def test_unused_reservation_is_refunded(
    sim: ServerThread,
    start_gateway: Callable[..., RunningGateway],
    tmp_path: Path,
    redis_url: str,
) -> None:
    gw = start_gateway({"primary": sim.url}, quotas_file=quotas_file(tmp_path))
    response = ask(gw, SQL, max_tokens=8)
    assert response.status_code == 200
    usage = response.json()["usage"]

    # The 300-token safety buffer at least comes back: the real usage is far below it.
    assert wait_for_refund(gw, "acme", "sql") >= 300
    client = redis.Redis.from_url(redis_url)
    keys = [k.decode() for k in client.keys("redline:quota:*")]
    assert keys == ["redline:quota:{acme}:sql:*"]
    level = float(client.hget(keys[0], "level") or 0)
    # What stays charged is the real usage (plus a little refill since): 350 - used.
    used = usage["prompt_tokens"] + usage["completion_tokens"]
    assert 350 - used - 1 <= level <= 350
    errors = catalog.LLM_TOKEN_ESTIMATE_ERROR_RATIO
    assert gw.value(errors.count, intent="sql", kind="prompt") == 1
    assert gw.value(errors.count, intent="sql", kind="total") == 1


def test_overflow_downgrades_to_the_lighter_model(
    sim: ServerThread, start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    gw = start_gateway({"primary": sim.url}, quotas_file=quotas_file(tmp_path))
    first = ask(gw, SUMMARY)
    assert first.status_code == 200 and first.json()["model"] == "redline-base"
    second = ask(gw, SUMMARY)  # ~230 tokens each: the 300-token bucket is empty now
    assert second.status_code == 200, second.text
    assert second.json()["model"] == "redline-small"
    assert quota_requests(gw, "acme", "summarise", "downgraded") == 1
    tokens = catalog.LLM_QUOTA_TOKENS_TOTAL.name
    assert gw.value(tokens, tenant="acme", intent="summarise", outcome="downgraded") > 200


@pytest.mark.parametrize("action", ["fail_open", "fail_closed"])
def test_redis_down_fails_open_or_closed(
    action: str,
    sim: ServerThread,
    start_gateway: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    dead = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    gw = start_gateway(
        {"primary": sim.url},
        quotas_file=quotas_file(tmp_path, on_store_error=action),
        redis_url=dead,
    )
    response = ask(gw, SQL)
    failures = catalog.LLM_QUOTA_STORE_FAILURES_TOTAL.name
    assert gw.value(failures, action=action) == 1
    if action == "fail_open":
        assert response.status_code == 200
        assert quota_requests(gw, "acme", "sql", "admitted") == 1
    else:
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert "quota store" in response.json()["error"]["message"]
    # Unlimited requests never ask Redis.
    assert ask(gw, CHAT).status_code == 200
    assert gw.value(failures, action=action) == 1
