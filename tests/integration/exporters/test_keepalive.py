"""Context keep-alive probe on a real redis-server: canaries, effective TTL, early losses."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redline.devstack.processes import start_redis
from redline.exporters.keepalive import KeepaliveProbe, KeepaliveSettings
from redline.exporters.probe import ProbeCache
from redline.platform.session_replica import ReplicaConsumer
from redline.platform.sessions import (
    DEFAULT_WRITTEN_KEY,
    SessionWriter,
    open_redis,
)
from redline.slo import catalog
from redline.slo.load import load_spec

pytestmark = pytest.mark.integration

MIN_SECONDS = 1.0
CANARIES = "session:keepalive:canaries"


def wait_for(condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll until `condition` holds; fail the test naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def value(cache: ProbeCache, name: str, **labels: str) -> float | None:
    """One series' value in the cache's exposition, None when absent."""
    registry = CollectorRegistry()
    registry.register(cache)
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def replica_of(url: str) -> str:
    """The same server's db 1."""
    return url.rsplit("/", 1)[0] + "/1"


@pytest.fixture()
def replicated(redis_url: str) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """Primary and replica clients with a running replica consumer between them."""
    primary = open_redis(redis_url)
    replica = open_redis(replica_of(redis_url))
    consumer = ReplicaConsumer(primary, replica, block_ms=20)
    consumer.ensure_group()
    consumer.start()
    yield primary, replica
    consumer.stop()
    primary.close()
    replica.close()


@pytest.fixture()
def probe(redis_url: str) -> Iterator[KeepaliveProbe]:
    """A keep-alive probe with a 30 s TTL and a 1 s minimum."""
    made = KeepaliveProbe(
        redis_url,
        replica_of(redis_url),
        ttl_seconds=30,
        min_seconds=MIN_SECONDS,
        interval_seconds=0.2,
    )
    yield made
    made.close()


def canary_keys(primary: redis.Redis) -> list[str]:
    """Canary keys still waiting to be checked."""
    return [str(key) for key in primary.zrange(CANARIES, 0, -1)]


def test_live_canary_reports_success_and_the_configured_ttl(
    replicated: tuple[redis.Redis, redis.Redis], probe: KeepaliveProbe
) -> None:
    primary, replica = replicated
    cache = ProbeCache([probe])
    cache.run(probe.name)
    assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_keepalive") == 1.0
    assert (
        value(cache, catalog.SESSION_KEEPALIVE_PROBE_SUCCESS.name) is None
    )  # no canary old enough yet
    assert value(cache, catalog.SESSION_CONTEXT_TTL_SECONDS.name) == pytest.approx(30.0, abs=0.01)
    assert value(cache, catalog.SESSION_CONTEXT_EVICTED_TOTAL.name) == 0.0
    (first,) = canary_keys(primary)
    wait_for(lambda: replica.exists(first) == 1, what="the canary to reach the replica")

    time.sleep(MIN_SECONDS)
    cache.run(probe.name)
    assert value(cache, catalog.SESSION_KEEPALIVE_PROBE_SUCCESS.name) == 1.0
    assert first not in canary_keys(primary)  # checked once, then removed on both sides
    assert len(canary_keys(primary)) == 1
    assert primary.exists(first) == 0
    wait_for(lambda: replica.exists(first) == 0, what="the canary's deletion to replicate")


@pytest.mark.parametrize("side", ["primary", "replica"])
def test_canary_lost_on_either_side_reports_failure(
    replicated: tuple[redis.Redis, redis.Redis], probe: KeepaliveProbe, side: str
) -> None:
    primary, replica = replicated
    cache = ProbeCache([probe])
    cache.run(probe.name)
    (canary,) = canary_keys(primary)
    wait_for(lambda: replica.exists(canary) == 1, what="the canary to reach the replica")
    (primary if side == "primary" else replica).delete(canary)
    time.sleep(MIN_SECONDS)
    cache.run(probe.name)
    assert value(cache, catalog.SESSION_KEEPALIVE_PROBE_SUCCESS.name) == 0.0
    assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_keepalive") == 1.0

    (second,) = canary_keys(primary)  # the next canary is left intact
    wait_for(lambda: replica.exists(second) == 1, what="the second canary to reach the replica")
    time.sleep(MIN_SECONDS)
    cache.run(probe.name)
    assert value(cache, catalog.SESSION_KEEPALIVE_PROBE_SUCCESS.name) == 1.0


