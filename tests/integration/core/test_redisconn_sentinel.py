"""The connection factory against a real primary, replica and three Sentinels: the start-up
check, WAIT, and a client that follows a SIGKILL'd primary to the promoted replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redline.core.redisconn import (
    RedisConfigError,
    ReplicaAckError,
    async_durable_execute,
    async_wait_for_replicas,
    check_redis,
    durable_execute,
    open_async_redis,
    open_redis,
    wait_for_replicas,
)
from redline.devstack.processes import (
    Service,
    free_port,
    start_redis,
    start_redis_replica,
    start_sentinel,
)

MASTER = "itmaster"


@pytest.fixture
def sentinel_stack(tmp_path: Path) -> Iterator[tuple[str, list[Service]]]:
    """(URL, [primary, replica, sentinels...]) on loopback; stopped afterwards."""
    services: list[Service] = []
    try:
        primary = start_redis(tmp_path / "primary")
        services.append(primary)
        address = (primary.host, primary.port)
        services.append(start_redis_replica(tmp_path / "replica", address))
        for i in range(3):
            services.append(start_sentinel(tmp_path / f"sentinel-{i}", MASTER, address))
        hosts = ",".join(f"{s.host}:{s.port}" for s in services[2:])
        yield f"redis+sentinel://{hosts}/{MASTER}/0", services
    finally:
        for service in reversed(services):
            service.stop()


def test_check_redis_accepts_the_stack_and_names_what_is_wrong(
    sentinel_stack: tuple[str, list[Service]],
) -> None:
    url, _ = sentinel_stack
    check_redis(url)
    with pytest.raises(RedisConfigError, match=r"gateway\.redis_url: .*unknown master name 'nope'"):
        check_redis(url.replace(f"/{MASTER}/", "/nope/"), "gateway.redis_url")
    dead = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/{MASTER}/0"
    with pytest.raises(RedisConfigError, match="no sentinel reachable"):
        check_redis(dead)


def test_wait_counts_the_replica_and_fails_when_more_are_required(
    sentinel_stack: tuple[str, list[Service]],
) -> None:
    url, _ = sentinel_stack
    client = open_redis(url, decode_responses=True)
    client.set("k", "v")
    assert wait_for_replicas(client, 1, 2000) == 1
    assert durable_execute(client.pipeline(transaction=False).set("a", "1"), 1, 2000) == [True]
    with pytest.raises(ValueError, match="transaction=False"):
        durable_execute(client.pipeline().set("t", "1"), 1, 200)
    with pytest.raises(ReplicaAckError, match="only 1 of 2 replica"):
        durable_execute(client.pipeline(transaction=False).set("b", "1"), 2, 200)

    async def acked() -> list[object]:
        aclient = open_async_redis(url)
        try:
            pipe = aclient.pipeline(transaction=False).set("c", "1")
            return await async_durable_execute(pipe, 1, 2000)
        finally:
            await aclient.aclose()

    assert asyncio.run(acked()) == [True]

    async def fenced() -> int:
        aclient = open_async_redis(url)
        try:
            await aclient.set("d", "1")
            return await async_wait_for_replicas(aclient, 1, 2000)
        finally:
            await aclient.aclose()

    assert asyncio.run(fenced()) == 1
    with pytest.raises(ReplicaAckError):
        wait_for_replicas(client, 3, 100)
    client.close()


def test_a_client_follows_the_primary_after_sigkill(
    sentinel_stack: tuple[str, list[Service]],
) -> None:
    url, services = sentinel_stack
    primary, replica = services[0], services[1]
    client = open_redis(url, decode_responses=True, socket_timeout=1.0)
    client.set("before", "1")
    assert wait_for_replicas(client, 1, 2000) == 1
    primary.kill()
    deadline = time.monotonic() + 30.0
    failures = 0
    while True:
        try:
            client.set("after", "1")
            break
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            failures += 1
            assert time.monotonic() < deadline, "no primary after 30 s"
            time.sleep(0.2)
    assert failures > 0  # the write really waited for the failover
    client.close()
    node = redis.Redis(replica.host, replica.port, decode_responses=True)
    try:
        assert node.info("replication")["role"] == "master"
        assert node.get("before") == "1" and node.get("after") == "1"
    finally:
        node.close()
