"""The job store and the worker against a real redis-server: reclaim after kill -9, target locks,
retries with backoff, failures that stay visible, resolve after firing, lease renewal."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redline.remediation.jobs import JobStore
from redline.remediation.playbook import (
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookRegistry,
    RegistryError,
    StepResult,
)
from redline.remediation.settings import RemediationSettings
from redline.remediation.worker import backoff_seconds
from tests.support.remediation import (
    alert,
    make_settings,
    payload,
    post,
    receiver,
    store_for,
    wait_for,
    wait_terminal,
    worker_process,
    workers,
)


@pytest.fixture()
def settings(redis_url: str, tmp_path: Path) -> RemediationSettings:
    """Short timings, audit mirror in the test's directory."""
    return make_settings(redis_url, audit_file=tmp_path / "audit.jsonl")


@pytest.fixture()
def store(settings: RemediationSettings) -> Iterator[tuple[JobStore, redis.Redis]]:
    """A synchronous store on the test database."""
    store, client = store_for(settings)
    yield store, client
    client.close()


def _enqueue(settings: RemediationSettings, *alerts: dict[str, object]) -> list[str]:
    with receiver(settings) as server:
        response = post(server.url, payload(*alerts))
    assert response.status_code == 202, response.text
    return [item["job_id"] for item in response.json()["alerts"]]


@pytest.mark.slow
def test_worker_killed_mid_playbook_job_is_reclaimed_and_finished_exactly_once_in_effect(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis], tmp_path: Path
) -> None:
    job_store, client = store
    items = 12
    [job_id] = _enqueue(
        settings,
        alert("00000000000000c1", playbook="slow", annotations={"items": str(items)}),
    )
    victim = worker_process(settings, tmp_path / "victim.log")
    try:
        # Kill it in the middle of the step: some items applied, not all.
        wait_for(lambda: client.llen(f"rt:applied:{job_id}") >= 3, timeout=30, what="progress")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    applied_at_kill = client.llen(f"rt:applied:{job_id}")
    assert 3 <= applied_at_kill < items
    assert job_store.get(job_id).status == "running"  # type: ignore[union-attr]
    rescuer = worker_process(settings, tmp_path / "rescuer.log")
    try:
        job = wait_terminal(job_store, job_id, timeout=30)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        assert rescuer.wait(timeout=15) == 0, (tmp_path / "rescuer.log").read_text()
    assert job.status == "succeeded", job
    assert job.attempts == 2
    assert client.get(f"rt:attempts:{job_id}") == "2"
    applied = [int(x) for x in client.lrange(f"rt:applied:{job_id}", 0, -1)]
    assert applied == list(range(items)), "an item was lost or applied twice"
    workers_seen = {step["attempt"] for step in job.steps}
    assert workers_seen == {1, 2}
    assert not client.exists(job_store.keys.lock("region=primary")), "lock not released"
    assert client.xlen(job_store.keys.stream) == 0


