"""`session_cdc_rpo_seconds` measured on a real redis-server and read back from the exposition."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redline.devstack.processes import find_binary, start_redis
from redline.exporters.probe import ProbeCache
from redline.exporters.session_rpo import SessionRpoProbe, SessionRpoSettings
from redline.platform.session_replica import ReplicaConsumer
from redline.platform.sessions import (
    DEFAULT_GROUP,
    DEFAULT_STREAM,
    CdcTargetError,
    SessionWriter,
    measure_cdc_rpo,
    open_redis,
    server_time_ms,
    stream_id_ms,
)
from redline.slo import catalog

pytestmark = pytest.mark.integration

TARGET = {"stream": DEFAULT_STREAM, "group": DEFAULT_GROUP}


def wait_for(condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll until `condition` holds; fail the test naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def scrape(cache: ProbeCache) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """The cache's exposition text and its samples keyed by (name, labels)."""
    registry = CollectorRegistry()
    registry.register(cache)
    text = generate_latest(registry).decode()
    values = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return text, values


def value(cache: ProbeCache, name: str, **labels: str) -> float | None:
    """One series' value in the exposition, None when absent."""
    return scrape(cache)[1].get((name, frozenset(labels.items())))


def age_bracket(
    client: redis.Redis, entry_id: str, measure: Callable[[], float | None]
) -> tuple[float, float, float]:
    """(age before, measured, age after) of `entry_id` on Redis's clock, around `measure()`.

    A loaded machine may stall between two calls; bracketing keeps the check exact anyway.
    """
    written = stream_id_ms(entry_id)
    before = (server_time_ms(client) - written) / 1000
    measured = measure()
    after = (server_time_ms(client) - written) / 1000
    assert measured is not None
    return before - 0.001, measured, after + 0.001  # ids and TIME are both whole milliseconds


def rpo_of(cache: ProbeCache, name: str) -> Callable[[], float | None]:
    """Run the probe through the cache, then read the RPO from the exposition."""

    def measure() -> float | None:
        cache.run(name)
        return value(cache, catalog.SESSION_CDC_RPO_SECONDS.name, **TARGET)

    return measure


@pytest.fixture()
def cdc(redis_url: str) -> Iterator[tuple[redis.Redis, SessionWriter, ReplicaConsumer]]:
    """A primary client, a writer and a (not started) replica consumer into db 1."""
    primary = open_redis(redis_url)
    replica = open_redis(redis_url.rsplit("/", 1)[0] + "/1")
    consumer = ReplicaConsumer(primary, replica, block_ms=20)
    consumer.ensure_group()
    yield primary, SessionWriter(primary, ttl_seconds=60), consumer
    consumer.stop()
    primary.close()
    replica.close()


def test_rpo_grows_with_wall_time_while_the_consumer_stops_acking_then_drops_to_zero(
    redis_url: str, cdc: tuple[redis.Redis, SessionWriter, ReplicaConsumer]
) -> None:
    primary, writer, consumer = cdc
    probe = SessionRpoProbe(redis_url, interval_seconds=0.1)
    cache = ProbeCache([probe])
    consumer.start()
    writer.write("a", "1")
    wait_for(lambda: consumer.stats.acked == 1, what="the first change to be ACKed")
    cache.run(probe.name)
    assert value(cache, catalog.SESSION_CDC_RPO_SECONDS.name, **TARGET) == 0.0

    consumer.hold()  # returns once the loop runs in the new mode: nothing more is ACKed
    entry_id = writer.write("a", "2")
    wait_for(
        lambda: measure_cdc_rpo(primary, DEFAULT_STREAM, DEFAULT_GROUP).pending == 1,
        what="the change to be delivered and left pending",
    )
    started = time.monotonic()
    low1, first, high1 = age_bracket(primary, entry_id, rpo_of(cache, probe.name))
    first_done = time.monotonic()
    time.sleep(1.2)
    second_started = time.monotonic()
    low2, second, high2 = age_bracket(primary, entry_id, rpo_of(cache, probe.name))
    ended = time.monotonic()
    assert low1 <= first <= high1 and low2 <= second <= high2
    # The growth between the two samples is the wall time between them.
    assert second_started - first_done - 0.002 <= second - first <= ended - started + 0.002
    assert second >= 1.2

    consumer.resume()
    wait_for(lambda: consumer.stats.acked == 2, what="the held change to be ACKed")
    cache.run(probe.name)
    assert value(cache, catalog.SESSION_CDC_RPO_SECONDS.name, **TARGET) == 0.0
    assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_rpo") == 1.0
    probe.close()


