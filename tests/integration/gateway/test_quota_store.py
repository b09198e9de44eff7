"""The quota gate's Redis path against real Redis: concurrent takes pipelined on the lean
connection each get their own reply, settlements are summed per bucket and flushed together,
a flushed script cache is reloaded, and a Redis that accepts but never answers fails open
within the timeout."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry

from redline.gateway.quotas import BUCKET_TTL_MS, QuotaGate, build_quota_gate
from redline.gateway.resp import RespConnection, lean_url
from redline.gateway.settings import GatewaySettings
from redline.slo import catalog
from redline.slo.spec import Quotas

pytestmark = pytest.mark.integration

SQL = "Write a SQL query that returns the top 10 orders by total amount last month."


def gate(tmp_path: Path, redis_url: str, **settings: Any) -> tuple[QuotaGate, CollectorRegistry]:
    path = tmp_path / "quotas.yaml"
    quotas = {
        "enabled": True,
        "tenants": {"header": "x-tenant"},
        "default_completion_tokens": 16,
        "limits": [{"intent": "sql", "tokens_per_minute": 6000, "burst": 10000}],
        "elastic": {"slope": 0.0},
    }
    path.write_text(yaml.safe_dump({"quotas": quotas}))
    gs = GatewaySettings(
        upstreams={"primary": "http://127.0.0.1:1"},
        redis_url=redis_url,
        quotas_file=path,
        **settings,
    )
    registry = CollectorRegistry()
    built = build_quota_gate(gs, Quotas(), registry)
    assert built is not None
    return built, registry


def body(text: str) -> dict[str, Any]:
    return {"model": "redline-base", "messages": [{"role": "user", "content": text}]}


def test_concurrent_takes_pipeline_and_settlements_flush_summed(
    tmp_path: Path, redis_url: str
) -> None:
    # A busy machine can take longer than the default 0.25 s to connect; a take that fails
    # open reserves nothing, and this test is about the pipeline, not the timeout.
    quota, registry = gate(tmp_path, redis_url, redis_timeout_seconds=10.0)
    assert quota.buckets.lean is not None  # a plain URL: the lean connection

    async def scenario() -> list[float]:
        tenants = [f"t{i % 3}" for i in range(30)]
        admissions = await asyncio.gather(
            *(quota.admit(body(SQL), {"x-tenant": t}, "redline-base") for t in tenants)
        )
        reserved = dict.fromkeys(set(tenants), 0)
        for tenant, admission in zip(tenants, admissions, strict=True):
            assert admission.ticket is not None and admission.refusal is None
            reserved[tenant] += admission.ticket.reserved
            quota.settle(admission.ticket, 200, 10, 5)  # far below the estimate: refunds
        assert len(quota._pending) == 3  # summed per bucket, nothing sent yet
        await quota.aclose()  # flushes what is pending
        return [float(reserved[t]) for t in ("t0", "t1", "t2")]

    reserved = asyncio.run(scenario())
    failures = catalog.LLM_QUOTA_STORE_FAILURES_TOTAL.name
    assert registry.get_sample_value(failures, {"action": "fail_open"}) == 0
    client = redis.Redis.from_url(redis_url)
    for index, tenant in enumerate(("t0", "t1", "t2")):
        level = float(client.hget(f"redline:quota:{{{tenant}}}:sql:*", "level") or 0)
        used = 10 * 15.0  # ten requests of 15 real tokens each stay charged
        assert 10000 - used - 1 <= level <= 10000, (tenant, level, reserved[index])
        refunded = registry.get_sample_value(
            catalog.LLM_QUOTA_REFUNDED_TOKENS_TOTAL.name, {"tenant": tenant, "intent": "sql"}
        )
        assert refunded == reserved[index] - used
    client.close()


def test_a_flushed_script_cache_is_reloaded(tmp_path: Path, redis_url: str) -> None:
    quota, registry = gate(tmp_path, redis_url)

    async def scenario() -> None:
        first = await quota.admit(body(SQL), {"x-tenant": "a"}, "redline-base")
        assert first.ticket is not None and first.ticket.key is not None
        redis.Redis.from_url(redis_url).script_flush()
        second = await quota.admit(body(SQL), {"x-tenant": "a"}, "redline-base")
        assert second.ticket is not None and second.ticket.key is not None
        await quota.aclose()

    asyncio.run(scenario())
    failures = catalog.LLM_QUOTA_STORE_FAILURES_TOTAL.name
    assert registry.get_sample_value(failures, {"action": "fail_open"}) == 0


def test_a_redis_that_never_answers_fails_open_within_the_timeout(tmp_path: Path) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does), never reads or answers
    url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    quota, registry = gate(tmp_path, url, redis_timeout_seconds=0.2)

    async def scenario() -> float:
        started = time.monotonic()
        admission = await quota.admit(body(SQL), {"x-tenant": "a"}, "redline-base")
        assert admission.refusal is None  # fail_open, the default
        quota.buckets.lean.close()  # type: ignore[union-attr]
        await quota.client.aclose()
        return time.monotonic() - started

    try:
        elapsed = asyncio.run(scenario())
    finally:
        silent.close()
    assert elapsed < 1.0
    failures = catalog.LLM_QUOTA_STORE_FAILURES_TOTAL.name
    assert registry.get_sample_value(failures, {"action": "fail_open"}) == 1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_lean_connection_matches_replies_in_order(redis_url: str, loop: str) -> None:
    """Under asyncio's own loop and under uvloop, which uvicorn picks when it is installed
    (`uvicorn[standard]`): its transports are not asyncio.Transport instances."""
    address = lean_url(redis_url)
    assert address is not None

    async def scenario() -> list[Any]:
        connection = RespConnection(address, 2.0)
        await connection.execute("SET", "k", "v", "PX", BUCKET_TTL_MS)
        replies = await asyncio.gather(
            *(connection.execute("ECHO", str(i)) for i in range(200)),
            connection.execute("GET", "k"),
        )
        connection.close()
        return replies

    if loop == "uvloop":
        import uvloop

        replies = uvloop.run(scenario())
    else:
        replies = asyncio.run(scenario())
    assert replies == [str(i).encode() for i in range(200)] + [b"v"]
