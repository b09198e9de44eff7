"""Guard rails, shadow mode and deferred steps against a real redis-server, the real receiver over
HTTP and real workers (threads, or `redline remediation worker` processes for kill -9)."""

from __future__ import annotations

import getpass
import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from redline.cli.remediation import remediation_app
from redline.devstack.processes import find_binary, start_redis
from redline.remediation.audit import AuditLog
from redline.remediation.jobs import JobStore
from redline.remediation.settings import RemediationSettings
from redline.slo import catalog
from redline.slo.spec import PlaybookPolicy
from tests.support.remediation import (
    AUTH,
    REGISTRY_REF,
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


def _settings(redis_url: str, tmp_path: Path, **policies: dict[str, Any]) -> RemediationSettings:
    return make_settings(
        redis_url,
        audit_file=tmp_path / "audit.jsonl",
        policies={name: PlaybookPolicy.model_validate(value) for name, value in policies.items()},
    )


@pytest.fixture()
def store(redis_url: str) -> Iterator[tuple[JobStore, redis.Redis]]:
    """A synchronous store (default prefix) on the test database."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield JobStore(client, "redline:remediation", 3600), client
    client.close()


def _enqueue(settings: RemediationSettings, *alerts: dict[str, Any]) -> list[str]:
    with receiver(settings) as server:
        response = post(server.url, payload(*alerts))
    assert response.status_code == 202, response.text
    return [str(item["job_id"]) for item in response.json()["alerts"]]


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict[Any, float], metric: catalog.Metric, **labels: str) -> float | None:
    return samples.get((metric.name, tuple(sorted(labels.items()))))


def _audit_kinds(settings: RemediationSettings, client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(line) for line in AuditLog(client, settings.key_prefix).records()]


# ---- shadow mode ----------------------------------------------------------------------------


def test_shadow_mode_runs_the_read_only_checks_records_the_rest_and_changes_nothing(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path, check={"mode": "shadow"})
    job_store, client = store
    with receiver(settings) as server:
        ok_body, bad_body = (
            alert("0000000000005a01", playbook="check"),
            alert("0000000000005a02", playbook="check", region="b", annotations={"fail": "true"}),
        )
        ids = [
            item["job_id"] for item in post(server.url, payload(ok_body, bad_body)).json()["alerts"]
        ]
        with workers(settings):
            done, would_fail = (wait_terminal(job_store, job_id) for job_id in ids)
        shown = httpx.get(f"{server.url}/jobs?status=shadowed", headers=AUTH).json()["jobs"]
        samples = _samples(server.url)
    assert done.status == "shadowed" and done.outcome == "shadow" and done.mode == "shadow"
    assert done.error is None and done.reason == "shadow: would change region=primary"
    assert [(s["phase"], s["name"]) for s in done.steps] == [
        ("plan", "plan"), ("check", "look"), ("shadow", "change"),
    ]  # fmt: skip
    assert done.steps[1]["data"] == {"shadow": True}
    assert done.steps[2]["detail"] == "would: change region=primary"
    assert client.get(f"rt:looks:{done.id}") == "1", "the read-only check ran"
    assert client.get("rt:changed:region=primary") is None, "shadow changed something"
    assert would_fail.status == "shadowed" and client.get("rt:changed:region=b") is None
    assert would_fail.error == "would have failed at look: the target looks wrong"
    assert {job["id"] for job in shown} == set(ids) and all(job["plan"] for job in shown)
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    assert _value(samples, runs, playbook="check", outcome="shadow") == 2
    assert _value(samples, runs, playbook="check", outcome="failed") == 0
    mode = catalog.REDLINE_REMEDIATION_MODE
    assert _value(samples, mode, playbook="check", mode="shadow") == 1
    assert _value(samples, mode, playbook="check", mode="act") == 0
    finished = [r for r in _audit_kinds(settings, client) if r["kind"] == "job.finished"]
    assert {(r["job_id"], r["data"]["status"], r["data"]["mode"]) for r in finished} == {
        (ids[0], "shadowed", "shadow"), (ids[1], "shadowed", "shadow"),
    }  # fmt: skip


def test_redis_down_during_a_shadow_run_records_nothing_as_done(tmp_path: Path) -> None:
    own = start_redis(tmp_path / "redis")
    gate = tmp_path / "gate"
    try:
        settings = _settings(own.extra["url"], tmp_path, check={"mode": "shadow"})
        [job_id] = _enqueue(
            settings, alert("0000000000005b01", playbook="check", annotations={"gate": str(gate)})
        )
        with workers(settings):
            wait_for(lambda: Path(f"{gate}.entered").exists(), what="the check to start")
            own.stop()
            gate.touch()  # the check finishes while Redis is down: the worker cannot record it
            time.sleep(1.0)
        own = start_redis(tmp_path / "redis", port=own.port)
        job_store, client = store_for(settings)
        try:
            # Back (the AOF kept everything), no worker running: nothing says it was done.
            seen = job_store.get(job_id)
            assert seen is not None and seen.status == "running", seen
            metrics = client.hgetall(job_store.keys.metrics)
            assert not any(name.startswith("runs|check|") for name in metrics), metrics
            assert client.zscore(job_store.keys.active, job_id) is not None
            assert not [r for r in _audit_kinds(settings, client) if r["kind"] == "job.finished"]
            with workers(settings):
                done = wait_terminal(job_store, job_id, timeout=30)
            metrics = client.hgetall(job_store.keys.metrics)
        finally:
            client.close()
        assert done.status == "shadowed" and done.attempts == 2, done
        assert metrics["runs|check|shadow"] == "1"
        assert [s["phase"] for s in done.steps].count("shadow") == 1
    finally:
        own.stop()


# ---- mode off, pause, budget, breaker --------------------------------------------------------


def test_mode_off_records_the_job_as_skipped(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path, counter={"mode": "off"})
    job_store, client = store
    [job_id] = _enqueue(settings, alert("0000000000005c01"))
    with workers(settings):
        job = wait_terminal(job_store, job_id)
    assert job.status == "skipped" and job.outcome == "off" and job.attempts == 0
    assert job.reason == "playbook counter is off (remediation.playbooks.counter.mode)"
    assert client.get("rt:runs:total") is None
    assert client.hgetall(job_store.keys.metrics)["runs|counter|off"] == "1"
    assert client.zscore(job_store.keys.active, job_id) is None
    skipped = [r for r in _audit_kinds(settings, client) if r["kind"] == "job.skipped"]
    assert [r["data"]["outcome"] for r in skipped] == ["off"]


def test_budget_skips_runs_over_n_per_target_and_window(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path, flaky={"budget": {"runs": 2, "per": "1h"}})
    job_store, client = store
    start = datetime(2024, 5, 1, 12, tzinfo=UTC)
    same = [
        alert(f"0000000000005d0{n}", playbook="flaky", starts_at=start + timedelta(minutes=n),
              annotations={"failures": "1"})
        for n in range(3)
    ]  # fmt: skip
    other = alert("0000000000005d09", playbook="flaky", region="other", starts_at=start)
    ids = _enqueue(settings, *same, other)
    with workers(settings):  # one worker: the jobs run in order
        jobs = [wait_terminal(job_store, job_id) for job_id in ids]
    # A retry (each job fails once, transiently) does not count twice against the budget.
    assert [job.status for job in jobs] == ["succeeded", "succeeded", "skipped", "succeeded"]
    assert jobs[0].attempts == 2 and jobs[2].attempts == 0
    assert jobs[2].outcome == "over_budget"
    assert jobs[2].reason == (
        "over budget: 2 run(s) of flaky on region=primary in the last 1h (budget 2 per 1h)"
    )
    assert client.hgetall(job_store.keys.metrics)["runs|flaky|over_budget"] == "1"


def test_breaker_opens_after_k_failures_survives_restarts_and_a_human_closes_it(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path, broken={"breaker": {"failures": 2}})
    job_store, client = store
    start = datetime(2024, 5, 1, 12, tzinfo=UTC)
    bodies = [
        alert(f"0000000000005e0{n}", playbook="broken", region=f"r{n}",
              starts_at=start + timedelta(minutes=n))
        for n in range(3)
    ]  # fmt: skip
    ids = _enqueue(settings, *bodies)
    with workers(settings):
        jobs = [wait_terminal(job_store, job_id) for job_id in ids]
    assert [job.status for job in jobs] == ["failed", "failed", "skipped"]
    assert jobs[2].outcome == "breaker_open" and "breaker is open" in (jobs[2].reason or "")
    assert "redline remediation resume broken" in (jobs[2].reason or "")
    assert client.get(f"rt:runs:{ids[2]}") is None, "acted with the breaker open"
    # A new worker (a restart) still sees the breaker open: the state is in Redis.
    [later] = _enqueue(settings, alert("0000000000005e09", playbook="broken", region="r9"))
    with receiver(settings) as server:
        assert _value(
            _samples(server.url), catalog.REDLINE_REMEDIATION_BREAKER_OPEN, playbook="broken"
        ) == 1  # fmt: skip
        with workers(settings):
            assert wait_terminal(job_store, later).outcome == "breaker_open"
        resumed = CliRunner().invoke(
            remediation_app,
            ["resume", "broken", "--reason", "fixed the dependency", "--by", "alice",
             "--redis-url", redis_url, "--playbooks", REGISTRY_REF],
        )  # fmt: skip
        assert resumed.exit_code == 0, resumed.output
        assert "breaker closed: broken" in resumed.output
        assert _value(
            _samples(server.url), catalog.REDLINE_REMEDIATION_BREAKER_OPEN, playbook="broken"
        ) == 0  # fmt: skip
    [after] = _enqueue(settings, alert("0000000000005e0a", playbook="broken", region="ra"))
    with workers(settings):
        assert wait_terminal(job_store, after).status == "failed", "it acts again"
    records = _audit_kinds(settings, client)
    opened = [r for r in records if r["kind"] == "breaker.opened"]
    assert [r["job_id"] for r in opened] == [ids[1]]
    [human] = [r for r in records if r["kind"] == "playbook.resumed"]
    assert human["data"]["by"] == "alice" and human["data"]["reason"] == "fixed the dependency"
    assert human["data"]["breakers_closed"] == ["broken"]


def test_pause_and_resume_hand_a_playbook_to_a_human_and_back_audited(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path)
    job_store, client = store
    runner = CliRunner()
    base = ["--redis-url", redis_url, "--playbooks", REGISTRY_REF]
    unknown = runner.invoke(remediation_app, ["pause", "nope", "--reason", "x", *base])
    assert unknown.exit_code == 2 and "unknown playbook 'nope'" in unknown.output
    paused = runner.invoke(
        remediation_app, ["pause", "counter", "--reason", "migrating the DB", "--by", "bob", *base]
    )
    assert paused.exit_code == 0, paused.output
    assert "counter: paused; by bob: migrating the DB" in paused.output
    everything = runner.invoke(remediation_app, ["pause", "--reason", "game day", *base])
    assert everything.exit_code == 0 and "every playbook: paused" in everything.output
    status = runner.invoke(remediation_app, ["status", *base])
    assert "paused by bob" in status.output
    ids = _enqueue(settings, alert("0000000000005f01"), alert("0000000000005f02", playbook="flaky"))
    with receiver(settings) as server, workers(settings):
        jobs = [wait_terminal(job_store, job_id) for job_id in ids]
        samples = _samples(server.url)
    assert [(job.status, job.outcome) for job in jobs] == [("skipped", "paused")] * 2
    assert "paused by bob" in (jobs[0].reason or "") and "game day" in (jobs[1].reason or "")
    assert _value(samples, catalog.REDLINE_REMEDIATION_PAUSED, playbook="counter") == 1
    assert client.get("rt:runs:total") is None
    resumed = runner.invoke(remediation_app, ["resume", "--reason", "done", "--by", "bob", *base])
    assert resumed.exit_code == 0 and "pause lifted: *, counter" in resumed.output
    [again] = _enqueue(settings, alert("0000000000005f03"))
    with workers(settings):
        assert wait_terminal(job_store, again).status == "succeeded"
    records = _audit_kinds(settings, client)
    kinds = [(r["kind"], r["data"].get("playbook"), r["data"].get("by"))
             for r in records if r["kind"].startswith("playbook.")]  # fmt: skip
    me = f"{getpass.getuser()}@{socket.gethostname()}"
    assert kinds == [
        ("playbook.paused", "counter", "bob"), ("playbook.paused", "*", me),
        ("playbook.resumed", "*", "bob"),
    ]  # fmt: skip
    [lifted] = [r for r in _audit_kinds(settings, client) if r["kind"] == "playbook.resumed"]
    assert lifted["data"]["reason"] == "done" and lifted["data"]["pauses_lifted"] == [
        "*",
        "counter",
    ]


# ---- stuck jobs ------------------------------------------------------------------------------


def test_jobs_past_their_deadline_show_as_overdue_until_they_finish(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path, slow={"deadline": "1s"})
    job_store, _ = store
    overdue = catalog.REDLINE_REMEDIATION_JOBS_OVERDUE
    oldest = catalog.REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS
    with receiver(settings) as server:
        body = payload(alert("0000000000005a11", playbook="slow", annotations={"items": "30"}))
        [job_id] = [item["job_id"] for item in post(server.url, body).json()["alerts"]]
        # No worker yet: queued and never picked up is stuck too.
        assert _value(_samples(server.url), overdue, playbook="slow") == 0
        time.sleep(1.2)
        samples = _samples(server.url)
        assert _value(samples, overdue, playbook="slow") == 1
        assert (_value(samples, oldest, playbook="slow") or 0) >= 1.0
        assert _value(samples, overdue, playbook="reroute") == 0
        with workers(settings):
            wait_for(lambda: (job := job_store.get(job_id)) is not None and job.status == "running")
            assert _value(_samples(server.url), overdue, playbook="slow") == 1
            wait_terminal(job_store, job_id, timeout=30)
        samples = _samples(server.url)
        assert _value(samples, overdue, playbook="slow") == 0
        assert _value(samples, oldest, playbook="slow") == 0
        text = httpx.get(f"{server.url}/metrics").text
    lint = subprocess.run(
        [find_binary("promtool"), "check", "metrics"], input=text.encode(), capture_output=True
    )
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()


# ---- deferred steps --------------------------------------------------------------------------


def test_a_deferred_step_frees_the_worker_and_continues_from_that_step(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path)
    job_store, client = store
    waiting, quick = _enqueue(
        settings,
        alert("0000000000005b11", playbook="wait", annotations={"hold": "1.5"}),
        alert("0000000000005b12", region="elsewhere"),
    )
    with workers(settings, 1):
        # One worker: the other job runs during the hold instead of after it.
        done_quick = wait_terminal(job_store, quick)
        held = job_store.get(waiting)
        assert held is not None and held.status == "waiting", held
        assert held.cursor == 1 and held.reason == "holding" and held.step_state
        done = wait_terminal(job_store, waiting)
    assert done_quick.status == "succeeded"
    assert done.status == "succeeded" and done.attempts == 1
    log = client.lrange(f"rt:wait:{waiting}", 0, -1)
    assert [entry.split(" ")[0] for entry in log] == ["mark", "defer", "resume", "after"]
    due, resumed = float(log[1].split()[1]), float(log[2].split()[1])
    assert resumed >= due, "resumed before it was due"
    assert [s["phase"] for s in done.steps if s["phase"] == "plan"] == ["plan"], "replanned"
    kinds = [r["kind"] for r in _audit_kinds(settings, client) if r["job_id"] == waiting]
    assert kinds.count("job.waiting") == 1 and kinds.count("job.resumed") == 1


@pytest.mark.slow
def test_worker_killed_while_a_job_waits_the_job_resumes_on_another_worker_when_due(
    redis_url: str, tmp_path: Path, store: tuple[JobStore, redis.Redis]
) -> None:
    settings = _settings(redis_url, tmp_path)
    job_store, client = store
    victim = worker_process(settings, tmp_path / "victim.log")
    try:
        log_file = tmp_path / "victim.log"
        wait_for(lambda: "started; playbooks" in log_file.read_text(), timeout=60, what="victim")
        [job_id] = _enqueue(
            settings, alert("0000000000005b21", playbook="wait", annotations={"hold": "4"})
        )
        held = wait_for(
            lambda: (job := job_store.get(job_id)) is not None and job.status == "waiting" and job,
            timeout=30, what="the hold to be deferred",
        )  # fmt: skip
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    due = float(client.lrange(f"rt:wait:{job_id}", 0, -1)[1].split()[1])
    assert held.cursor == 1
    rescuer_log = tmp_path / "rescuer.log"
    rescuer = worker_process(settings, rescuer_log)
    try:
        wait_for(
            lambda: "started; playbooks" in rescuer_log.read_text(), timeout=60, what="rescuer"
        )
        # The job is owed at its due time or when a worker is there to run it, whichever is
        # later (a busy machine takes seconds to start a Python process).
        ready = time.time()
        done = wait_terminal(job_store, job_id, timeout=60)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        assert rescuer.wait(timeout=15) == 0, rescuer_log.read_text()
    assert done.status == "succeeded" and done.attempts == 1
    log = client.lrange(f"rt:wait:{job_id}", 0, -1)
    assert [entry.split(" ")[0] for entry in log] == ["mark", "defer", "resume", "after"]
    resumed = float(log[2].split()[1])
    owed = max(due, ready)
    assert due <= resumed <= owed + 5, f"resumed {resumed - owed:+.2f} s from when it was owed"
    after = next(s for s in done.steps if s["name"] == "after")
    assert f"-{rescuer.pid}-" in after["worker"] and f"-{victim.pid}-" not in after["worker"]


def test_workers_block_on_redis_not_the_hold_down(redis_url: str, tmp_path: Path) -> None:
    """Many waiting jobs occupy no worker thread: one worker runs them all at their due time."""
    settings = _settings(redis_url, tmp_path)
    job_store, client = store_for(settings)
    try:
        ids = _enqueue(
            settings,
            *(alert(f"0000000000005b3{n}", playbook="wait", region=f"r{n}",
                    annotations={"hold": "1.5"}) for n in range(6)),
        )  # fmt: skip
        started = time.monotonic()
        with workers(settings, 1):
            done = [wait_terminal(job_store, job_id, timeout=30) for job_id in ids]
        elapsed = time.monotonic() - started
    finally:
        client.close()
    assert {job.status for job in done} == {"succeeded"}
    # Sleeping holds would take 6 x 1.5 s on one worker; deferred ones overlap.
    assert elapsed < 6, f"the holds ran one after the other ({elapsed:.1f} s)"
