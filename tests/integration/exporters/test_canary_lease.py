"""Exporter replicas against one real Redis: the probes that write canaries run on the holder of
the canary lease only (the canaries in Redis are the holder's runs, never doubled), the other
replica skips them and publishes none of their series, and it takes over when the holder stops
(released: at once) or dies (SIGKILL: within the lease TTL plus one renewal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.processes import free_port
from redline.exporters.app import Exporter, build_exporter_app
from redline.exporters.keepalive import DEFAULT_CANARIES_KEY
from redline.exporters.settings import ExporterSettings
from redline.platform.sessions import DEFAULT_GROUP, DEFAULT_STREAM
from redline.slo import catalog
from redline.slo.load import load_spec

pytestmark = pytest.mark.integration

KEEPALIVE = "session_keepalive"
RPO = "session_rpo"
TTL = 1.0
RENEW = 0.2
LEASE = catalog.REDLINE_EXPORTER_CANARY_LEASE_HELD.name


def config(**lease: Any) -> dict[str, Any]:
    """Two probes: keep-alive (writes a canary session each run) and session RPO (reads)."""
    return {
        "models": {"enabled": False},
        "endpoints": {"enabled": False},
        "golden_set": {"enabled": False},
        "index_staleness": {"enabled": False},
        "drift": {"enabled": False},
        "session_rpo": {"interval_seconds": 0.2},
        # Canaries are only checked after an hour: each run adds one member to the canary ZSET.
        "keepalive": {"interval_seconds": 0.1, "min_seconds": 3600, "ttl_seconds": 7200},
        "canary_lease": {"ttl_seconds": TTL, "renew_seconds": RENEW, **lease},
    }


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def lease_held(url: str) -> float | None:
    return scrape(url).get((LEASE, ()))


def runs(exporter: Exporter, probe: str = KEEPALIVE, what: str = "runs") -> int:
    """Completed (or skipped) runs of a probe on one replica, from its cache."""
    return int(cast(int, exporter.cache.status()[probe][what]))


def published_probes(url: str) -> set[str]:
    """Probes with a `redline_probe_success` series on this replica."""
    return {
        dict(labels)["probe"]
        for (name, labels), _ in scrape(url).items()
        if name == catalog.REDLINE_PROBE_SUCCESS.name
    }


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    # The RPO probe's stream and group, so it succeeds on every replica.
    made.xgroup_create(DEFAULT_STREAM, DEFAULT_GROUP, id="$", mkstream=True)
    yield made
    made.close()


def serve(redis_url: str, **lease: Any) -> tuple[Exporter, ServerThread]:
    settings = ExporterSettings.model_validate({"redis_url": redis_url, **config(**lease)})
    exporter = build_exporter_app(settings, load_spec().spec)
    assert exporter.lease is not None
    return exporter, serve_in_thread(exporter.app)


def test_canaries_are_written_by_the_lease_holder_only_and_taken_over(
    redis_url: str, client: redis.Redis
) -> None:
    with ExitStack() as stack:
        replicas = [serve(redis_url) for _ in range(2)]
        for _, server in replicas:
            stack.callback(server.stop)
        urls = [server.url for _, server in replicas]
        wait_for(lambda: all(lease_held(u) is not None for u in urls), 10, "both replicas")
        held = [lease_held(u) or 0.0 for u in urls]
        assert sorted(held) == [0.0, 1.0], held
        index = held.index(1.0)
        (holder, holder_server), (other, other_server) = replicas[index], replicas[1 - index]
        wait_for(lambda: runs(holder) >= 5, 10, "holder canaries")
        # The other replica runs the reading probe but skips the canary probe: none of its series.
        status = other.cache.status()
        assert runs(other) == 0 and status[KEEPALIVE]["skipped"] is True
        assert runs(other, what="skipped_runs") > 0
        assert runs(other, RPO) > 0
        wait_for(lambda: RPO in published_probes(other_server.url), 5, "the other's RPO series")
        assert published_probes(other_server.url) == {RPO}
        other_names = {name for name, _ in scrape(other_server.url)}
        assert catalog.SESSION_CONTEXT_EVICTED_TOTAL.name not in other_names
        assert catalog.SESSION_CDC_RPO_SECONDS.name in other_names
        assert published_probes(holder_server.url) == {RPO, KEEPALIVE}
        health = httpx.get(f"{other_server.url}/healthz").json()
        assert health["status"] == "ok" and health["canary_lease"]["held"] is False
        assert health["probes_skipped"] == 1

        # The holder stops cleanly: it releases the lease; the other takes over at once.
        holder_server.stop()
        stopped_at = time.monotonic()
        wait_for(lambda: lease_held(other_server.url) == 1.0, TTL, "the takeover")
        took = time.monotonic() - stopped_at
        wait_for(lambda: runs(other) >= 5, 10, "the other's canaries")
        assert KEEPALIVE in published_probes(other_server.url)
        other_server.stop()
        counts = [runs(holder), runs(other)]
    canaries = int(client.zcard(DEFAULT_CANARIES_KEY))
    # Every canary in Redis is one run of whichever replica held the lease: never doubled.
    assert canaries == sum(counts), (canaries, counts)
    assert took < RENEW + 0.3, took
    assert client.get("redline:exporters:canary-lease") is None  # released by the last one


class ExporterProcess:
    """`redline exporters` in its own process (so it can be SIGKILLed), on a free port."""

    def __init__(self, workdir: Path, redis_url: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        path = workdir / "exporters.yaml"
        path.write_text(yaml.safe_dump({"redis_url": redis_url, **config()}))
        self.log = workdir / "exporters.log"
        argv = [sys.executable, "-m", "redline.cli", "exporters", "--port", str(self.port),
                "--config", str(path)]  # fmt: skip
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")},
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait(timeout=10)


def test_a_replica_takes_over_when_the_holder_is_killed(
    redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    first = ExporterProcess(tmp_path / "one", redis_url)
    try:
        wait_for(first.ready, 30, "the first exporter")
        wait_for(lambda: lease_held(first.url) == 1.0, 5, "the first to hold the lease")
        with ExitStack() as stack:
            second, server = serve(redis_url)
            stack.callback(server.stop)
            wait_for(lambda: lease_held(server.url) is not None, 10, "the second replica")
            time.sleep(3 * RENEW)
            assert lease_held(server.url) == 0.0 and lease_held(first.url) == 1.0
            assert runs(second) == 0
            before = int(client.zcard(DEFAULT_CANARIES_KEY))
            assert before > 0
            first.process.kill()  # SIGKILL: no release, the key expires by its TTL
            killed_at = time.monotonic()
            first.process.wait(timeout=10)
            wait_for(lambda: lease_held(server.url) == 1.0, TTL + RENEW + 1.0, "the takeover")
            took = time.monotonic() - killed_at
            wait_for(lambda: int(client.zcard(DEFAULT_CANARIES_KEY)) >= before + 5, 10,
                     "the new holder's canaries")  # fmt: skip
            assert runs(second) > 0
    finally:
        first.stop()
    # Not before the dead holder's lease could have expired, and within TTL plus one renewal.
    assert TTL * 0.5 < took < TTL + RENEW + 0.5, took
