"""`reroute` with two simulated regions behind the real gateway, the routing store in a real
Redis, and the real receiver and worker; faults injected through the simulators' admin API."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from redline.core.servers import serve_in_thread
from redline.devstack.processes import start_prometheus
from redline.platform.prometheus import PrometheusClient
from redline.platform.routing import RoutingStore
from redline.remediation.jobs import Job, JobStore
from redline.remediation.playbooks.reroute import build_health_queries
from redline.remediation.settings import RemediationSettings
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import PlaybookPolicy
from tests.support.playbook import (
    Stack,
    deliver,
    get_job,
    playbook_settings,
    real_workers,
    records,
    run_jobs,
    serving_stack,
    worker_process,
)
from tests.support.remediation import alert, iso, store_for, wait_for, wait_terminal

BASE = "redline-base"
SERVED = "x-redline-served-region"
REROUTED = "x-redline-rerouted"
DOWN = {"outage": "unavailable"}
SLOW = {"latency": {"base_seconds": 0.7}}
SLOWER_THAN_THE_RED_LINE = {"latency": {"base_seconds": 1.2}}
"""Answers HTTP 200, but in 1.2 s: over the default spec's 0.8 s latency red line."""


@dataclass
class Exposition:
    """An exporter stand-in: the dry-run probe duration of each region, changeable."""

    values: dict[str, float] = field(default_factory=dict)

    def app(self) -> FastAPI:
        """`GET /metrics` in the text format."""
        app = FastAPI()
        name = catalog.LLM_PROBE_DURATION_SECONDS

        @app.get("/metrics", response_class=PlainTextResponse)
        def metrics() -> str:
            lines = [f"# TYPE {name} gauge"]
            for region, value in self.values.items():
                lines.append(f'{name}{{region="{region}",probe="chat_dry_run"}} {value}')
            return "\n".join(lines) + "\n"

        return app


def wait_terminal_job(settings: RemediationSettings, job_id: str, timeout: float) -> Job:
    """Wait until the job has finished."""
    store, client = store_for(settings)
    try:
        return wait_terminal(store, job_id, timeout)
    finally:
        client.close()


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
               "restore_for_seconds": 1.0, "restore_check_seconds": 0.2, "healthy_checks": 2,
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
    resolve = [(s["name"], s["detail"].split(" ", 1)[0]) for s in resolved.steps
               if s["phase"] == "resolve"]  # fmt: skip
    # The hold-down and the sustained-health wait are deferred steps, not sleeps.
    assert resolve == [("hold_down", "waiting"), ("hold_down", "held"), ("restore", "waiting"),
                       ("restore", "override")]  # fmt: skip
    restore = resolved.steps[-1]
    assert restore["name"] == "restore" and restore["data"]["restored"] is True
    waited = restore["at"] - ended.timestamp()
    assert waited >= 1.5 + 1.0, f"restored {waited:.2f} s after the alert ended, too early"
    assert restore["data"]["healthy_for_seconds"] >= 1.0
    [health] = records(resolved, "health")
    assert health["data"]["limit_seconds"] == pytest.approx(0.8 * 0.8)
    assert routing.get_override() is None
    wait_for(lambda: _served(stack, 1) == {("primary", "false")}, timeout=5, what="primary again")
    assert _served(stack) == {("primary", "false")}


def _watch_override(routing: RoutingStore, stop: threading.Event, seen: list[str | None]) -> None:
    """Record every change of the override's target until `stop`."""
    last: object = object()
    while True:
        # One read after `stop` too: a change in the last interval (or while this thread waited
        # for the CPU) is still recorded.
        stopping = stop.is_set()
        override = routing.get_override()
        current = override.target_region if override else None
        if current != last:
            seen.append(current)
            last = current
        if stopping:
            return
        stop.wait(0.02)


