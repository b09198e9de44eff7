"""Two real Alertmanagers (HA pair, same generated config, no gossip) deliver to the receiver:
one job per alert, one playbook run each, and the resolution runs the resolve step once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from redline.devstack.processes import Service, free_port, start_alertmanager
from redline.remediation.jobs import JobStore
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

REGIONS = ("east", "west", "north")


@pytest.fixture()
def alertmanagers(tmp_path: Path) -> Iterator[tuple[list[Service], int]]:
    """Two Alertmanagers with the same config; yields them and the receiver port they call."""
    port = free_port()
    config = alertmanager_config_file(tmp_path, [port])
    started: list[Service] = []
    try:
        for name in ("am1", "am2"):
            started.append(start_alertmanager(tmp_path / name, config))
        yield started, port
    finally:
        for service in started:
            service.stop()


def _alerts(starts_at: datetime, ends_at: datetime) -> list[dict[str, Any]]:
    return [
        {
            "labels": {
                "alertname": "RedLineTest",
                "playbook": "counter",
                "region": region,
                "severity": "critical",
            },
            "annotations": {"summary": f"red line broken in {region}"},
            "startsAt": starts_at.isoformat(),
            "endsAt": ends_at.isoformat(),
            "generatorURL": "http://127.0.0.1:9090/graph",
        }
        for region in REGIONS
    ]


def _failed_notifications(service: Service) -> float:
    text = httpx.get(f"{service.url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("alertmanager_notification_requests_failed_total")
        and 'integration="webhook"' in line
    )


def _jobs(job_store: JobStore) -> list[Any]:
    return job_store.list_jobs(limit=100)


def test_ha_pair_delivers_each_alert_once_and_resolution_runs_resolve_once(
    redis_url: str, alertmanagers: tuple[list[Service], int]
) -> None:
    services, port = alertmanagers
    settings = make_settings(redis_url)
    job_store, client = store_for(settings)
    # Prometheus sends every Alertmanager the same alert with the same startsAt.
    starts_at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    try:
        with receiver(settings, port=port) as server, workers(settings, 2):
            for service in services:
                answer = httpx.post(
                    f"{service.url}/api/v2/alerts",
                    json=_alerts(starts_at, starts_at + timedelta(hours=1)),
                )
                assert answer.status_code == 200, answer.text

            def firing_done() -> bool:
                jobs = _jobs(job_store)
                return len(jobs) == 3 and all(job.status == "succeeded" for job in jobs)

            wait_for(firing_done, timeout=20, what="three firing jobs")
            # Both Alertmanagers delivered: the second delivery of each alert is a duplicate.
            wait_for(
                lambda: (
                    f"{catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL} 3.0"
                    in httpx.get(f"{server.url}/metrics").text
                ),
                timeout=20,
                what="the second Alertmanager's deliveries",
            )
            firing = _jobs(job_store)
            assert sorted(job.target for job in firing) == [f"region={r}" for r in sorted(REGIONS)]
            assert [client.get(f"rt:runs:{job.id}") for job in firing] == ["1", "1", "1"]

            ended = datetime.now(UTC)
            for service in services:
                answer = httpx.post(f"{service.url}/api/v2/alerts", json=_alerts(starts_at, ended))
                assert answer.status_code == 200, answer.text

            def resolved_done() -> list[Any]:
                jobs = [j for j in _jobs(job_store) if j.alert["status"] == "resolved"]
                done = len(jobs) == 3 and all(job.status == "succeeded" for job in jobs)
                return jobs if done else []

            resolved = wait_for(resolved_done, timeout=20, what="three resolve jobs")
            wait_for(
                lambda: (
                    f"{catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL} 6.0"
                    in httpx.get(f"{server.url}/metrics").text
                ),
                timeout=20,
                what="the second Alertmanager's resolved deliveries",
            )
            metrics = httpx.get(f"{server.url}/metrics").text
        fingerprints = {job.alert["fingerprint"] for job in firing}
        assert {job.alert["fingerprint"] for job in resolved} == fingerprints
        assert [client.get(f"rt:resolves:{fp}") for fp in sorted(fingerprints)] == ["1"] * 3
        for region in REGIONS:
            assert client.get(f"rt:state:region={region}") == "resolved-after-succeeded"
        for job in resolved:
            steps = job_store.get(job.id).steps  # type: ignore[union-attr]
            assert [step["phase"] for step in steps] == ["plan", "resolve"]
        assert len(_jobs(job_store)) == 6
        alerts = catalog.REDLINE_WEBHOOK_ALERTS_TOTAL
        assert f'{alerts}{{status="firing"}} 6.0' in metrics
        assert f'{alerts}{{status="resolved"}} 6.0' in metrics
    finally:
        client.close()


def test_alertmanager_retries_after_the_receiver_comes_back(
    redis_url: str, alertmanagers: tuple[list[Service], int]
) -> None:
    services, port = alertmanagers
    settings = make_settings(redis_url)
    job_store, client = store_for(settings)
    starts_at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    try:
        # Nothing listens yet: the first notifications fail and Alertmanager retries them.
        answer = httpx.post(
            f"{services[0].url}/api/v2/alerts",
            json=_alerts(starts_at, starts_at + timedelta(hours=1))[:1],
        )
        assert answer.status_code == 200
        wait_for(
            lambda: _failed_notifications(services[0]) > 0,
            timeout=15,
            what="a failed notification attempt",
        )
        with receiver(settings, port=port), workers(settings):
            wait_for(
                lambda: [j for j in _jobs(job_store) if j.status == "succeeded"],
                timeout=25,
                what="the retried delivery to run its job",
            )
        jobs = _jobs(job_store)
        assert len(jobs) == 1 and client.get(f"rt:runs:{jobs[0].id}") == "1"
    finally:
        client.close()
