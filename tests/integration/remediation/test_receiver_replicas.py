"""Two receivers and two workers on one real Redis, fed by two real Alertmanagers — an HA pair
that gossips, or two that do not — each sending every notification to both receivers (two
webhook_configs): each alert arrives two to four times, yet exactly one job, one audit
`job.accepted`, one `job.started` and one playbook run exist per alert, and the audit chain
stays intact. (Gossip only makes the second Alertmanager usually skip what the first sent; the
receivers' idempotency keys are what guarantee one run.)"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from redline.devstack.processes import Service, free_port, start_alertmanager
from redline.remediation.audit import AuditLog
from redline.slo import catalog
from tests.support.remediation import (
    alertmanager_config_file,
    make_settings,
    receiver,
    store_for,
    wait_for,
    workers,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REGIONS = ("east", "west", "north", "south")


@pytest.fixture(params=["gossip", "no-gossip"])
def pair(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[list[Service], tuple[int, int]]]:
    """Two Alertmanagers with the same config (a gossiping HA pair, or two apart); yields them
    and the two receiver ports."""
    ports = (free_port(), free_port())
    config = alertmanager_config_file(tmp_path, ports)
    gossip = request.param == "gossip"
    cluster_ports = (free_port(), free_port())
    started: list[Service] = []
    try:
        for index, name in enumerate(("am1", "am2")):
            cluster: dict[str, Any] = {}
            if gossip:
                peer = f"127.0.0.1:{cluster_ports[1 - index]}"
                cluster = {"cluster_port": cluster_ports[index], "peers": [peer]}
            started.append(start_alertmanager(tmp_path / name, config, **cluster))
        if gossip:
            wait_for(
                lambda: all(_peers(s.url) == 2 for s in started),
                timeout=30,
                what="the two Alertmanagers to see each other",
            )
        yield started, ports
    finally:
        for service in started:
            service.stop()


def _alerts(starts_at: datetime) -> list[dict[str, Any]]:
    return [
        {
            "labels": {"alertname": "RedLineTest", "playbook": "counter", "region": region,
                       "severity": "critical"},
            "annotations": {"summary": f"red line broken in {region}"},
            "startsAt": starts_at.isoformat(),
            "endsAt": (starts_at + timedelta(hours=1)).isoformat(),
            "generatorURL": "http://127.0.0.1:9090/graph",
        }
        for region in REGIONS
    ]  # fmt: skip


def _peers(url: str) -> int:
    cluster = httpx.get(f"{url}/api/v2/status").json()["cluster"]
    return len(cluster.get("peers") or [])


def _sample(url: str, name: str, labels: str = "") -> float:
    prefix = f"{name}{labels} "
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_two_receivers_two_workers_run_each_alert_once(
    redis_url: str, pair: tuple[list[Service], tuple[int, int]]
) -> None:
    services, ports = pair
    settings = make_settings(redis_url)
    job_store, client = store_for(settings)
    starts_at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    alerts = len(REGIONS)
    try:
        with ExitStack() as stack:
            receivers = [stack.enter_context(receiver(settings, port=port)) for port in ports]
            stack.enter_context(workers(settings, 2))
            for service in services:
                answer = httpx.post(f"{service.url}/api/v2/alerts", json=_alerts(starts_at))
                assert answer.status_code == 200, answer.text

            def delivered() -> list[float] | None:
                # Each Alertmanager's webhook receiver sends to both receivers: every alert
                # reaches each receiver once or twice (twice when the pair did not dedupe).
                got = [
                    _sample(r.url, catalog.REDLINE_WEBHOOK_ALERTS_TOTAL.name, '{status="firing"}')
                    for r in receivers
                ]
                return got if all(n >= alerts for n in got) else None

            wait_for(delivered, timeout=30, what="each alert at both receivers")
            # The second Alertmanager sends after its peer timeout, if at all: let it.
            time.sleep(3.0)
            deliveries = sum(
                _sample(r.url, catalog.REDLINE_WEBHOOK_ALERTS_TOTAL.name, '{status="firing"}')
                for r in receivers
            )
            jobs = wait_for(
                lambda: (
                    found
                    if len(found := job_store.list_jobs(limit=100)) == alerts
                    and all(job.status == "succeeded" for job in found)
                    else None
                ),
                timeout=30,
                what="one succeeded job per alert",
            )
            duplicates = sum(
                _sample(r.url, catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL.name) for r in receivers
            )
        assert 2 * alerts <= deliveries <= 4 * alerts
        assert duplicates == deliveries - alerts  # every delivery but the first of each alert
        assert len(job_store.list_jobs(limit=100)) == alerts
        assert sorted(job.target for job in jobs) == sorted(f"region={r}" for r in REGIONS)
        assert [client.get(f"rt:runs:{job.id}") for job in jobs] == ["1"] * alerts
        assert client.get("rt:runs:total") == str(alerts)
        audit = AuditLog(client, settings.key_prefix)
        assert audit.verify().ok
        records = [json.loads(line) for line in audit.records()]
        accepted = Counter(r["data"]["fingerprint"] for r in records if r["kind"] == "job.accepted")
        started = Counter(r["job_id"] for r in records if r["kind"] == "job.started")
        assert sorted(accepted.values()) == [1] * alerts
        assert set(accepted) == {job.alert["fingerprint"] for job in jobs}
        assert sorted(started.values()) == [1] * alerts and set(started) == {j.id for j in jobs}
    finally:
        client.close()
