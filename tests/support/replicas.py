"""Redis topologies for the durability and failover tests, all real redis-server processes on
loopback: a primary with a replica (`--replicaof`) that a test can stop and start again, a
Redis that was started and stopped (its port closed), and Sentinels whose primary was killed
(the state clients see in the middle of a failover)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis

from redline.devstack.processes import Service, start_redis, start_redis_replica, start_sentinel

MASTER = "durable"
"""The master name the Sentinels of these tests monitor."""


@dataclass
class Replicated:
    """A primary and (while it runs) its replica."""

    primary: Service
    workdir: Path
    replica: Service | None = None
    _starts: int = field(default=0, repr=False)

    @property
    def url(self) -> str:
        """The primary's URL."""
        return self.primary.extra["url"]

    def start_replica(self) -> Service:
        """Start a replica of the primary (a fresh data dir each time); wait for its sync."""
        self._starts += 1
        address = (self.primary.host, self.primary.port)
        self.replica = start_redis_replica(self.workdir / f"replica-{self._starts}", address)
        # WAIT counts a replica only once the primary has it `online` (its first ACK after the
        # sync), a moment after the replica itself reports its link up.
        client = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            deadline = time.monotonic() + 10.0
            while not any(
                isinstance(value, dict) and value.get("state") == "online"
                for value in client.info("replication").values()
            ):
                assert time.monotonic() < deadline, "the primary never saw its replica online"
                time.sleep(0.05)
        finally:
            client.close()
        return self.replica

    def stop_replica(self) -> None:
        """Stop the replica (SIGKILL: a replica refuses SIGTERM while it writes its first AOF)
        and wait until the primary no longer counts it."""
        assert self.replica is not None, "no replica running"
        self.replica.kill()
        self.replica = None
        client = redis.Redis.from_url(self.url)
        try:
            deadline = time.monotonic() + 10.0
            while int(client.info("replication")["connected_slaves"]) > 0:
                assert time.monotonic() < deadline, "the primary still counts a stopped replica"
                time.sleep(0.05)
        finally:
            client.close()


@contextmanager
def replicated_redis(workdir: Path) -> Iterator[Replicated]:
    """A primary and one synced replica; both stopped on exit."""
    pair = Replicated(start_redis(workdir / "primary"), workdir)
    try:
        client = redis.Redis.from_url(pair.url)
        # Diskless sync waits 5 s for more replicas by default; one is all there will be.
        client.config_set("repl-diskless-sync-delay", 0)
        client.close()
        pair.start_replica()
        yield pair
    finally:
        if pair.replica is not None:
            pair.replica.kill()
        pair.primary.stop()


def stopped_redis_url(workdir: Path) -> str:
    """The URL of a real Redis that ran and was stopped: every connection is refused."""
    service = start_redis(workdir / "stopped")
    url = service.extra["url"]
    service.stop()
    return url


@contextmanager
def sentinels_without_primary(workdir: Path) -> Iterator[str]:
    """A Sentinel URL whose primary was SIGKILLed and has no replica to promote: the Sentinels
    answer, the master they name is down (what clients see mid-failover). Stopped on exit."""
    services: list[Service] = []
    try:
        primary = start_redis(workdir / "primary")
        services.append(primary)
        address = (primary.host, primary.port)
        sentinels = [start_sentinel(workdir / f"sentinel-{i}", MASTER, address) for i in range(3)]
        services += sentinels
        primary.kill()
        # Wait until every Sentinel flags the primary down: redis-py then refuses it
        # (MasterNotFoundError) instead of connecting to a dead address.
        deadline = time.monotonic() + 15.0
        for sentinel in sentinels:
            client = redis.Redis(sentinel.host, sentinel.port, decode_responses=True)
            try:
                while not cast(dict[str, Any], client.sentinel_master(MASTER))["is_sdown"]:
                    assert time.monotonic() < deadline, "the Sentinels did not flag the primary"
                    time.sleep(0.1)
            finally:
                client.close()
        hosts = ",".join(f"{s.host}:{s.port}" for s in sentinels)
        yield f"redis+sentinel://{hosts}/{MASTER}/0"
    finally:
        for service in reversed(services):
            service.stop()