def test_keys_expiring_before_min_seconds_are_counted_and_others_are_not(
    redis_url: str, replicated: tuple[redis.Redis, redis.Redis], probe: KeepaliveProbe
) -> None:
    primary, _ = replicated
    probe.start()
    assert probe.wait_listening(5)
    status = probe.notifications
    assert status is not None and status.enabled
    writer = SessionWriter(primary, ttl_seconds=60)
    writer.write("too-short", "ctx", ttl_seconds=0.3)  # lost at 0.3 s < 1 s
    writer.write("just-long-enough", "ctx", ttl_seconds=1.3)  # lives past the minimum
    writer.write("long-lived", "ctx")
    writer.write("ended", "ctx", ttl_seconds=0.5)
    writer.delete("ended")  # an ended session is not a loss
    primary.set("other:key", "x", px=300)  # not a session key

    def judged(session_id: str) -> Callable[[], bool]:
        key = f"session:ctx:{session_id}"
        return lambda: primary.exists(key) == 0 and primary.zscore(DEFAULT_WRITTEN_KEY, key) is None

    wait_for(judged("too-short"), what="the short key to expire and be judged")
    wait_for(judged("just-long-enough"), what="the 1.3 s key to expire and be judged")
    assert primary.exists("session:ctx:long-lived") == 1
    assert probe.evicted_total == 1
    cache = ProbeCache([probe])
    cache.run(probe.name)
    assert value(cache, catalog.SESSION_CONTEXT_EVICTED_TOTAL.name) == 1.0
    # The effective TTL is the shortest among recent writes: nothing shorter than 30 s is left.
    assert value(cache, catalog.SESSION_CONTEXT_TTL_SECONDS.name) == pytest.approx(30.0, abs=0.05)

    writer.write("short-again", "ctx", ttl_seconds=5)
    cache.run(probe.name)
    assert value(cache, catalog.SESSION_CONTEXT_TTL_SECONDS.name) == pytest.approx(5.0, abs=0.05)


def test_settings_take_the_minimum_from_the_spec_unless_overridden(redis_url: str) -> None:
    spec = load_spec(None).spec
    probe = KeepaliveProbe.from_settings(KeepaliveSettings(), redis_url, spec)
    assert probe.min_seconds == spec.red_lines.context_keepalive.min_seconds == 300
    assert probe.redis_url == redis_url and probe.replica_url is None
    probe.close()
    settings = KeepaliveSettings.model_validate({"min_seconds": 2, "replica_url": "redis://r/1"})
    probe = KeepaliveProbe.from_settings(settings, redis_url, spec)
    assert (probe.min_seconds, probe.replica_url) == (2, "redis://r/1")
    probe.close()


def test_missing_notification_flags_are_reported_when_config_set_is_not_allowed(
    tmp_path: Path,
) -> None:
    service = start_redis(tmp_path / "redis")
    admin = redis.Redis.from_url(service.extra["url"])
    admin.config_set("notify-keyspace-events", "Exg")  # no `e`: evictions would go unseen
    admin.close()
    probe = KeepaliveProbe(
        service.extra["url"], ttl_seconds=30, min_seconds=1, configure_notifications=False
    )
    try:
        probe.start()
        assert probe.wait_listening(5)
        status = probe.notifications
        assert status is not None and not status.enabled
        assert "lacks e" in status.message and "redis.conf" in status.message
    finally:
        probe.close()
        service.stop()


def test_eviction_is_counted_redis_down_fails_fast_and_everything_recovers(
    tmp_path: Path,
) -> None:
    service = start_redis(tmp_path / "redis")
    url = service.extra["url"]
    restarted = None
    consumer_source = open_redis(url)
    consumer_target = open_redis(replica_of(url))
    consumer = ReplicaConsumer(consumer_source, consumer_target, block_ms=20)
    consumer.ensure_group()
    consumer.start()
    probe = KeepaliveProbe(
        url, replica_of(url), ttl_seconds=30, min_seconds=MIN_SECONDS, timeout_seconds=0.5
    )
    cache = ProbeCache([probe])
    try:
        cache.run(probe.name)
        written_at = time.monotonic()
        assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_keepalive") == 1.0
        (canary,) = canary_keys(consumer_source)
        wait_for(lambda: consumer_target.exists(canary) == 1, what="the canary to replicate")

        service.stop()
        started = time.monotonic()
        cache.run(probe.name)
        assert time.monotonic() - started < 1.5
        assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_keepalive") == 0.0
        assert (
            value(cache, catalog.SESSION_CONTEXT_EVICTED_TOTAL.name) == 0.0
        )  # counters survive failures
        assert value(cache, catalog.SESSION_CONTEXT_TTL_SECONDS.name) is None

        restarted = start_redis(tmp_path / "redis", port=service.port)
        time.sleep(max(0.0, written_at + MIN_SECONDS - time.monotonic()))
        cache.run(probe.name)
        assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_keepalive") == 1.0
        # The first canary came back with the AOF and is old enough now: checked on both sides.
        assert value(cache, catalog.SESSION_KEEPALIVE_PROBE_SUCCESS.name) == 1.0

        # The listener reconnected by itself and re-enabled `e` on the fresh server.
        client = open_redis(url)
        try:
            wait_for(
                lambda: (
                    "e" in client.config_get("notify-keyspace-events")["notify-keyspace-events"]
                    and probe.wait_listening(0)
                ),
                what="the loss listener to reconnect",
            )
            consumer.pause()  # keep the victim off the replica (db 1 of the same server)
            writer = SessionWriter(client, ttl_seconds=20)
            writer.write("victim", "x" * 200_000)  # the shortest TTL: volatile-ttl evicts it first
            client.config_set("maxmemory-policy", "volatile-ttl")
            client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 10_000)
            client.ping()
            client.config_set("maxmemory", 0)
            assert client.exists("session:ctx:victim") == 0
        finally:
            client.close()
        wait_for(lambda: probe.evicted_total == 1, what="the eviction to be counted")
        cache.run(probe.name)
        assert value(cache, catalog.SESSION_CONTEXT_EVICTED_TOTAL.name) == 1.0
    finally:
        probe.close()
        consumer.stop()
        consumer_source.close()
        consumer_target.close()
        service.stop()
        if restarted is not None:
            restarted.stop()
