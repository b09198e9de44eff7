"""Every endpoint of the receiver while Redis is gone: a real Redis that was stopped, and Sentinels
whose primary was killed with nobody to promote (mid-failover). The routes that need Redis answer
503 with Retry-After, never 500 and never a 202; `/healthz` and `/metrics` keep answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from redline.slo import catalog
from tests.support.remediation import AUTH, alert, make_settings, payload, post, receiver
from tests.support.replicas import sentinels_without_primary, stopped_redis_url

pytestmark = pytest.mark.integration

JOB = "0" * 32


@pytest.fixture(params=["stopped", "sentinel-no-primary"])
def dead_redis_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "stopped":
        yield stopped_redis_url(tmp_path)
        return
    with sentinels_without_primary(tmp_path) as url:
        yield url


def test_every_route_that_needs_redis_answers_503_with_retry_after(dead_redis_url: str) -> None:
    settings = make_settings(dead_redis_url)
    with receiver(settings) as server:
        answers: dict[str, httpx.Response] = {
            "POST /alerts": post(server.url, payload(alert("deadbeef00000001"))),
            "GET /jobs": httpx.get(f"{server.url}/jobs", headers=AUTH, timeout=10),
            "GET /jobs/{id}": httpx.get(f"{server.url}/jobs/{JOB}", headers=AUTH, timeout=10),
            "GET /readyz": httpx.get(f"{server.url}/readyz", timeout=10),
        }
        for route, answer in answers.items():
            assert answer.status_code == 503, f"{route}: {answer.status_code} {answer.text}"
            assert answer.headers["Retry-After"] == "1", route
            assert answer.json()["message"], route
        # The probes that need no Redis keep answering; the scrape reports what it can.
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        scrape = httpx.get(f"{server.url}/metrics", timeout=10)
        assert scrape.status_code == 200
        assert catalog.REDLINE_WEBHOOK_ALERTS_TOTAL.name in scrape.text
        # Nothing a client can do to a receiver without Redis gets a 500.
        for _ in range(3):
            again = post(server.url, payload(alert("deadbeef00000002")))
            assert again.status_code == 503 and again.headers["Retry-After"] == "1"
