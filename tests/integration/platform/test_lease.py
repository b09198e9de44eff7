"""The Redis lease against a real redis-server: one holder at a time, only the owner renews or
releases, and a contender takes over once the holder stops renewing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redline.core.redisconn import ReplicaAckError
from redline.devstack.processes import start_redis, start_redis_replica
from redline.platform.lease import LeaseKeeper, RedisLease

pytestmark = pytest.mark.integration

KEY = "test:lease"


@pytest.fixture()
def clients(redis_url: str) -> Iterator[list[redis.Redis]]:
    made = [redis.Redis.from_url(redis_url) for _ in range(3)]
    yield made
    for client in made:
        client.close()


def test_one_holder_and_only_the_owner_renews_or_releases(clients: list[redis.Redis]) -> None:
    a = RedisLease(clients[0], KEY, "a", 5.0)
    b = RedisLease(clients[1], KEY, "b", 5.0)
    assert a.acquire() and a.held
    assert not b.acquire() and not b.held
    assert b.holder() == "a"
    assert not b.renew() and not b.release()  # b does not own it: nothing changes
    assert clients[2].get(KEY) == b"a"
    assert a.renew() and a.held
    assert 4000 < int(clients[2].pttl(KEY)) <= 5000
    assert a.release() and not a.held
    assert clients[2].get(KEY) is None
    assert b.acquire_or_renew() and b.holder() == "b"


def test_a_contender_takes_over_after_the_holder_stops_renewing(
    clients: list[redis.Redis],
) -> None:
    a = RedisLease(clients[0], KEY, "a", 0.5)
    b = RedisLease(clients[1], KEY, "b", 0.5)
    assert a.acquire()
    # The holder stops renewing (dead, paused): b polls until the key has expired in Redis.
    while not b.acquire():
        assert a.held or time.monotonic() >= a.valid_until
        time.sleep(0.01)
    taken_at = time.monotonic()
    # a had stopped believing it held the lease before b could take it.
    assert a.valid_until <= taken_at and not a.held
    assert b.held and b.holder() == "b"
    assert not a.renew() and not a.held  # a's late renewal fails: the key is b's now
    assert not a.release() and b.holder() == "b"


def test_two_keepers_never_both_hold_it_and_take_over_when_one_dies(
    clients: list[redis.Redis],
) -> None:
    keepers = [
        LeaseKeeper(RedisLease(client, KEY, name, 0.6), renew_every=0.1)
        for client, name in zip(clients[:2], ("a", "b"), strict=True)
    ]
    overlaps = 0
    samples = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal overlaps, samples
        while not stop.is_set():
            held = [keeper.held for keeper in keepers]
            samples += 1
            overlaps += all(held)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    for keeper in keepers:
        keeper.start()
    watcher.start()
    try:
        time.sleep(1.5)
        [holder] = [keeper for keeper in keepers if keeper.held]
        [other] = [keeper for keeper in keepers if keeper is not holder]
        assert holder.lease.holder() == holder.lease.owner
        # The holder dies without releasing: the other takes over within TTL + one renewal.
        holder.stop(release=False)
        died_at = time.monotonic()
        while not other.held:
            assert time.monotonic() - died_at < 0.6 + 0.1 + 0.3, "no takeover"
            time.sleep(0.005)
        took = time.monotonic() - died_at
        assert took > 0.3  # it waited for the key to expire, it did not steal it
        assert other.lease.holder() == other.lease.owner
        # The holder comes back: it does not get the lease while the other renews.
        holder.start()
        time.sleep(1.0)
        assert other.held and not holder.held
        # The other stops cleanly (releasing): the first takes over at its next attempt.
        other.stop(release=True)
        stopped_at = time.monotonic()
        while not holder.held:
            assert time.monotonic() - stopped_at < 0.5, "no takeover after a release"
            time.sleep(0.005)
    finally:
        stop.set()
        watcher.join(5)
        for keeper in keepers:
            keeper.stop()
    assert samples > 100
    assert overlaps == 0


def test_a_holder_that_cannot_reach_redis_loses_the_lease(tmp_path: Path) -> None:
    own = start_redis(tmp_path / "redis")
    client = redis.Redis.from_url(own.extra["url"], socket_timeout=0.2, socket_connect_timeout=0.2)
    keeper = LeaseKeeper(RedisLease(client, KEY, "a", 0.5), renew_every=0.1)
    try:
        keeper.start()
        assert keeper.held
        own.kill()  # Redis gone: renewals fail
        stopped_at = time.monotonic()
        while keeper.held:
            assert time.monotonic() - stopped_at < 0.5, "the lease outlived its TTL"
            time.sleep(0.01)
        assert keeper.last_error is not None
    finally:
        keeper.stop(release=False)
        client.close()
        own.stop()


def test_with_replica_acks_the_lease_is_held_only_for_what_the_replica_took(
    tmp_path: Path,
) -> None:
    """`min_replicas_ack`: the holder believes only an acquire or renewal its replica has (so a
    promoted replica keeps the holder's key); with too few replicas it never believes at all,
    and a renewal the replica stops taking does not extend the belief."""
    primary = start_redis(tmp_path / "primary")
    replica = start_redis_replica(tmp_path / "replica", (primary.host, primary.port))
    client = redis.Redis.from_url(primary.extra["url"])
    try:
        a = RedisLease(client, KEY, "a", 5.0, min_replicas_ack=1, ack_timeout_ms=2000)
        assert a.acquire() and a.held
        copy = redis.Redis.from_url(replica.extra["url"])
        assert copy.get(KEY) == b"a" and int(copy.pttl(KEY)) > 0  # the replica has the key
        copy.close()
        # Two replicas asked for, one there: the key is set on the primary, never believed.
        b = RedisLease(client, "test:lease-b", "b", 5.0, min_replicas_ack=2, ack_timeout_ms=100)
        with pytest.raises(ReplicaAckError):
            b.acquire()
        assert not b.held
        # The replica goes away: a's renewal reaches the primary, but its belief is not extended.
        before = a.valid_until
        replica.kill()
        with pytest.raises(ReplicaAckError):
            a.renew()
        assert a.valid_until == before
    finally:
        client.close()
        replica.stop()
        primary.stop()
