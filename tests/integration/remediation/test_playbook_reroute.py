"""`reroute` with two simulated regions behind the real gateway, the routing store in a real
Redis, and the real receiver and worker; faults injected through the simulators' admin API."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from redline.platform.routing import RoutingStore
from redline.remediation.settings import RemediationSettings
from tests.support.playbook import (
    Stack,
    playbook_settings,
    records,
    run_jobs,
    serving_stack,
)
from tests.support.remediation import alert, iso, wait_for

BASE = "redline-base"
SERVED = "x-redline-served-region"
REROUTED = "x-redline-rerouted"
DOWN = {"outage": "unavailable"}


@pytest.fixture()
def stack(redis_url: str) -> Iterator[Stack]:
    """Two regions behind the gateway. The gateway's own failure tracking is off, so only the
    routing override can put the secondary first."""
    with serving_stack(
        redis_url, unhealthy_after_failures=0, routing_refresh_seconds=0.1
    ) as running:
        yield running


@pytest.fixture()
def routing(redis_url: str) -> Iterator[RoutingStore]:
    """The routing store the gateway reads."""
    store = RoutingStore(redis.Redis.from_url(redis_url), regions=("primary", "secondary"))
    yield store
    store.close()


def _settings(redis_url: str, stack: Stack, **reroute: Any) -> RemediationSettings:
    options = {"hold_down_seconds": 1.5, "verify_timeout_seconds": 5.0, "poll_seconds": 0.05,
               **reroute}  # fmt: skip
    return playbook_settings(
        redis_url,
        serving={"gateway_url": stack.gateway.url, "upstreams": stack.upstreams},
        reroute=options,
    )


def _alert(fingerprint: str, start: datetime, **kwargs: Any) -> dict[str, Any]:
    labels = {"alertname": "LatencyRedLine", **kwargs.pop("labels", {})}
    return alert(fingerprint, playbook="reroute", region="primary", starts_at=start,
                 labels=labels, **kwargs)  # fmt: skip


def _served(stack: Stack, count: int = 5) -> set[tuple[str, str]]:
    """(served region, rerouted) of real completions through the gateway."""
    seen = set()
    for _ in range(count):
        response = stack.chat(BASE)
        assert response.status_code == 200, response.text
        seen.add((response.headers[SERVED], response.headers[REROUTED]))
    return seen


def test_reroute_serves_from_the_healthy_region_and_restores_after_the_hold_down(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    settings = _settings(redis_url, stack)
    assert _served(stack) == {("primary", "false")}
    stack.faults("primary", DOWN)
    start = datetime.now(UTC) - timedelta(minutes=1)
    [job] = run_jobs(settings, _alert("c0000000000000c1", start))
    assert job.status == "succeeded", job.error
    override = routing.get_override()
    assert override is not None and override.target_region == "secondary"
    assert job.id in override.reason
    plan = (job.plan or [])[0]["params"]
    assert plan["to"] == "secondary" and plan["probes"]["secondary"]["healthy"] is True
    verify = next(s for s in job.steps if s["phase"] == "verify")
    assert verify["ok"] and verify["data"]["served_region"] == "secondary"
    # Real requests go to the secondary first: not failed over, routed there.
    assert _served(stack) == {("secondary", "false")}

    stack.faults("primary", {})
    # Resolved now: the hold-down counts from the alert's endsAt.
    ended = datetime.now(UTC)
    body = _alert("c0000000000000c1", start, status="resolved")
    body["endsAt"] = iso(ended)
    [resolved] = run_jobs(settings, body)
    assert resolved.status == "succeeded", resolved.error
    assert [s["name"] for s in resolved.steps if s["phase"] == "resolve"] == [
        "hold_down",
        "restore",
    ]
    restore = next(s for s in resolved.steps if s["name"] == "restore")
    waited = restore["at"] - ended.timestamp()
    assert waited >= 1.5, f"restored {waited:.2f} s after the alert ended, before the hold-down"
    [probes] = records(resolved, "probes")
    assert all(check["healthy"] for check in probes["data"]["checks"])
    assert len(probes["data"]["checks"]) == 3
    assert routing.get_override() is None
    wait_for(lambda: _served(stack, 1) == {("primary", "false")}, timeout=5, what="primary again")
    assert _served(stack) == {("primary", "false")}


def test_resolve_keeps_the_override_while_the_region_is_still_unhealthy(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    settings = _settings(redis_url, stack, hold_down_seconds=0.0)
    settings = settings.model_copy(update={"max_attempts": 2})
    stack.faults("primary", DOWN)
    start = datetime.now(UTC) - timedelta(minutes=1)
    [job] = run_jobs(settings, _alert("c0000000000000c2", start))
    assert job.status == "succeeded", job.error
    [resolved] = run_jobs(settings, _alert("c0000000000000c2", start, status="resolved"))
    assert resolved.status == "failed" and resolved.attempts == 2
    assert resolved.error is not None
    assert "primary is still unhealthy" in resolved.error and "stays" in resolved.error
    override = routing.get_override()
    assert override is not None and override.target_region == "secondary"
    assert _served(stack) == {("secondary", "false")}


def test_no_healthy_region_sets_nothing_and_fails_loudly(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    settings = _settings(redis_url, stack).model_copy(update={"max_attempts": 2})
    stack.faults("primary", DOWN)
    stack.faults("secondary", DOWN)
    [job] = run_jobs(settings, _alert("c0000000000000c3", datetime.now(UTC)))
    assert job.status == "failed" and job.attempts == 2
    assert job.error is not None and "no healthy region to take primary's traffic" in job.error
    assert "secondary: " in job.error and "HTTP 503: region secondary is unavailable" in job.error
    assert routing.get_override() is None


def test_an_override_set_by_someone_else_is_left_alone_on_resolve(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    settings = _settings(redis_url, stack, hold_down_seconds=0.0)
    stack.faults("primary", DOWN)
    start = datetime.now(UTC) - timedelta(minutes=1)
    [job] = run_jobs(settings, _alert("c0000000000000c4", start))
    assert job.status == "succeeded", job.error
    routing.set_override("primary", "operator pinned the primary")
    stack.faults("primary", {})
    [resolved] = run_jobs(settings, _alert("c0000000000000c4", start, status="resolved"))
    assert resolved.status == "succeeded", resolved.error
    [step] = [s for s in resolved.steps if s["phase"] == "resolve"]
    assert "left alone" in (resolved.plan or [])[0]["description"]
    assert step["data"]["restored"] is False
    override = routing.get_override()
    assert override is not None and override.reason == "operator pinned the primary"


def test_dry_run_returns_the_plan_and_changes_nothing(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    settings = _settings(redis_url, stack)
    stack.faults("primary", DOWN)
    dry = _alert("c0000000000000c5", datetime.now(UTC), labels={"dry_run": "true"})
    [job] = run_jobs(settings, dry)
    assert job.status == "planned" and job.outcome == "dry_run"
    [step] = job.plan or []
    assert step["name"] == "set_override" and step["params"]["to"] == "secondary"
    assert routing.get_override() is None
    # Traffic still tries the primary first (and fails over by itself).
    assert _served(stack) == {("secondary", "true")}