def test_a_region_still_slow_keeps_the_override_without_flapping_then_is_restored_once(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    # Hold-down 0.5 s: over 4 s the slow primary sees many hold-down periods and checks.
    settings = _settings(redis_url, stack, hold_down_seconds=0.5)
    stack.faults("primary", DOWN)
    start = datetime.now(UTC) - timedelta(minutes=1)
    [job] = run_jobs(settings, _alert("c0000000000000c2", start))
    assert job.status == "succeeded", job.error
    # Answering again, but slow: 0.7 s is under the red line (0.8 s) and over the restore
    # limit (0.8 x 0.8 = 0.64 s): exactly where a restore on "HTTP 200" would flap.
    stack.faults("primary", SLOW)
    seen: list[str | None] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_override, args=(routing, stop, seen), daemon=True)
    watcher.start()
    try:
        body = _alert("c0000000000000c2", start, status="resolved")
        body["endsAt"] = iso(datetime.now(UTC))
        [resolved_id] = deliver(settings, body)
        with real_workers(settings):

            def still_waiting() -> Job | None:
                found = get_job(settings, resolved_id)
                slow = found.reason is not None and "not healthy by the red line" in found.reason
                return found if found.status == "waiting" and slow else None

            waiting = wait_for(still_waiting, timeout=20, what="the restore to wait")
            assert "> 0.64 s" in (waiting.reason or "")
            time.sleep(4.0)
            held = get_job(settings, resolved_id)
            # Each check probes for 0.7 s, then the job waits 0.2 s: either may be seen.
            assert held.status in ("waiting", "running") and held.error is None, held
            assert held.cursor == 1 and (held.step_state or {}).get("status") == "slow"
            assert routing.get_override() is not None
            stack.faults("primary", {})
            done = wait_terminal_job(settings, resolved_id, timeout=30)
    finally:
        stop.set()
        watcher.join()
    assert done.status == "succeeded", done.error
    assert done.steps[-1]["data"]["restored"] is True
    # Zero flips while slow, one restore after recovery.
    assert seen == ["secondary", None], seen
    # Checks repeat every 0.2 s, but a step record is added only when what they see changes.
    restores = [s for s in done.steps if s["phase"] == "resolve" and s["name"] == "restore"]
    assert [s["detail"].split(" ", 1)[0] for s in restores[:-1]] == ["waiting", "waiting"]
    assert (
        "not healthy" in restores[0]["detail"]
        and "healthy by the red line for 0" in (restores[1]["detail"])
    )


def test_resolve_keeps_the_override_while_the_region_is_down(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    settings = _settings(redis_url, stack, hold_down_seconds=0.0)
    stack.faults("primary", DOWN)
    start = datetime.now(UTC) - timedelta(minutes=1)
    [job] = run_jobs(settings, _alert("c0000000000000c6", start))
    assert job.status == "succeeded", job.error
    [resolved_id] = deliver(settings, _alert("c0000000000000c6", start, status="resolved"))
    with real_workers(settings):

        def down() -> Job | None:
            found = get_job(settings, resolved_id)
            return found if found.reason and "unavailable" in found.reason else None

        waiting = wait_for(down, timeout=20, what="the restore to wait on the down region")
    assert waiting.status in ("waiting", "running") and waiting.attempts == 1
    override = routing.get_override()
    assert override is not None and override.target_region == "secondary"
    assert _served(stack) == {("secondary", "false")}


def test_restore_waits_while_prometheus_measures_the_region_slow(
    redis_url: str, stack: Stack, routing: RoutingStore, tmp_path: Path
) -> None:
    # The probes answer fast; the exporter's measurement in Prometheus says 2 s: not healthy.
    exposition = Exposition({"primary": 2.0})
    with serve_in_thread(exposition.app()) as target:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "exporters", "static_configs": [
                {"targets": [target.url.removeprefix("http://")]}]}],
        }  # fmt: skip
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prometheus = start_prometheus(tmp_path / "prom", tmp_path / "prometheus.yml")
        try:
            settings = _settings(
                redis_url, stack, hold_down_seconds=0.0, prometheus_url=prometheus.url
            )
            with PrometheusClient(prometheus.url, trust_env=False) as client:
                query = build_health_queries(load_spec(None).spec, "primary")["exporter_probe"]
                wait_for(lambda: client.instant(query), timeout=20, what="the probe series")
            stack.faults("primary", DOWN)
            start = datetime.now(UTC) - timedelta(minutes=1)
            [job] = run_jobs(settings, _alert("c0000000000000c7", start))
            assert job.status == "succeeded", job.error
            stack.faults("primary", {})
            [resolved_id] = deliver(settings, _alert("c0000000000000c7", start, status="resolved"))
            with real_workers(settings):

                def measured_slow() -> Job | None:
                    found = get_job(settings, resolved_id)
                    slow = found.reason and "exporter probe 2.000 s > 0.64 s" in found.reason
                    return found if slow else None

                wait_for(measured_slow, timeout=20, what="the Prometheus figure to hold it")
                assert routing.get_override() is not None
                exposition.values["primary"] = 0.05
                done = wait_terminal_job(settings, resolved_id, timeout=30)
            assert done.status == "succeeded" and done.steps[-1]["data"]["restored"] is True
            assert routing.get_override() is None
        finally:
            prometheus.stop()