def test_transient_failures_are_retried_with_backoff_then_succeed(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    [job_id] = _enqueue(
        settings, alert("00000000000000c2", playbook="flaky", annotations={"failures": "2"})
    )
    with workers(settings):
        job = wait_terminal(job_store, job_id)
    assert job.status == "succeeded"
    assert job.attempts == 3
    assert client.get(f"rt:flaky:{job_id}") == "3"
    executes = [s for s in job.steps if s["phase"] == "execute"]
    assert [s["attempt"] for s in executes] == [3]
    metrics = client.hgetall(job_store.keys.metrics)
    assert metrics["runs|flaky|retry"] == "2"
    assert metrics["runs|flaky|succeeded"] == "1"


def test_backoff_doubles_and_is_capped() -> None:
    settings = RemediationSettings(backoff_initial_seconds=0.5, backoff_max_seconds=3)
    assert [backoff_seconds(settings, n) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 3, 3]


def test_job_that_keeps_failing_ends_failed_and_stays_visible(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    ids = _enqueue(
        settings,
        alert("00000000000000c3", playbook="flaky", annotations={"failures": "99"}),
        alert("00000000000000c4", playbook="broken", region="b1", annotations={"mode": "step"}),
        alert("00000000000000c5", playbook="broken", region="b2", annotations={"mode": "bug"}),
        alert("00000000000000c6", playbook="broken", region="b3", annotations={"mode": "ok"}),
        alert("00000000000000c7", playbook="no_such_playbook"),
        alert("00000000000000c8", playbook="counter", region=""),
    )
    with workers(settings, 2):
        jobs = [wait_terminal(job_store, job_id) for job_id in ids]
    assert [job.status for job in jobs] == ["failed"] * 6
    flaky, step, bug, verify, unknown, no_target = jobs
    assert flaky.attempts == settings.max_attempts
    assert client.get(f"rt:flaky:{flaky.id}") == str(settings.max_attempts)
    assert "gave up after 4 attempts" in (flaky.error or "")
    assert step.error == "step break failed: the dependency refused"
    assert bug.error == "KeyError: 'a playbook bug'"
    assert verify.error == "verification failed: effect not observed"
    assert "unknown playbook 'no_such_playbook'" in (unknown.error or "")
    assert "no 'region' label" in (no_target.error or "")
    listed = {job.id for job in job_store.list_jobs(status="failed")}
    assert listed == set(ids)
    assert {job.id for job in job_store.list_jobs(playbook="broken")} == set(ids[1:4])
    assert client.xlen(job_store.keys.stream) == 0
    assert client.zcard(job_store.keys.delayed) == 0


def test_one_playbook_at_a_time_per_target(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    slow = {"items": "4", "delay": "0.1"}
    ids = _enqueue(
        settings,
        alert("00000000000000d1", playbook="slow", region="east", annotations=slow),
        alert("00000000000000d2", playbook="slow", region="east", annotations=slow),
        alert("00000000000000d3", playbook="slow", region="west", annotations=slow),
    )
    with workers(settings, 3):
        jobs = [wait_terminal(job_store, job_id, timeout=30) for job_id in ids]
    assert all(job.status == "succeeded" for job in jobs)
    spans: dict[str, list[tuple[float, float]]] = {"east": [], "west": []}
    events = [line.split() for line in client.lrange("rt:intervals", 0, -1)]
    open_at: dict[str, float] = {}
    for kind, target, stamp in events:
        region = target.split("=", 1)[1]
        if kind == "start":
            assert region not in open_at, f"two playbooks ran on {target} at once"
            open_at[region] = float(stamp)
        else:
            spans[region].append((open_at.pop(region), float(stamp)))
    assert len(spans["east"]) == 2 and len(spans["west"]) == 1
    (a_start, a_end), (b_start, b_end) = sorted(spans["east"])
    assert a_end <= b_start
    west_start, west_end = spans["west"][0]
    assert west_start < b_end and a_start < west_end  # another target ran alongside


def test_long_job_keeps_its_lease_and_is_not_reclaimed(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    # 3 s of work against a 1.5 s claim-idle time and lock expiry, with idle workers around.
    [job_id] = _enqueue(
        settings,
        alert("00000000000000e1", playbook="slow", annotations={"items": "15", "delay": "0.2"}),
    )
    with workers(settings, 3):
        job = wait_terminal(job_store, job_id, timeout=30)
    assert job.status == "succeeded"
    assert job.attempts == 1
    assert client.get(f"rt:attempts:{job_id}") == "1"


def test_resolution_runs_resolve_once_after_the_firing_job(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    firing = alert("00000000000000f1", playbook="slow", annotations={"items": "3"})
    resolved = alert(
        "00000000000000f1", playbook="slow", status="resolved", annotations={"items": "3"}
    )
    with receiver(settings) as server:
        first = post(server.url, payload(firing))
        second = post(server.url, payload(resolved))
        again = post(server.url, payload(resolved))
    assert (first.status_code, second.status_code, again.status_code) == (202, 202, 200)
    firing_id = first.json()["alerts"][0]["job_id"]
    resolve_id = second.json()["alerts"][0]["job_id"]
    assert firing_id != resolve_id
    with workers(settings, 2):
        resolve_job = wait_terminal(job_store, resolve_id, timeout=30)
        firing_job = wait_terminal(job_store, firing_id, timeout=30)
    assert firing_job.status == resolve_job.status == "succeeded"
    assert firing_job.finished_at is not None and resolve_job.finished_at is not None
    assert firing_job.finished_at <= resolve_job.finished_at
    # SlowPlaybook has no resolve steps: the job plans nothing and succeeds.
    assert [s["phase"] for s in resolve_job.steps] == ["plan"]
    assert resolve_job.plan == []


def test_registry_is_explicit_and_checks_names() -> None:
    class Nameless(Playbook):
        name = "Bad Name"
        target_label = "region"

        def plan(self, ctx: PlaybookContext) -> list[PlannedStep]:
            return []

        def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
            return StepResult.success()

        def verify(self, ctx: PlaybookContext) -> StepResult:
            return StepResult.success()

    class Good(Nameless):
        name = "good"

    registry = PlaybookRegistry([Good()])
    assert registry.names() == ("good",) and "good" in registry and len(registry) == 1
    with pytest.raises(RegistryError, match="must match"):
        registry.register(Nameless())
    with pytest.raises(RegistryError, match="already registered"):
        registry.register(Good())
    assert PlaybookRegistry().names() == ()
