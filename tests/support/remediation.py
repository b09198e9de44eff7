"""Helpers of the remediation tests: small real playbooks working on Redis, payload builders,
the receiver on a real uvicorn server in a thread, worker threads and worker processes.

The playbooks do checkable work in Redis under `rt:` keys: they count every execution, so a
test sees exactly how often a step ran, and they are idempotent the way the framework asks.
`open_registry` is the factory a worker subprocess loads with
`--playbooks tests.support.remediation:open_registry`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml
from pydantic import SecretStr

from redline.core.servers import ServerThread, serve_in_thread
from redline.remediation.app import build_receiver_app
from redline.remediation.jobs import TERMINAL, Job, JobStore
from redline.remediation.playbook import (
    Deferred,
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookRegistry,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RemediationSettings
from redline.remediation.worker import Worker
from redline.rules.alertmanager import RECEIVER, build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.slo.load import load_spec
from redline.slo.spec import Receiver

TOKEN = "s3cret-webhook-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPO = Path(__file__).resolve().parents[2]
REGISTRY_REF = "tests.support.remediation:open_registry"


class CounterPlaybook(Playbook):
    """Marks its target remediated; counts executions per job and resolutions per alert."""

    name = "counter"
    target_label = "region"

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step: mark the target."""
        return (PlannedStep("mark", f"mark {ctx.target} remediated", {"target": ctx.target}),)

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Count the execution, set the state (idempotent)."""
        ctx.redis.incr(f"rt:runs:{ctx.job_id}")
        ctx.redis.incr("rt:runs:total")
        ctx.redis.set(f"rt:state:{ctx.target}", "remediated")
        return StepResult.success("marked")

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The state is set."""
        state = ctx.redis.get(f"rt:state:{ctx.target}")
        return StepResult(state in ("remediated", b"remediated"), f"state={state!r}")

    def plan_resolve(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step: clear the mark."""
        return (PlannedStep("clear", f"clear {ctx.target}"),)

    def resolve(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Count the resolution, clear the state."""
        firing = ctx.firing_job.status if ctx.firing_job else "none"
        ctx.redis.incr(f"rt:resolves:{ctx.alert.fingerprint}")
        ctx.redis.set(f"rt:state:{ctx.target}", f"resolved-after-{firing}")
        return StepResult.success("cleared", firing_status=firing)


class SlowPlaybook(Playbook):
    """Applies `items` items (annotation), one per `delay` seconds, exactly once in effect.

    Each item is appended to `rt:applied:<job>` and marked done in one MULTI, and skipped once
    done, like a replay that advances its checkpoint with the data it applies.
    """

    name = "slow"
    target_label = "region"

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step: apply the items."""
        items = int(ctx.annotations.get("items", "10"))
        return (PlannedStep("apply", f"apply {items} items", {"items": items}),)

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Apply the missing items, recording start and end of the step."""
        delay = float(ctx.annotations.get("delay", "0.1"))
        items = int(step.params["items"])
        ctx.redis.rpush("rt:intervals", f"start {ctx.target} {time.time()}")
        ctx.redis.incr(f"rt:attempts:{ctx.job_id}")
        for item in range(items):
            ctx.ensure_lease()
            if ctx.redis.sismember(f"rt:done:{ctx.job_id}", str(item)):
                continue
            time.sleep(delay)
            pipe = ctx.redis.pipeline(transaction=True)
            pipe.rpush(f"rt:applied:{ctx.job_id}", item)
            pipe.sadd(f"rt:done:{ctx.job_id}", item)
            pipe.execute()
            ctx.record("item", f"applied {item}", item=item)
        ctx.redis.rpush("rt:intervals", f"end {ctx.target} {time.time()}")
        return StepResult.success(f"{items} items applied")

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Every item is applied once."""
        items = int(ctx.annotations.get("items", "10"))
        applied = ctx.redis.lrange(f"rt:applied:{ctx.job_id}", 0, -1)
        return StepResult(len(applied) == items, f"{len(applied)}/{items} applied")


class FlakyPlaybook(Playbook):
    """Fails transiently the first `failures` (annotation) executions, then succeeds."""

    name = "flaky"
    target_label = "region"

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step."""
        return (PlannedStep("try", "try the flaky dependency"),)

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Transient failure until the count is reached."""
        count = int(ctx.redis.incr(f"rt:flaky:{ctx.job_id}"))
        if count <= int(ctx.annotations.get("failures", "1")):
            raise TransientError(f"dependency busy (try {count})")
        return StepResult.success(f"succeeded on try {count}")

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Always fine once executed."""
        return StepResult.success()


class BrokenPlaybook(Playbook):
    """Fails for good: a failed step (`mode=step`), a failed verify or a bug (`mode=bug`)."""

    name = "broken"
    target_label = "region"

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step."""
        return (PlannedStep("break", "fail"),)

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Fail as the alert says."""
        ctx.redis.incr(f"rt:runs:{ctx.job_id}")
        mode = ctx.annotations.get("mode", "step")
        if mode == "bug":
            raise KeyError("a playbook bug")
        if mode == "step":
            return StepResult.failure("the dependency refused")
        return StepResult.success()

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Fails."""
        return StepResult.failure("effect not observed")


class WaitPlaybook(Playbook):
    """`mark` (counted) → `hold` (read only: defers `hold` seconds, annotation) → `after`.

    `rt:wait:<job>` lists what happened: `mark`, `defer <due>`, `resume <time>`, `after`.
    """

    name = "wait"
    target_label = "region"

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Three steps."""
        hold = float(ctx.annotations.get("hold", "1"))
        return (
            PlannedStep("mark", "count a mark"),
            PlannedStep("hold", f"wait {hold:g} s", {"hold": hold}, read_only=True),
            PlannedStep("after", "count an after"),
        )

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult | Deferred:
        """Mark, hold (deferred, then resumed when due), after."""
        log = f"rt:wait:{ctx.job_id}"
        if step.name == "hold":
            due = ctx.state.get("due")
            if due is None:
                due = time.time() + float(step.params["hold"])
                ctx.redis.rpush(log, f"defer {due}")
                return Deferred(float(step.params["hold"]), "holding", {"due": due})
            ctx.redis.rpush(log, f"resume {time.time()}")
            if time.time() < float(due):
                return Deferred(float(due) - time.time(), "not yet", {"due": due})
            return StepResult.success("held", due=due)
        ctx.redis.rpush(log, step.name)
        return StepResult.success(step.name)

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The after step ran."""
        return StepResult(
            "after" in ctx.redis.lrange(f"rt:wait:{ctx.job_id}", 0, -1), "after recorded"
        )


class CheckPlaybook(Playbook):
    """`look` (read only: counts, may wait for a file) → `change` (sets `rt:changed:<target>`).

    Annotations: `gate` (a file `look` waits for, after creating `<gate>.entered`) and `fail`
    ("true": `look` reports failure).
    """

    name = "check"
    target_label = "region"

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """A check, then a change."""
        return (
            PlannedStep("look", "look at the target", read_only=True),
            PlannedStep("change", f"change {ctx.target}", {"target": ctx.target}),
        )

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Look (read only) or change."""
        if step.name == "look":
            gate = ctx.annotations.get("gate")
            if gate:
                Path(f"{gate}.entered").touch()
                while not Path(gate).exists():
                    time.sleep(0.02)
            ctx.redis.incr(f"rt:looks:{ctx.job_id}")
            if ctx.annotations.get("fail") == "true":
                return StepResult.failure("the target looks wrong")
            return StepResult.success("looked", shadow=ctx.shadow)
        ctx.redis.set(f"rt:changed:{ctx.target}", ctx.job_id)
        return StepResult.success("changed")

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The change is there."""
        return StepResult(bool(ctx.redis.get(f"rt:changed:{ctx.target}")), "changed")


def open_registry(settings: RemediationSettings) -> PlaybookRegistry:
    """The test playbooks."""
    return PlaybookRegistry(
        [CounterPlaybook(), SlowPlaybook(), FlakyPlaybook(), BrokenPlaybook(), WaitPlaybook(),
         CheckPlaybook()]
    )  # fmt: skip


def make_settings(redis_url: str, **overrides: Any) -> RemediationSettings:
    """Settings with short timings for tests."""
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "playbooks": REGISTRY_REF,
        "claim_idle_seconds": 1.5,
        "lock_ttl_seconds": 1.5,
        "backoff_initial_seconds": 0.05,
        "backoff_max_seconds": 0.2,
        "lock_wait_seconds": 0.05,
        "poll_seconds": 0.1,
        "max_attempts": 4,
        **overrides,
    }
    return RemediationSettings.model_validate(values)


def iso(moment: datetime) -> str:
    """RFC 3339 with nanoseconds, as Alertmanager writes it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def alert(
    fingerprint: str,
    *,
    playbook: str | None = "counter",
    region: str = "primary",
    status: str = "firing",
    starts_at: datetime | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One v4 alert."""
    start = starts_at or datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    all_labels = {"alertname": "RedLineTest", "region": region, **(labels or {})}
    if playbook is not None:
        all_labels["playbook"] = playbook
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": "test", **(annotations or {})},
        "startsAt": iso(start),
        "endsAt": "0001-01-01T00:00:00Z"
        if status == "firing"
        else iso(start + timedelta(minutes=1)),
        "generatorURL": "http://127.0.0.1:9090/graph",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any], status: str | None = None) -> dict[str, Any]:
    """A v4 payload around `alerts`."""
    statuses = {a["status"] for a in alerts}
    return {
        "version": "4",
        "groupKey": '{}:{alertname="RedLineTest"}',
        "truncatedAlerts": 0,
        "status": status or ("firing" if "firing" in statuses else "resolved"),
        "receiver": "redline-remediation",
        "groupLabels": {"alertname": "RedLineTest"},
        "commonLabels": {"alertname": "RedLineTest"},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": list(alerts),
    }


@contextmanager
def receiver(settings: RemediationSettings, port: int = 0) -> Iterator[ServerThread]:
    """A running receiver for `settings` (token TOKEN) on loopback; `port` 0: a free one."""
    app = build_receiver_app(settings, token=SecretStr(TOKEN))
    with serve_in_thread(app, port=port, log_config=None, access_log=False, ws="none") as server:
        yield server


@contextmanager
def worker_threads(
    settings: RemediationSettings,
    registry: Callable[[RemediationSettings], PlaybookRegistry],
    count: int,
    name_prefix: str,
    join_timeout: float,
) -> Iterator[list[Worker]]:
    """`count` worker threads on the registry `registry` builds, stopped and joined on exit."""
    stop = threading.Event()
    clients = [
        redis.Redis.from_url(settings.redis_url, decode_responses=True) for _ in range(count)
    ]
    running = [
        Worker(settings, registry(settings), client, name=f"{name_prefix}-{index}")
        for index, client in enumerate(clients)
    ]
    threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in running]
    for thread in threads:
        thread.start()
    try:
        yield running
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=join_timeout)
        for client in clients:
            client.close()


@contextmanager
def workers(settings: RemediationSettings, count: int = 1) -> Iterator[list[Worker]]:
    """`count` worker threads on the test registry, stopped and joined on exit."""
    with worker_threads(settings, open_registry, count, "test-worker", 15) as running:
        yield running


def worker_process(settings: RemediationSettings, log_path: Path) -> subprocess.Popen[bytes]:
    """`redline remediation worker` in its own process, on the test registry."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "REDLINE_CLAIM_IDLE_SECONDS": str(settings.claim_idle_seconds),
        "REDLINE_LOCK_TTL_SECONDS": str(settings.lock_ttl_seconds),
        "REDLINE_POLL_SECONDS": str(settings.poll_seconds),
        "REDLINE_MAX_ATTEMPTS": str(settings.max_attempts),
        "REDLINE_KEY_PREFIX": settings.key_prefix,
    }
    argv = [
        sys.executable, "-m", "redline.cli", "remediation", "worker",
        "--redis-url", settings.redis_url, "--playbooks", REGISTRY_REF,
    ]  # fmt: skip
    if settings.audit_file is not None:
        argv += ["--audit-file", str(settings.audit_file)]
    with log_path.open("ab") as log:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def store_for(settings: RemediationSettings) -> tuple[JobStore, redis.Redis]:
    """A synchronous store (and its client, to close) for assertions."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    return JobStore(client, settings.key_prefix, settings.retention_seconds), client


def wait_for(
    predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll until `predicate()` is truthy; AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")


def wait_terminal(store: JobStore, job_id: str, timeout: float = 15.0) -> Job:
    """Wait until the job has finished; return it."""

    def done() -> Job | None:
        job = store.get(job_id)
        return job if job is not None and job.status in TERMINAL else None

    result: Job = wait_for(done, timeout, what=f"job {job_id} to finish")
    return result


def post(url: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    """POST a payload with the token over real HTTP."""
    headers = {**AUTH, **kwargs.pop("headers", {})}
    return httpx.post(f"{url}/alerts", json=body, headers=headers, timeout=10, **kwargs)


def alertmanager_config_file(tmp_path: Path, receiver_ports: Sequence[int]) -> Path:
    """The generated Alertmanager config with short timings, its webhook receiver sending every
    notification to each test receiver on `receiver_ports`; written to `tmp_path`."""
    token_file = tmp_path / "webhook-token"
    token_file.write_text(TOKEN + "\n")
    spec = load_spec(None).spec
    first_url = f"http://127.0.0.1:{receiver_ports[0]}/alerts"
    timing = {
        "group_wait_seconds": 0.2,
        "group_interval_seconds": 1,
        "repeat_interval_seconds": 3600,
    }
    spec = spec.model_copy(
        update={
            "receiver": Receiver(url=first_url, bearer_token_file=str(token_file)),
            "timing": spec.timing.model_copy(update=timing),
        }
    )
    config = build_alertmanager_config(spec, build_rule_groups(spec))
    [webhook_receiver] = [r for r in config["receivers"] if r["name"] == RECEIVER]
    [first] = webhook_receiver["webhook_configs"]
    webhook_receiver["webhook_configs"] = [
        {**first, "url": f"http://127.0.0.1:{port}/alerts"} for port in receiver_ports
    ]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