@pytest.mark.parametrize(
    ("secondary", "fingerprint", "why"),
    [
        (DOWN, "c0000000000000c3", "HTTP 503: region secondary is unavailable"),
        # Answering 200 is not enough: slower than the red line, it is no reroute target.
        (SLOWER_THAN_THE_RED_LINE, "c0000000000000d2", "secondary: dry run answered 200"),
    ],
    ids=["down", "200-but-slower-than-the-red-line"],
)
def test_no_healthy_region_sets_nothing_and_fails_loudly(
    redis_url: str,
    stack: Stack,
    routing: RoutingStore,
    secondary: dict[str, Any],
    fingerprint: str,
    why: str,
) -> None:
    settings = _settings(redis_url, stack).model_copy(update={"max_attempts": 2})
    stack.faults("primary", DOWN)
    stack.faults("secondary", secondary)
    [job] = run_jobs(settings, _alert(fingerprint, datetime.now(UTC)))
    assert job.status == "failed" and job.attempts == 2
    assert job.error is not None and "no healthy region to take primary's traffic" in job.error
    assert "none answered within the 0.8 s red line" in job.error
    assert "secondary: " in job.error and why in job.error, job.error
    assert routing.get_override() is None


def test_a_region_answering_200_slower_than_the_red_line_is_never_the_reroute_target(
    redis_url: str,
) -> None:
    # Failover order primary, secondary, tertiary: the secondary comes first but is slow.
    regions = ("primary", "secondary", "tertiary")
    with serving_stack(
        redis_url, regions, unhealthy_after_failures=0, routing_refresh_seconds=0.1
    ) as stack:
        routing = RoutingStore(redis.Redis.from_url(redis_url), regions=regions)
        try:
            settings = _settings(redis_url, stack)
            stack.faults("primary", DOWN)
            stack.faults("secondary", SLOWER_THAN_THE_RED_LINE)
            [job] = run_jobs(settings, _alert("c0000000000000d1", datetime.now(UTC)))
            assert job.status == "succeeded", job.error
            plan = (job.plan or [])[0]["params"]
            slow = plan["probes"]["secondary"]
            # The secondary did answer 200: only its latency keeps it from the traffic.
            assert slow["healthy"] is True and slow["seconds"] > 0.8, slow
            assert plan["to"] == "tertiary"
            [probe] = records(job, "probe")
            assert probe["data"]["region"] == "tertiary"
            override = routing.get_override()
            assert override is not None and override.target_region == "tertiary"
            assert _served(stack) == {("tertiary", "false")}
        finally:
            routing.close()


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