def test_undelivered_entries_count_and_the_oldest_unacked_entry_wins(
    redis_url: str, cdc: tuple[redis.Redis, SessionWriter, ReplicaConsumer]
) -> None:
    primary, writer, _ = cdc
    probe = SessionRpoProbe(redis_url)
    ids = []
    for n in range(3):
        ids.append(writer.write(f"s{n}", "v"))
        time.sleep(0.3)

    def rpo() -> float:
        (sample,) = probe.run()
        assert sample.labels == TARGET
        return sample.value

    def rpo_is_age_of(entry_id: str) -> float:
        low, measured, high = age_bracket(primary, entry_id, rpo)
        assert low <= measured <= high
        return measured

    lag = measure_cdc_rpo(primary, DEFAULT_STREAM, DEFAULT_GROUP)
    assert (lag.pending, lag.lag, lag.first_undelivered_id) == (0, 3, ids[0])
    assert rpo_is_age_of(ids[0]) >= 0.9

    applier = ReplicaConsumer(primary, primary, batch_size=1, block_ms=1)
    applier.step()  # ids[0] applied and ACKed; ids[1] and ids[2] never read
    rpo_is_age_of(ids[1])

    applier.hold()
    applier.step()  # ids[1] delivered, left pending; ids[2] still undelivered
    lag = measure_cdc_rpo(primary, DEFAULT_STREAM, DEFAULT_GROUP)
    assert (lag.pending, lag.oldest_pending_id, lag.first_undelivered_id) == (1, ids[1], ids[2])
    rpo_is_age_of(ids[1])
    probe.close()


def test_every_configured_target_is_measured_and_missing_ones_fail_the_run_clearly(
    redis_url: str, cdc: tuple[redis.Redis, SessionWriter, ReplicaConsumer]
) -> None:
    primary, writer, _ = cdc
    ReplicaConsumer(primary, primary, group="audit").ensure_group()
    writer.write("s", "v")
    time.sleep(0.2)
    ReplicaConsumer(primary, primary, group="audit").step()
    settings = SessionRpoSettings.model_validate(
        {"targets": [TARGET, {"stream": DEFAULT_STREAM, "group": "audit"}]}
    )
    probe = SessionRpoProbe.from_settings(settings, redis_url)
    samples = {s.labels["group"]: s.value for s in probe.run()}
    assert samples["audit"] == 0.0
    assert samples[DEFAULT_GROUP] >= 0.2

    broken = SessionRpoProbe(
        redis_url, [(DEFAULT_STREAM, DEFAULT_GROUP), ("other:cdc", "g"), (DEFAULT_STREAM, "gone")]
    )
    with pytest.raises(CdcTargetError) as caught:
        broken.run()
    assert str(caught.value) == (
        "CDC stream 'other:cdc' does not exist; consumer group 'gone' does not exist on CDC "
        "stream 'session:cdc' (groups: audit, session-replica)"
    )
    cache = ProbeCache([broken])
    cache.run(broken.name)
    assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_rpo") == 0.0
    assert "'other:cdc' does not exist" in str(cache.status()["session_rpo"]["error"])
    probe.close()
    broken.close()


def test_redis_down_fails_fast_and_the_probe_recovers_after_restart(tmp_path: Path) -> None:
    service = start_redis(tmp_path / "redis")
    url = service.extra["url"]
    restarted = None
    probe = SessionRpoProbe(url, timeout_seconds=0.5)
    cache = ProbeCache([probe])
    try:
        client = open_redis(url)
        ReplicaConsumer(client, client).ensure_group()
        entry_id = SessionWriter(client).write("s", "v")
        client.close()
        cache.run(probe.name)
        text, values = scrape(cache)
        assert (
            values[(catalog.REDLINE_PROBE_SUCCESS.name, frozenset({("probe", "session_rpo")}))]
            == 1.0
        )
        promtool = subprocess.run(
            [find_binary("promtool"), "check", "metrics"], input=text.encode(), capture_output=True
        )
        assert promtool.returncode == 0, promtool.stdout + promtool.stderr

        service.stop()
        started = time.monotonic()
        cache.run(probe.name)
        assert time.monotonic() - started < 1.5
        assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_rpo") == 0.0
        assert (
            value(cache, catalog.SESSION_CDC_RPO_SECONDS.name, **TARGET) is None
        )  # unknown, not 0
        assert "ConnectionError" in str(cache.status()["session_rpo"]["error"])

        restarted = start_redis(tmp_path / "redis", port=service.port)
        check = open_redis(url)
        try:
            low, rpo, high = age_bracket(check, entry_id, rpo_of(cache, probe.name))
        finally:
            check.close()
        assert value(cache, catalog.REDLINE_PROBE_SUCCESS.name, probe="session_rpo") == 1.0
        assert low <= rpo <= high  # the AOF kept the stream and the group
    finally:
        probe.close()
        service.stop()
        if restarted is not None:
            restarted.stop()
