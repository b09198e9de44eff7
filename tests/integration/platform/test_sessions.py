"""Session writer, CDC stream and replica consumer on a real redis-server."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from typer.testing import CliRunner

from redline.cli import app
from redline.platform.session_replica import ReplicaConsumer
from redline.platform.sessions import (
    DEFAULT_GROUP,
    DEFAULT_STREAM,
    DEFAULT_WRITTEN_KEY,
    CdcTargetError,
    SessionWriter,
    measure_cdc_rpo,
    open_redis,
    stream_id_ms,
    trim_acknowledged,
)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll until `condition` holds; fail the test naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture()
def stores(redis_url: str) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """Primary (db 0) and replica (db 1) clients on the shared redis-server."""
    primary = open_redis(redis_url)
    replica = open_redis(redis_url.rsplit("/", 1)[0] + "/1")
    yield primary, replica
    primary.close()
    replica.close()


def test_write_is_atomic_with_its_cdc_entry_and_replica_gets_the_same_expiry(
    stores: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = stores
    writer = SessionWriter(primary, ttl_seconds=30)
    consumer = ReplicaConsumer(primary, replica)
    consumer.ensure_group()
    entry_id = writer.write("alice", {"turns": ["hi"]})

    key = "session:ctx:alice"
    assert primary.get(key) == '{"turns": ["hi"]}'
    assert 29_000 < primary.pttl(key) <= 30_000
    ((got_id, fields),) = primary.xrange(DEFAULT_STREAM)
    assert got_id == entry_id
    assert fields == {
        "op": "set",
        "key": key,
        "session": "alice",
        "ttl_ms": "30000",
        "value": '{"turns": ["hi"]}',
    }
    assert primary.zscore(DEFAULT_WRITTEN_KEY, key) == stream_id_ms(entry_id)

    time.sleep(0.3)  # applied late, the replica must still expire with the primary
    assert consumer.step() == 1
    assert replica.get(key) == '{"turns": ["hi"]}'
    assert abs(replica.pexpiretime(key) - primary.pexpiretime(key)) == 0
    assert measure_cdc_rpo(primary, DEFAULT_STREAM, DEFAULT_GROUP).rpo_seconds == 0.0

    writer.write("alice", "second")
    writer.delete("bob")  # deleting a session that does not exist is a harmless change
    consumer.step()
    assert replica.get(key) == "second"
    writer.delete("alice")
    consumer.step()
    assert replica.exists(key) == 0
    assert primary.exists(key) == 0
    assert primary.zscore(DEFAULT_WRITTEN_KEY, key) is None
    assert consumer.stats.applied == 4
    assert primary.xpending(DEFAULT_STREAM, DEFAULT_GROUP)["pending"] == 0


def test_change_applied_after_its_ttl_ran_out_does_not_resurrect_the_key(
    stores: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = stores
    writer = SessionWriter(primary)
    consumer = ReplicaConsumer(primary, replica)
    consumer.ensure_group()
    writer.write("short", "ctx", ttl_seconds=0.2)
    writer.write("long", "ctx", ttl_seconds=60)
    time.sleep(0.4)
    assert consumer.step() == 2
    assert replica.exists("session:ctx:short") == 0
    assert replica.exists("session:ctx:long") == 1


def test_hold_leaves_entries_pending_and_resume_applies_them_in_order(
    stores: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = stores
    writer = SessionWriter(primary)
    consumer = ReplicaConsumer(primary, replica, block_ms=20)
    consumer.ensure_group()
    consumer.hold()
    for n in range(5):
        writer.write("s", f"v{n}")
    consumer.step()
    lag = measure_cdc_rpo(primary, DEFAULT_STREAM, DEFAULT_GROUP)
    assert lag.pending == 5
    assert lag.first_undelivered_id is None
    assert replica.exists("session:ctx:s") == 0

    consumer.pause()
    writer.write("s", "v5")
    consumer.step()
    lag = measure_cdc_rpo(primary, DEFAULT_STREAM, DEFAULT_GROUP)
    assert (lag.pending, lag.lag) == (5, 1)

    consumer.resume()
    assert consumer.step() == 6
    assert replica.get("session:ctx:s") == "v5"  # the last write wins: order was kept
    assert primary.xpending(DEFAULT_STREAM, DEFAULT_GROUP)["pending"] == 0


def test_restarted_consumer_reapplies_what_its_predecessor_read_but_never_acked(
    stores: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = stores
    writer = SessionWriter(primary)
    crashed = ReplicaConsumer(primary, replica, consumer="replica-a")
    crashed.ensure_group()
    crashed.hold()
    writer.write("x", "1")
    writer.write("y", "2")
    crashed.step()
    assert primary.xpending(DEFAULT_STREAM, DEFAULT_GROUP)["pending"] == 2

    restarted = ReplicaConsumer(primary, replica, consumer="replica-a")
    assert restarted.step() == 2
    assert (replica.get("session:ctx:x"), replica.get("session:ctx:y")) == ("1", "2")
    assert primary.xpending(DEFAULT_STREAM, DEFAULT_GROUP)["pending"] == 0


def test_malformed_entry_is_logged_and_acked_not_retried_forever(
    stores: tuple[redis.Redis, redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    primary, replica = stores
    consumer = ReplicaConsumer(primary, replica)
    consumer.ensure_group()
    bad = primary.xadd(DEFAULT_STREAM, {"op": "rename", "key": "session:ctx:z"})
    SessionWriter(primary).write("ok", "fine")
    with caplog.at_level(logging.ERROR):
        assert consumer.step() == 1
    assert f"CDC entry {bad}: unknown op 'rename' (allowed: set, del)" in caplog.text
    assert consumer.stats.skipped == 1
    assert replica.get("session:ctx:ok") == "fine"
    assert primary.xpending(DEFAULT_STREAM, DEFAULT_GROUP)["pending"] == 0


def test_trim_keeps_every_entry_some_group_still_needs(
    stores: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = stores
    writer = SessionWriter(primary)
    fast = ReplicaConsumer(primary, replica, batch_size=10)
    slow = ReplicaConsumer(primary, replica, group="audit", batch_size=2)
    fast.ensure_group()
    slow.ensure_group()
    ids = [writer.write(f"s{n}", "v") for n in range(5)]
    fast.step()
    slow.hold()
    slow.step()  # delivers ids[0:2] to the slow group, unacked
    trim_acknowledged(primary, DEFAULT_STREAM)
    assert [entry_id for entry_id, _ in primary.xrange(DEFAULT_STREAM)] == ids

    slow.resume()
    slow.step()  # acks its 2 pending, then reads and acks 2 more: ids[4] is undelivered
    trim_acknowledged(primary, DEFAULT_STREAM)
    assert [entry_id for entry_id, _ in primary.xrange(DEFAULT_STREAM)] == ids[4:]
    assert measure_cdc_rpo(primary, DEFAULT_STREAM, "audit").first_undelivered_id == ids[4]


def test_missing_stream_or_group_is_a_clear_error(stores: tuple[redis.Redis, redis.Redis]) -> None:
    primary, _ = stores
    with pytest.raises(CdcTargetError, match="CDC stream 'nope' does not exist"):
        measure_cdc_rpo(primary, "nope", DEFAULT_GROUP)
    ReplicaConsumer(primary, primary).ensure_group()
    with pytest.raises(
        CdcTargetError,
        match=r"consumer group 'other' does not exist on CDC stream 'session:cdc' "
        r"\(groups: session-replica\)",
    ):
        measure_cdc_rpo(primary, DEFAULT_STREAM, "other")


def test_cli_replica_applies_demo_writer_traffic_and_stops_on_sigterm(redis_url: str) -> None:
    replica_url = redis_url.rsplit("/", 1)[0] + "/1"
    consumer = subprocess.Popen(
        [sys.executable, "-c", "from redline.cli import main; main()", "sessions", "replica",
         "--redis-url", redis_url, "--replica-url", replica_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "REDLINE_LOG_LEVEL": "warning"},
    )  # fmt: skip
    runner = CliRunner()
    primary = open_redis(redis_url)
    replica = open_redis(replica_url)
    try:
        written = runner.invoke(
            app,
            ["sessions", "writer", "--redis-url", redis_url, "--sessions", "3",
             "--rate", "50", "--duration", "0.3", "--ttl-seconds", "60"],
        )  # fmt: skip
        assert written.exit_code == 0, written.output
        assert "wrote " in written.stdout

        def caught_up() -> bool:
            try:
                lag = measure_cdc_rpo(primary, DEFAULT_STREAM, DEFAULT_GROUP)
            except CdcTargetError:
                return False  # the consumer has not created its group yet
            return lag.rpo_seconds == 0 and lag.last_delivered_id != "0-0"

        wait_for(caught_up, timeout=20, what="the CLI consumer to ACK everything")
        for n in range(3):
            key = f"session:ctx:demo-{n:04d}"
            assert replica.get(key) == primary.get(key) is not None
        assert 20 < replica.pttl("session:ctx:demo-0000") <= 60_000

        status = runner.invoke(app, ["sessions", "status", "--redis-url", redis_url])
        assert status.exit_code == 0, status.output
        assert "session:cdc session-replica: rpo 0.000 s, pending 0" in status.stdout
        missing = runner.invoke(
            app, ["sessions", "status", "--redis-url", redis_url, "--group", "nogroup"]
        )
        assert missing.exit_code == 2
        assert "consumer group 'nogroup' does not exist" in missing.stderr
    finally:
        primary.close()
        replica.close()
        consumer.send_signal(signal.SIGTERM)
        out, errors = consumer.communicate(timeout=20)
    assert consumer.returncode == 0, errors
    assert b"session replica stopped: applied" in out