def test_shadow_mode_plans_and_probes_but_changes_nothing(
    redis_url: str, stack: Stack, routing: RoutingStore
) -> None:
    settings = _settings(redis_url, stack).model_copy(
        update={"policies": {"reroute": PlaybookPolicy(mode="shadow")}}
    )
    stack.faults("primary", DOWN)
    [job] = run_jobs(settings, _alert("c0000000000000c8", datetime.now(UTC)))
    assert job.status == "shadowed" and job.outcome == "shadow" and job.mode == "shadow"
    assert job.error is None
    [step] = job.plan or []
    assert step["params"]["to"] == "secondary" and step["params"]["probes"]["secondary"]["healthy"]
    [would] = [s for s in job.steps if s["phase"] == "shadow"]
    assert would["detail"] == (
        "would: route the gateway's traffic to secondary first instead of primary"
    )
    assert not [s for s in job.steps if s["phase"] in ("execute", "verify")]
    assert job.reason is not None and job.reason.startswith("shadow: would route")
    assert routing.get_override() is None
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        metrics = client.hgetall(JobStore(client, settings.key_prefix, 60).keys.metrics)
    finally:
        client.close()
    assert metrics["runs|reroute|shadow"] == "1"


@pytest.mark.slow
def test_worker_killed_during_the_hold_down_the_job_resumes_on_another_at_the_right_time(
    redis_url: str, stack: Stack, routing: RoutingStore, tmp_path: Path
) -> None:
    settings = _settings(redis_url, stack, hold_down_seconds=4.0)
    stack.faults("primary", DOWN)
    start = datetime.now(UTC) - timedelta(minutes=1)
    [job] = run_jobs(settings, _alert("c0000000000000c9", start))
    assert job.status == "succeeded", job.error
    stack.faults("primary", {})
    victim = worker_process(settings, tmp_path, tmp_path / "victim.log")
    try:
        log = tmp_path / "victim.log"
        wait_for(lambda: "started; playbooks" in log.read_text(), timeout=60, what="the victim")
        ended = datetime.now(UTC)
        body = _alert("c0000000000000c9", start, status="resolved")
        body["endsAt"] = iso(ended)
        [resolved_id] = deliver(settings, body)
        held = wait_for(
            lambda: (found := get_job(settings, resolved_id)).status == "waiting" and found,
            timeout=60, what="the hold-down to be deferred",
        )  # fmt: skip
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert held.cursor == 0 and held.next_attempt_at is not None
    due = datetime.fromisoformat(held.next_attempt_at).timestamp()
    assert due == pytest.approx(ended.timestamp() + 4.0, abs=0.5)
    assert routing.get_override() is not None
    rescuer_log = tmp_path / "rescuer.log"
    rescuer = worker_process(settings, tmp_path, rescuer_log)
    try:
        wait_for(lambda: "started; playbooks" in rescuer_log.read_text(), timeout=60,
                 what="the rescuer")  # fmt: skip
        rescuer_up = time.time()
        done = wait_terminal_job(settings, resolved_id, timeout=60)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        rescuer.wait(timeout=15)
    assert done.status == "succeeded", done.error
    assert done.attempts == 1, "waiting is not an attempt"
    resumed = [s for s in done.steps if s["name"] == "hold_down"][-1]
    assert f"-{victim.pid}-" not in resumed["worker"] and f"-{rescuer.pid}-" in resumed["worker"]
    assert resumed["at"] >= due - 0.05, "resumed before the hold-down ended"
    # Owed at its due time or once the rescuer is up, whichever is later (a busy machine can
    # take longer than the hold-down to start a worker).
    owed = max(due, rescuer_up)
    assert resumed["at"] <= owed + 10, "resumed long after the hold-down ended"
    assert done.steps[-1]["data"]["restored"] is True and routing.get_override() is None
