"""The drills: inject one real fault into the running stack and time the whole loop.

fault -> exporter/gateway series -> Prometheus rule -> Alertmanager -> webhook -> playbook ->
recovery. Every time is measured from the moment the fault was injected:

- detect: the alert is `firing` in Prometheus's `/api/v1/alerts` (polled every 0.1 s);
- notify: the receiver got the webhook (the job's `created_at` in `/jobs`; for an alert without a
  playbook, the receiver's `alert.acknowledged` audit record);
- playbook start: the job's first recorded step (its plan);
- remediate: the playbook's verify step succeeded (for the drills without a playbook, when the
  drill's own repair is confirmed, e.g. the exporter answers again);
- recover: the alert is no longer active in Prometheus.

Beside fault -> playbook start each result shows the pipeline budget (scrape + eval + `for` +
group_wait, from the spec's local profile) + 2 s. Some faults need time before the SLI can cross
its threshold at all (a replica is stale only once the canary is 12 s old; an RPO of 3 s is
breached 3 s after the first unreplicated write; the rollback gate needs its 2000 requests);
that `condition_delay` is measured per drill and `within_budget` compares
(fault -> playbook start) - condition_delay with the budget + 2 s.

Each drill restores what it broke and waits until the stack is back to normal, so the next drill
starts clean. Results are plain data (`DrillResult.as_dict()`), written as JSON by the caller.
"""

from __future__ import annotations

import contextlib
import fcntl
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import httpx
import numpy as np
import redis

from redline.devstack.config import (
    ADAPTER,
    COLLECTION,
    INDEX_DIM,
    PRIMARY_INDEX,
    REPLICA_INDEX,
    Endpoints,
    StackLayout,
    pipeline_budget_seconds,
)
from redline.devstack.loadgen import summarize_stats
from redline.devstack.runtime import StackState, part_alive, restart_part, signal_part
from redline.devstack.spot_drills import SPOT_DRILLS
from redline.platform.index import (
    DeltaLog,
    IndexWriter,
    MilvusTarget,
    TargetSpec,
    to_vector,
    vector_checksum,
)
from redline.platform.routing import RoutingStore
from redline.platform.sessions import SessionWriter, open_redis, stream_id_ms
from redline.platform.snapshots import SnapshotRegistry
from redline.rules.build import p99_record, rollback_records
from redline.slo.spec import Spec, parse_duration

T = TypeVar("T")
Progress = Callable[[str, str], None]
DRILL_ORDER = (
    "exporter-down",
    "session-rpo",
    "staleness",
    "latency",
    "regression",
    "regression-negative",
)
"""`all` runs the drills in this order: the rollback gate's alert outlives its rollback by the
gate's 300 s window, so the regressions come last and their recovery is awaited at the end."""
REGRESSION_VERSION = "v2"
NEGATIVE_VERSION = "v3"
GOOD_VERSION = "v1"


class DrillError(Exception):
    """A drill could not run or its loop did not close; the message says which step."""


@dataclass(frozen=True)
class Check:
    """One assertion a drill made about the stack."""

    name: str
    ok: bool
    detail: str


@dataclass
class DrillResult:
    """Everything a drill measured; times are unix seconds, durations are from the fault."""

    drill: str
    alert: str
    playbook: str | None
    budget_seconds: float
    fault: str = ""
    fault_at: float | None = None
    condition_delay: float = 0.0
    condition_basis: str = ""
    firing_at: float | None = None
    pending_at: float | None = None
    notified_at: float | None = None
    playbook_started_at: float | None = None
    remediated_at: float | None = None
    recovered_at: float | None = None
    resolved_notified_at: float | None = None
    lost: int | None = None
    lost_detail: str = ""
    failed_requests: int | None = None
    failed_detail: str = ""
    expect_alert: bool = True
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    job_id: str | None = None
    finished_at: float | None = None

    def since_fault(self, when: float | None) -> float | None:
        """Seconds from the fault to `when`."""
        if when is None or self.fault_at is None:
            return None
        return round(when - self.fault_at, 3)

    @property
    def fault_to_playbook_start(self) -> float | None:
        """Fault -> first step of the playbook."""
        return self.since_fault(self.playbook_started_at)

    @property
    def pipeline_end(self) -> float | None:
        """Fault -> the end of the alerting pipeline: the playbook's start, or (for an alert
        without a playbook) the webhook's arrival."""
        if self.playbook is not None:
            return self.fault_to_playbook_start
        return self.since_fault(self.notified_at)

    @property
    def within_budget(self) -> bool | None:
        """(fault -> pipeline end) - condition delay <= budget + 2 s."""
        end = self.pipeline_end
        if end is None:
            return None
        return end - self.condition_delay <= self.budget_seconds + 2.0

    @property
    def ok(self) -> bool:
        """The loop closed (or, for a negative drill, stayed closed) and nothing was lost."""
        if self.error is not None or not all(check.ok for check in self.checks):
            return False
        if self.lost:
            return False
        if not self.expect_alert:
            return self.firing_at is None
        return self.firing_at is not None and self.recovered_at is not None

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Record a check; returns `ok`."""
        self.checks.append(Check(name, ok, detail))
        return ok

    def as_dict(self) -> dict[str, Any]:
        """JSON form (durations in seconds from the fault, null when not reached)."""
        return {
            "drill": self.drill,
            "ok": self.ok,
            "alert": self.alert,
            "playbook": self.playbook,
            "fault": self.fault,
            "fault_at": self.fault_at,
            "expect_alert": self.expect_alert,
            "time_to_detect": self.since_fault(self.firing_at),
            "time_to_notify": self.since_fault(self.notified_at),
            "time_to_playbook_start": self.fault_to_playbook_start,
            "time_to_pipeline_end": self.pipeline_end,
            "time_to_remediate": self.since_fault(self.remediated_at),
            "time_to_recover": self.since_fault(self.recovered_at),
            "time_to_resolved_notification": self.since_fault(self.resolved_notified_at),
            "alert_pending_after": self.since_fault(self.pending_at),
            "condition_delay": round(self.condition_delay, 3),
            "condition_basis": self.condition_basis,
            "pipeline_budget": self.budget_seconds,
            "pipeline_budget_plus_2s": round(self.budget_seconds + 2.0, 3),
            "within_budget": self.within_budget,
            "lost": self.lost,
            "lost_detail": self.lost_detail,
            "failed_requests": self.failed_requests,
            "failed_detail": self.failed_detail,
            "job_id": self.job_id,
            "checks": [vars(check) for check in self.checks],
            "notes": list(self.notes),
            "error": self.error,
            "duration": self.since_fault(self.finished_at),
        }


def parse_time(text: str) -> float:
    """Unix seconds of an ISO-8601 timestamp (Prometheus, Alertmanager and the receiver)."""
    value = text.strip().replace("Z", "+00:00")
    head, dot, rest = value.partition(".")
    if dot:
        # Prometheus writes nanoseconds; Python parses at most microseconds.
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        value = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(value).timestamp()


def labels_match(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """True when every wanted label has the wanted value."""
    return all(labels.get(key) == value for key, value in wanted.items())


class StackProbe:
    """The drills' view of the stack over its APIs (Prometheus, receiver, simulators, files)."""

    def __init__(self, state: StackState, http: httpx.Client) -> None:
        self.state = state
        self.endpoints: Endpoints = state.endpoints()
        self.layout: StackLayout = state.layout()
        self.http = http
        self.token = self.layout.token_file.read_text("utf-8").strip()

    def alerts(self, name: str, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Prometheus's active alerts called `name` with these labels (pending or firing)."""
        response = self.http.get(f"{self.endpoints.prometheus_url}/api/v1/alerts")
        response.raise_for_status()
        alerts = response.json()["data"]["alerts"]
        wanted = {"alertname": name, **(labels or {})}
        return [a for a in alerts if labels_match(a["labels"], wanted)]

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's series and values."""
        response = self.http.get(
            f"{self.endpoints.prometheus_url}/api/v1/query", params={"query": promql}
        )
        response.raise_for_status()
        return [(r["metric"], float(r["value"][1])) for r in response.json()["data"]["result"]]

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[tuple[float, float]]:
        """A range query's samples of its first series (time, value)."""
        response = self.http.get(
            f"{self.endpoints.prometheus_url}/api/v1/query_range",
            params={"query": promql, "start": start, "end": end, "step": step},
        )
        response.raise_for_status()
        result = response.json()["data"]["result"]
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []

    def value(self, promql: str) -> float | None:
        """The single value of an instant query, None when it has no series."""
        series = self.query(promql)
        return series[0][1] if series else None

    def jobs(self, playbook: str) -> list[dict[str, Any]]:
        """The receiver's recent jobs of a playbook, newest first."""
        response = self.http.get(
            f"{self.endpoints.receiver_url}/jobs",
            params={"playbook": playbook, "limit": 200},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        response.raise_for_status()
        jobs: list[dict[str, Any]] = response.json()["jobs"]
        return jobs

    def job(self, job_id: str) -> dict[str, Any]:
        """One job with its recorded steps (the list endpoint leaves steps out)."""
        response = self.http.get(
            f"{self.endpoints.receiver_url}/jobs/{job_id}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        return job

    def audit(self) -> list[dict[str, Any]]:
        """The receiver's audit trail mirror (JSONL)."""
        import json

        try:
            lines = self.layout.audit_file.read_text("utf-8").splitlines()
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a line being written right now
        return records

    def faults(self, region: str) -> dict[str, Any]:
        """A simulator's fault knobs."""
        response = self.http.get(f"{self.endpoints.simulator_url(region)}/admin/faults")
        response.raise_for_status()
        faults: dict[str, Any] = response.json()
        return faults

    def set_faults(self, region: str, faults: Mapping[str, Any]) -> None:
        """Replace a simulator's fault knobs."""
        response = self.http.post(
            f"{self.endpoints.simulator_url(region)}/admin/faults", json=dict(faults)
        )
        if response.status_code != 200:
            raise DrillError(f"{region}: faults rejected: HTTP {response.status_code}: "
                             f"{response.text[:300]}")  # fmt: skip

    def load_adapter(self, version_dir: str) -> None:
        """Serve the adapter at `version_dir` on every region (vLLM's runtime LoRA API)."""
        for region in self.endpoints.regions:
            body = {"lora_name": ADAPTER, "lora_path": version_dir, "load_inplace": True}
            url = f"{self.endpoints.simulator_url(region)}/v1/load_lora_adapter"
            response = self.http.post(url, json=body)
            if response.status_code != 200:
                raise DrillError(f"{region}: load {version_dir}: HTTP {response.status_code}")

    def served_versions(self) -> dict[str, str]:
        """Region -> version of the adapter each simulator serves."""
        versions = {}
        for region in self.endpoints.regions:
            stats = self.http.get(f"{self.endpoints.simulator_url(region)}/admin/stats").json()
            versions[region] = stats["adapters"].get(ADAPTER, {}).get("version", "none")
        return versions

    def loadgen_failures(self) -> dict[str, int]:
        """Requests the load generator saw fail so far, by HTTP status (or `error`)."""
        stats = summarize_stats(self.layout.loadgen_stats) or {}
        statuses: dict[str, int] = stats.get("statuses", {})
        return {status: int(n) for status, n in statuses.items() if status != "200"}


@dataclass
class DrillContext:
    """What a drill is given: the stack, its probe, a Redis client, and where to report."""

    state: StackState
    spec: Spec
    probe: StackProbe
    progress: Progress
    poll_seconds: float = 0.1
    defer_recovery: bool = False
    deferred: list[DeferredRecovery] = field(default_factory=list)

    @property
    def endpoints(self) -> Endpoints:
        """The stack's URLs."""
        return self.probe.endpoints

    def say(self, drill: str, message: str) -> None:
        """Report progress."""
        self.progress(drill, message)

    def wait_for(
        self,
        drill: str,
        what: str,
        check: Callable[[], T | None],
        timeout: float,
        interval: float | None = None,
    ) -> T:
        """Poll `check` until it returns a value; DrillError after `timeout` seconds."""
        started = time.monotonic()
        last_report = 0.0
        while True:
            try:
                value = check()
            except (httpx.HTTPError, redis.RedisError) as exc:
                value = None
                self.say(drill, f"{what}: {type(exc).__name__}: {exc}")
            if value is not None:
                return value
            waited = time.monotonic() - started
            if waited > timeout:
                raise DrillError(f"timed out after {timeout:g} s waiting for {what}")
            if waited - last_report >= 1.0:
                last_report = waited
                self.say(drill, f"waiting for {what} ({waited:.0f} s)")
            time.sleep(interval or self.poll_seconds)


@dataclass
class DeferredRecovery:
    """An alert whose resolution is awaited in the background while other drills run."""

    result: DrillResult
    labels: dict[str, str]
    deadline: float


# ---- shared steps ------------------------------------------------------------------------------


def budget_for(ctx: DrillContext, for_seconds: float) -> float:
    """The pipeline budget of an alert with this `for` (one more scrape through federation)."""
    federated = ctx.endpoints.federated
    return round(pipeline_budget_seconds(ctx.spec, for_seconds, federated), 3)


def require_quiet(ctx: DrillContext, result: DrillResult, labels: Mapping[str, str]) -> None:
    """The drill's alert must not be active before the fault (wait a little for a previous one)."""

    def quiet() -> bool | None:
        return True if not ctx.probe.alerts(result.alert, labels) else None

    ctx.wait_for(result.drill, f"{result.alert} to be inactive before the fault", quiet, 90.0)


def wait_firing(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    """Wait for the alert to fire; record when (and when it went pending)."""

    def firing() -> dict[str, Any] | None:
        for alert in ctx.probe.alerts(result.alert, labels):
            if alert["state"] == "firing":
                return alert
        return None

    alert = ctx.wait_for(result.drill, f"{result.alert} to fire", firing, timeout)
    result.firing_at = time.time()
    if alert.get("activeAt"):
        result.pending_at = parse_time(alert["activeAt"])
    ctx.say(result.drill, f"{result.alert} firing after {result.since_fault(result.firing_at)} s")
    return alert


def _job_matches(job: Mapping[str, Any], alertname: str, labels: Mapping[str, str]) -> bool:
    alert = job.get("alert") or {}
    return labels_match(alert.get("labels") or {}, {"alertname": alertname, **labels})


def wait_job(
    ctx: DrillContext,
    result: DrillResult,
    playbook: str,
    labels: Mapping[str, str],
    status: str,
    timeout: float,
) -> dict[str, Any]:
    """Wait for the receiver's job of this alert (firing or resolved) created after the fault."""
    after = (result.fault_at or 0.0) - 1.0

    def created() -> dict[str, Any] | None:
        for job in ctx.probe.jobs(playbook):
            if not _job_matches(job, result.alert, labels):
                continue
            if (job.get("alert") or {}).get("status") != status:
                continue
            if parse_time(job["created_at"]) >= after:
                return job
        return None

    return ctx.wait_for(result.drill, f"the {status} webhook at the receiver", created, timeout)


def wait_job_done(
    ctx: DrillContext, drill: str, playbook: str, job_id: str, timeout: float
) -> dict[str, Any]:
    """Wait until a job ends; DrillError naming its error when it failed."""

    def done() -> dict[str, Any] | None:
        job = ctx.probe.job(job_id)
        return job if job["status"] in ("succeeded", "failed", "planned") else None

    job = ctx.wait_for(drill, f"job {job_id} ({playbook}) to finish", done, timeout, 0.2)
    if job["status"] != "succeeded":
        raise DrillError(f"job {job_id} ({playbook}) ended {job['status']}: {job.get('error')}")
    return job


def step_time(job: Mapping[str, Any], phase: str, name: str | None = None) -> float | None:
    """When the job recorded its first step of `phase` (and `name`), ok or not."""
    for step in job.get("steps") or []:
        if step.get("phase") == phase and (name is None or step.get("name") == name):
            return float(step["at"])
    return None


def run_playbook_loop(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    """Notification -> playbook start -> verified, from the receiver's job record."""
    assert result.playbook is not None
    job = wait_job(ctx, result, result.playbook, labels, "firing", timeout)
    result.job_id = job["id"]
    result.notified_at = parse_time(job["created_at"])
    ctx.say(result.drill, f"webhook received: job {job['id']} ({result.playbook})")
    job = wait_job_done(ctx, result.drill, result.playbook, job["id"], timeout)
    result.playbook_started_at = step_time(job, "plan")
    verify = [s for s in job.get("steps") or [] if s.get("phase") == "verify" and s.get("ok")]
    if verify:
        result.remediated_at = float(verify[-1]["at"])
        result.check("playbook verified", True, str(verify[-1].get("detail", "")))
    else:
        result.check("playbook verified", False, "the job succeeded without a verify record")
    ctx.say(
        result.drill, f"{result.playbook} verified: {verify[-1].get('detail') if verify else ''}"
    )
    return job


def wait_acknowledged(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], status: str, timeout: float
) -> float:
    """When the receiver acknowledged the webhook of an alert without a playbook (audit trail)."""
    after = (result.fault_at or 0.0) - 1.0

    def seen() -> float | None:
        for record in ctx.probe.audit():
            data = record.get("data") or {}
            if record.get("kind") != "alert.acknowledged" or data.get("status") != status:
                continue
            if not labels_match(data.get("labels") or {}, {"alertname": result.alert, **labels}):
                continue
            at = parse_time(str(record["ts"]))
            if at >= after:
                return at
        return None

    return ctx.wait_for(result.drill, f"the {status} webhook at the receiver", seen, timeout)


def wait_recovered(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], timeout: float
) -> None:
    """Wait until the alert is no longer active in Prometheus."""

    def gone() -> bool | None:
        return True if not ctx.probe.alerts(result.alert, labels) else None

    ctx.wait_for(result.drill, f"{result.alert} to resolve", gone, timeout)
    result.recovered_at = time.time()
    ctx.say(result.drill, f"recovered after {result.since_fault(result.recovered_at)} s")


# ---- latency -----------------------------------------------------------------------------------

LATENCY_FAULT_SECONDS = 0.9


def drill_latency(ctx: DrillContext) -> DrillResult:
    """Primary P99 over the red line -> RedLineLatencyP99 -> reroute -> P99 fine via secondary."""
    spec = ctx.spec
    red = spec.red_lines.latency_p99
    primary, secondary = ctx.endpoints.regions[0], ctx.endpoints.regions[1]
    result = DrillResult(
        "latency", "RedLineLatencyP99", red.playbook, budget_for(ctx, red.for_seconds)
    )
    labels = {"region": primary}
    require_quiet(ctx, result, labels)
    store = RoutingStore.from_url(ctx.endpoints.redis_url, regions=tuple(ctx.endpoints.regions))
    saved = ctx.probe.faults(primary)
    try:
        override = store.get_override()
        if override is not None:
            raise DrillError(f"a routing override is already set ({override}); clear it first")
        slow = {**saved, "latency": {"base_seconds": LATENCY_FAULT_SECONDS, "jitter": "none"}}
        result.fault = f"{primary}: +{LATENCY_FAULT_SECONDS} s on every request"
        result.fault_at = time.time()
        ctx.probe.set_faults(primary, slow)
        result.condition_delay = LATENCY_FAULT_SECONDS
        result.condition_basis = "the first slow request completes one injected latency later"
        ctx.say(result.drill, f"fault injected: {result.fault}")
        wait_firing(ctx, result, labels, 60.0)
        run_playbook_loop(ctx, result, labels, 60.0)
        now = store.get_override()
        result.check(
            "gateway routes to the secondary",
            now is not None and now.target_region == secondary,
            f"override: {now.target_region if now else None}",
        )
        record = p99_record(spec)
        threshold = red.threshold_seconds

        def secondary_ok() -> float | None:
            value = ctx.probe.value(f'{record}{{region="{secondary}"}}')
            return value if value is not None and value <= threshold else None

        p99 = ctx.wait_for(result.drill, f"P99 via {secondary} under {threshold} s",
                           secondary_ok, 30.0, 0.5)  # fmt: skip
        result.check(
            f"P99 via {secondary} under the red line", True, f"{p99:.3f} s <= {threshold} s"
        )
        ctx.say(result.drill, f"repairing {primary} (fault removed)")
        ctx.probe.set_faults(primary, saved)
        wait_recovered(ctx, result, labels, parse_duration(red.window) + 60.0)
        resolved = wait_job(ctx, result, "reroute", labels, "resolved", 30.0)
        result.resolved_notified_at = parse_time(resolved["created_at"])
        wait_job_done(ctx, result.drill, "reroute", resolved["id"], 90.0)

        def restored() -> bool | None:
            return True if store.get_override() is None else None

        ctx.wait_for(result.drill, "the routing to be restored", restored, 30.0)
        result.check("routing restored after the hold-down", True, "override cleared")
    finally:
        ctx.probe.set_faults(primary, saved)
        store.close()
    result.lost_detail = "n/a: a reroute moves requests, it writes no data"
    return result


# ---- staleness ---------------------------------------------------------------------------------


class _AckedWriter:
    """Writes rows through the index write path in a thread, remembering every acknowledgement."""

    def __init__(self, ctx: DrillContext, prefix: str, rate: float = 10.0) -> None:
        endpoints = ctx.endpoints
        self.client = redis.Redis.from_url(endpoints.redis_url, socket_timeout=10)
        self.log = DeltaLog(self.client, COLLECTION, INDEX_DIM)
        spec = TargetSpec(endpoints.milvus_primary_uri, COLLECTION, PRIMARY_INDEX)
        self.primary = MilvusTarget(spec, INDEX_DIM, 10.0)
        self.writer = IndexWriter(self.log, self.primary, endpoints.regions[0])
        self.prefix = prefix
        self.rate = rate
        self.acked: dict[str, str] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill-writer", daemon=True)
        self.rng = np.random.default_rng(int(time.time()))

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            row_id = f"{self.prefix}{n}"
            vector = self.rng.standard_normal(INDEX_DIM).astype(np.float32)
            try:
                self.writer.upsert(row_id, vector)
            except Exception as exc:  # an unacknowledged write is not owed; count it apart
                self.errors.append(f"{row_id}: {type(exc).__name__}: {exc}")
            else:
                self.acked[row_id] = vector_checksum(to_vector(vector, INDEX_DIM))
            n += 1
            self.stop.wait(1.0 / self.rate)

    def start(self) -> None:
        """Start writing."""
        self.thread.start()

    def finish(self) -> None:
        """Stop writing and wait for the last write."""
        self.stop.set()
        self.thread.join(10)

    def missing(self, target: MilvusTarget) -> list[str]:
        """Acknowledged rows absent from `target` or with another vector."""
        rows = target.fetch(list(self.acked))
        return [i for i, checksum in self.acked.items() if rows.get(i) is None
                or rows[i].checksum != checksum]  # fmt: skip

    def close(self) -> None:
        """Release the Milvus and Redis connections."""
        self.primary.close()
        self.client.close()


def drill_staleness(ctx: DrillContext) -> DrillResult:
    """Replicator stalled -> RedLineIndexStaleness -> freeze_and_replay -> replica caught up."""
    spec = ctx.spec
    red = spec.red_lines.index_consistency
    result = DrillResult(
        "staleness", "RedLineIndexStaleness", red.playbook, budget_for(ctx, red.for_seconds)
    )
    labels = {"collection": COLLECTION}
    require_quiet(ctx, result, labels)
    writer = _AckedWriter(ctx, f"drill-staleness-{uuid.uuid4().hex[:6]}-")
    log = writer.log
    replica = MilvusTarget(
        TargetSpec(ctx.endpoints.milvus_replica_uri, COLLECTION, REPLICA_INDEX), INDEX_DIM, 10.0
    )
    try:
        if log.freeze_state() is not None:
            raise DrillError("writes are frozen before the drill; unfreeze them first")
        writer.start()
        time.sleep(1.0)
        result.fault = f"replicator of {REPLICA_INDEX} paused (stalled)"
        result.fault_at = time.time()
        log.set_paused(REPLICA_INDEX, True)
        ctx.say(result.drill, f"fault injected: {result.fault}")
        wait_firing(ctx, result, labels, 60.0)
        canary = writer.client.hgetall(log.canary_key(REPLICA_INDEX))
        canary_ms = int(canary.get(b"ts_ms", b"0"))
        if canary_ms:
            onset = canary_ms / 1000.0 + red.max_staleness_seconds
            result.condition_delay = max(0.0, onset - result.fault_at)
        result.condition_basis = (
            f"the outstanding canary is {red.max_staleness_seconds:g} s old (the red line)"
        )
        run_playbook_loop(ctx, result, labels, 120.0)
        result.check(
            "writes unfrozen after the verified replay",
            log.freeze_state() is None,
            f"freeze flag: {log.freeze_state()}",
        )
        ctx.say(result.drill, "repairing the replicator (resumed)")
        log.set_paused(REPLICA_INDEX, False)
        wait_recovered(ctx, result, labels, 60.0)
        resolved = wait_job(ctx, result, str(red.playbook), labels, "resolved", 30.0)
        result.resolved_notified_at = parse_time(resolved["created_at"])
        wait_job_done(ctx, result.drill, str(red.playbook), resolved["id"], 60.0)
    finally:
        log.set_paused(REPLICA_INDEX, False)
        writer.finish()
    try:

        def caught_up() -> bool | None:
            pending, _ = log.pending(REPLICA_INDEX)
            return True if pending == 0 else None

        ctx.wait_for(result.drill, "the replica to catch up", caught_up, 60.0, 0.5)
        lost_replica = writer.missing(replica)
        lost_primary = writer.missing(writer.primary)
    finally:
        replica.close()
        writer.close()
    result.lost = len(set(lost_replica) | set(lost_primary))
    result.lost_detail = (
        f"{len(writer.acked)} acknowledged writes; missing or different on the replica: "
        f"{len(lost_replica)}, on the primary: {len(lost_primary)}"
        + (f"; {len(writer.errors)} writes not acknowledged" if writer.errors else "")
    )
    result.check("acknowledged writes on the replica", not lost_replica, result.lost_detail)
    return result


# ---- session RPO -------------------------------------------------------------------------------


def drill_session_rpo(ctx: DrillContext) -> DrillResult:
    """Replica consumer frozen (stops reading and ACKing) -> SessionRPOBreach -> resumed."""
    spec = ctx.spec
    target = spec.rpo.session_state
    result = DrillResult("session-rpo", "SessionRPOBreach", target.playbook,
                         budget_for(ctx, target.for_seconds))  # fmt: skip
    labels: dict[str, str] = {}
    require_quiet(ctx, result, labels)
    part = ctx.state.part("session-replica")
    if part is None or not part_alive(part):
        raise DrillError("the session replica consumer is not running")
    primary = open_redis(ctx.endpoints.redis_url, timeout_seconds=5.0)
    replica = open_redis(ctx.endpoints.session_replica_url, timeout_seconds=5.0)
    writer = SessionWriter(primary)
    run = uuid.uuid4().hex[:6]
    written: dict[str, str] = {}
    stopped = False
    try:
        result.fault = "session replica consumer frozen (SIGSTOP): it stops reading and ACKing"
        result.fault_at = time.time()
        signal_part(part, signal.SIGSTOP)
        stopped = True
        ctx.say(result.drill, f"fault injected: {result.fault}")
        first_id: str | None = None
        deadline = time.monotonic() + 60.0
        while result.firing_at is None and time.monotonic() < deadline:
            session = f"drill-rpo-{run}-{len(written)}"
            value = f'{{"turn": {len(written)}, "at": {time.time():.3f}}}'
            entry = writer.write(session, value)
            first_id = first_id or entry
            written[session] = value
            alerts = [a for a in ctx.probe.alerts(result.alert) if a["state"] == "firing"]
            if alerts:
                result.firing_at = time.time()
                result.pending_at = parse_time(alerts[0]["activeAt"])
                break
            time.sleep(0.2)
        if result.firing_at is None:
            raise DrillError(f"timed out after 60 s waiting for {result.alert} to fire")
        ctx.say(result.drill, f"{result.alert} firing after {result.since_fault(result.firing_at)}")
        assert first_id is not None
        onset = stream_id_ms(first_id) / 1000.0 + target.max_seconds
        result.condition_delay = max(0.0, onset - result.fault_at)
        result.condition_basis = (
            f"the first unreplicated write is {target.max_seconds:g} s old (the RPO)"
        )
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 30.0)
        result.notes.append("no playbook in the spec for session_state: the drill resumes it")
        ctx.say(result.drill, "repairing the consumer (SIGCONT)")
        signal_part(part, signal.SIGCONT)
        stopped = False
        result.remediated_at = time.time()
        wait_recovered(ctx, result, labels, 60.0)
        result.resolved_notified_at = wait_acknowledged(ctx, result, labels, "resolved", 30.0)
    finally:
        if stopped and part_alive(part):
            signal_part(part, signal.SIGCONT)

    def replicated() -> list[str] | None:
        missing = [s for s, v in written.items() if replica.get(writer.layout.key_for(s)) != v]
        return missing or None

    try:
        time.sleep(1.0)
        missing = replicated() or []
    finally:
        primary.close()
        replica.close()
    result.lost = len(missing)
    result.lost_detail = (
        f"{len(written)} session writes acknowledged during the fault; "
        f"{len(missing)} missing or different on the replica"
    )
    result.check("session writes on the replica", not missing, result.lost_detail)
    return result


# ---- exporter down -----------------------------------------------------------------------------

EXPORTER_SLIS = ("session_rpo", "index_staleness")


def drill_exporter_down(ctx: DrillContext) -> DrillResult:
    """Exporter killed -> SLIAbsent (no silent red line) -> exporter restarted -> resolved."""
    spec = ctx.spec
    result = DrillResult("exporter-down", "SLIAbsent", None,
                         budget_for(ctx, spec.timing.absent_for_seconds))  # fmt: skip
    labels = {"sli": EXPORTER_SLIS[0]}
    for sli in EXPORTER_SLIS:
        require_quiet(ctx, result, {"sli": sli})
    part = ctx.state.part("exporters")
    if part is None or not part_alive(part):
        raise DrillError("the exporter is not running")
    result.fault = f"exporter process killed (SIGKILL, pid {part.pid})"
    result.fault_at = time.time()
    signal_part(part, signal.SIGKILL)
    ctx.say(result.drill, f"fault injected: {result.fault}")
    result.condition_basis = "its series go stale at the next failed scrape"
    try:
        wait_firing(ctx, result, labels, 60.0)
        others = [s for s in EXPORTER_SLIS[1:] if ctx.probe.alerts(result.alert, {"sli": s})]
        result.check(
            "every SLI of the exporter is reported absent",
            len(others) == len(EXPORTER_SLIS) - 1,
            f"also active: {', '.join(others) or 'none'}",
        )
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 30.0)
    finally:
        ctx.say(result.drill, "restarting the exporter")
        fresh = restart_part(ctx.state, "exporters")
    result.remediated_at = time.time()
    result.notes.append(f"no playbook: the stack restarted the exporter (new pid {fresh.pid})")
    wait_recovered(ctx, result, labels, 60.0)
    for sli in EXPORTER_SLIS[1:]:

        def resolved(sli: str = sli) -> bool | None:
            return True if not ctx.probe.alerts(result.alert, {"sli": sli}) else None

        ctx.wait_for(result.drill, f"SLIAbsent {sli} to resolve", resolved, 30.0)
    result.resolved_notified_at = wait_acknowledged(ctx, result, labels, "resolved", 30.0)
    result.lost_detail = "n/a: a dead exporter loses measurements, not user data"
    return result


# ---- regressions -------------------------------------------------------------------------------


def _deploy(ctx: DrillContext, version: str) -> None:
    registry = SnapshotRegistry(ctx.probe.layout.snapshots_dir)
    snapshot = next(s for s in registry.list(ADAPTER) if s.version == version)
    registry.activate(ADAPTER, snapshot.snapshot_id)
    ctx.probe.load_adapter(str(ctx.probe.layout.adapter_dir(version)))


def _set_version_faults(ctx: DrillContext, version: str, faults: Mapping[str, Any] | None) -> None:
    for region in ctx.endpoints.regions:
        current = ctx.probe.faults(region)
        versions = dict(current.get("versions") or {})
        if faults is None:
            versions.pop(version, None)
        else:
            versions[version] = dict(faults)
        ctx.probe.set_faults(region, {**current, "versions": versions})


def _baseline(ctx: DrillContext, version: str) -> tuple[float, float]:
    registry = SnapshotRegistry(ctx.probe.layout.snapshots_dir)
    snapshot = next(s for s in registry.list(ADAPTER) if s.version == version)
    if snapshot.baselines is None:
        raise DrillError(f"{ADAPTER} {version} has no baselines (was `redline up` completed?)")
    return snapshot.baselines.p99_seconds, snapshot.baselines.accuracy_ratio


def regression_latency(spec: Spec, baseline_p99: float) -> float:
    """Latency to add so P99 clears the gate's ratio but stays under the red line."""
    gate = (1 + spec.rollback.p99_increase_ratio) * baseline_p99
    added = max(0.15, gate - baseline_p99 + 0.1)
    if baseline_p99 + added >= spec.red_lines.latency_p99.threshold_seconds - 0.1:
        raise DrillError(
            f"baseline P99 {baseline_p99:.3f} s leaves no room between the rollback gate "
            f"({gate:.3f} s) and the latency red line"
        )
    return round(added, 3)


def _gate_series(ctx: DrillContext, version: str) -> dict[str, float | None]:
    records = rollback_records(ctx.spec)
    selector = f'{{model="{ADAPTER}",model_version="{version}"}}'
    return {name: ctx.probe.value(record + selector) for name, record in records.items()}


def _restore_good(ctx: DrillContext, version: str) -> None:
    _deploy(ctx, GOOD_VERSION)
    _set_version_faults(ctx, version, None)


def _gate_onset(ctx: DrillContext, version: str, start: float, end: float) -> float | None:
    """When the gate's traffic and accuracy conditions first both held: the first rule
    evaluation at or after `start` where the recorded request count reached `min_samples` and
    the recorded accuracy was below the baseline by more than the drop, less one scrape and one
    evaluation interval (both may have held that much earlier). The latency condition holds
    from the first slow request on and is checked separately."""
    gate = ctx.spec.rollback
    timing = ctx.spec.timing
    records = rollback_records(ctx.spec)
    selector = f'{{model="{ADAPTER}",model_version="{version}"}}'
    query = (
        f"({records['requests']}{selector} >= {gate.min_samples})\n"
        f"and on (model, model_version)\n"
        f"(max by (model, model_version) (model_baseline_accuracy_ratio{selector})\n"
        f" - on (model, model_version) {records['accuracy']}{selector} > {gate.accuracy_drop})"
    )
    samples = ctx.probe.query_range(query, start, end, timing.evaluation_interval_seconds)
    if not samples:
        return None
    return max(
        start, samples[0][0] - timing.scrape_interval_seconds - timing.evaluation_interval_seconds
    )


def drill_regression(ctx: DrillContext) -> DrillResult:
    """v2 slower and less accurate -> SemanticRollbackTwoSignal -> semantic_rollback to v1."""
    spec = ctx.spec
    gate = spec.rollback
    version = REGRESSION_VERSION
    result = DrillResult("regression", "SemanticRollbackTwoSignal", gate.playbook,
                         budget_for(ctx, gate.for_seconds))  # fmt: skip
    labels = {"model": ADAPTER, "model_version": version}
    require_quiet(ctx, result, labels)
    baseline_p99, baseline_accuracy = _baseline(ctx, version)
    added = regression_latency(spec, baseline_p99)
    faults = {
        "latency": {"base_seconds": added, "jitter": "none"},
        "wrong_answer_probability": 0.5,
    }
    expected = gate.min_samples / max(1.0, ctx.state.rate * 0.85)
    try:
        result.fault = (
            f"deploy {ADAPTER} {version}: +{added} s latency and half the golden answers wrong "
            f"(baseline p99 {baseline_p99:.3f} s, accuracy {baseline_accuracy:.3f})"
        )
        result.fault_at = time.time()
        _set_version_faults(ctx, version, faults)
        _deploy(ctx, version)
        ctx.say(result.drill, f"fault injected: {result.fault}")
        wait_firing(ctx, result, labels, expected + 120.0)
        series = _gate_series(ctx, version)
        result.check(
            "the gate's three signals",
            True,
            f"p99 {series['p99']}, accuracy {series['accuracy']}, requests {series['requests']}",
        )
        onset = _gate_onset(ctx, version, result.fault_at, time.time())
        if onset is not None:
            result.condition_delay = max(0.0, onset - result.fault_at)
        result.condition_basis = (
            f"{gate.min_samples} requests of {version} within {gate.window_seconds} s and its "
            "accuracy under the baseline (first evaluation showing both, less a scrape and an "
            "evaluation interval)"
        )
        run_playbook_loop(ctx, result, labels, 180.0)
        registry = SnapshotRegistry(ctx.probe.layout.snapshots_dir)
        active = registry.active(ADAPTER)
        result.check(
            f"{GOOD_VERSION} active again",
            active is not None and active.version == GOOD_VERSION and active.verified,
            f"active: {active.version if active else None}",
        )
        served = ctx.probe.served_versions()
        result.check(
            f"every region serves {GOOD_VERSION}",
            set(served.values()) == {GOOD_VERSION},
            ", ".join(f"{r}={v}" for r, v in served.items()),
        )
    finally:
        _set_version_faults(ctx, version, None)
        if result.remediated_at is None:
            _restore_good(ctx, version)
    result.lost_detail = "n/a: a rollback switches adapters, it writes no data"
    result.notes.append(
        f"the gate's {gate.window_seconds} s window keeps {version}'s requests after the "
        "rollback, so the alert resolves once they leave it"
    )
    timeout = gate.window_seconds + 120.0
    if ctx.defer_recovery:
        ctx.deferred.append(DeferredRecovery(result, labels, time.time() + timeout))
    else:
        wait_recovered(ctx, result, labels, timeout)
    return result


def drill_regression_negative(ctx: DrillContext) -> DrillResult:
    """v3 slower only (accuracy intact, enough traffic) -> the two-signal gate stays quiet."""
    spec = ctx.spec
    gate = spec.rollback
    version = NEGATIVE_VERSION
    result = DrillResult("regression-negative", "SemanticRollbackTwoSignal", gate.playbook,
                         budget_for(ctx, gate.for_seconds))  # fmt: skip
    result.expect_alert = False
    labels = {"model": ADAPTER, "model_version": version}
    require_quiet(ctx, result, labels)
    baseline_p99, _ = _baseline(ctx, version)
    added = regression_latency(spec, baseline_p99)
    ratio = 1 + gate.p99_increase_ratio
    expected = gate.min_samples / max(1.0, ctx.state.rate * 0.85)
    jobs_before = {job["id"] for job in ctx.probe.jobs(str(gate.playbook))}
    try:
        result.fault = f"deploy {ADAPTER} {version}: +{added} s latency, answers still right"
        result.fault_at = time.time()
        _set_version_faults(ctx, version, {"latency": {"base_seconds": added, "jitter": "none"}})
        _deploy(ctx, version)
        ctx.say(result.drill, f"fault injected: {result.fault}")

        def latency_signal_with_traffic() -> dict[str, float | None] | None:
            series = _gate_series(ctx, version)
            p99, requests = series["p99"], series["requests"]
            if p99 is None or requests is None:
                return None
            if requests >= gate.min_samples and p99 >= ratio * baseline_p99:
                return series
            return None

        series = ctx.wait_for(result.drill, f"{gate.min_samples} requests of {version} with "
                              "the latency signal on", latency_signal_with_traffic,
                              expected + 120.0, 0.5)  # fmt: skip
        result.check(
            "latency signal on, with enough traffic",
            True,
            f"p99 {series['p99']:.3f} s >= {ratio:g} x {baseline_p99:.3f} s, "
            f"{series['requests']:.0f} requests",
        )
        hold = spec.timing.evaluation_interval_seconds * 3 + gate.for_seconds + 5.0
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline:
            alerts = ctx.probe.alerts(result.alert, labels)
            if alerts:
                if any(a["state"] == "firing" for a in alerts):
                    result.firing_at = time.time()
                result.check("gate stays quiet", False, f"{result.alert} went {alerts[0]['state']}")
                break
            time.sleep(0.25)
        else:
            result.check("gate stays quiet", True, f"no {result.alert} for {hold:g} s")
        accuracy = _gate_series(ctx, version)["accuracy"]
        result.check(
            "accuracy signal off",
            accuracy is not None,
            f"accuracy of {version}: {accuracy}",
        )
        new_jobs = [j for j in ctx.probe.jobs(str(gate.playbook)) if j["id"] not in jobs_before
                    and _job_matches(j, result.alert, labels)]  # fmt: skip
        result.check("no rollback job", not new_jobs, f"{len(new_jobs)} new job(s)")
        registry = SnapshotRegistry(ctx.probe.layout.snapshots_dir)
        active = registry.active(ADAPTER)
        result.check(f"{version} still active", active is not None and active.version == version,
                     f"active: {active.version if active else None}")  # fmt: skip
    finally:
        ctx.say(result.drill, f"restoring {GOOD_VERSION} (the operator rolls back by hand)")
        _restore_good(ctx, version)
    result.remediated_at = time.time()
    result.lost_detail = "n/a: no data is written"
    return result


DRILLS: dict[str, Callable[[DrillContext], DrillResult]] = {
    "latency": drill_latency,
    "staleness": drill_staleness,
    "regression": drill_regression,
    "regression-negative": drill_regression_negative,
    "session-rpo": drill_session_rpo,
    "exporter-down": drill_exporter_down,
    **SPOT_DRILLS,
}
"""The explicit registry of drills, by name."""


def resolve_names(names: Sequence[str]) -> list[str]:
    """The drills to run (`all` expands to every drill in DRILL_ORDER); DrillError if unknown."""
    wanted: list[str] = []
    for name in names:
        if name == "all":
            wanted += [n for n in DRILL_ORDER if n not in wanted]
        elif name in DRILLS:
            if name not in wanted:
                wanted.append(name)
        else:
            raise DrillError(f"unknown drill {name!r}; choose from: all, {', '.join(DRILL_ORDER)}")
    return wanted


def run_drill(name: str, ctx: DrillContext) -> DrillResult:
    """Run one drill; a drill that breaks off is a failed result carrying the reason."""
    started = time.time()
    failures = ctx.probe.loadgen_failures()
    try:
        result = DRILLS[name](ctx)
    except Exception as exc:  # one broken drill is a failed result; the others still run
        result = DrillResult(name, "", None, 0.0, fault_at=started)
        result.error = str(exc) if isinstance(exc, DrillError) else f"{type(exc).__name__}: {exc}"
        ctx.say(name, f"FAILED: {result.error}")
    result.finished_at = time.time()
    try:
        counts = ctx.probe.loadgen_failures()
    except OSError:
        counts = {}
    failed = {k: v - failures.get(k, 0) for k, v in counts.items() if v - failures.get(k, 0)}
    result.failed_requests = sum(failed.values())
    result.failed_detail = ", ".join(f"{n} x {status}" for status, n in sorted(failed.items()))
    return result


class DeferredWatcher:
    """Polls deferred alerts in a thread so their resolution is timed while other drills run."""

    def __init__(self, ctx: DrillContext, interval: float = 0.25) -> None:
        self.ctx = ctx
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill-recovery", daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5.0, trust_env=False) as http:
            probe = StackProbe(self.ctx.state, http)
            while not self.stop.wait(self.interval):
                for item in list(self.ctx.deferred):
                    if item.result.recovered_at is not None:
                        continue
                    try:
                        active = probe.alerts(item.result.alert, item.labels)
                    except httpx.HTTPError:
                        continue
                    if not active:
                        item.result.recovered_at = time.time()
                        self.ctx.say(item.result.drill, "recovered (alert resolved)")

    def __enter__(self) -> DeferredWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


@contextlib.contextmanager
def drill_lock(layout: StackLayout) -> Iterator[None]:
    """One drill run per stack at a time: two would break each other's faults."""
    with open(layout.root / ".drill.lock", "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DrillError(
                f"drills are already running on the stack in {layout.root}; wait for them"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_drills(
    names: Sequence[str],
    state: StackState,
    spec: Spec,
    progress: Progress,
    on_result: Callable[[DrillResult], None] | None = None,
) -> list[DrillResult]:
    """Run the named drills in sequence on one stack; deferred recoveries are awaited last."""
    wanted = resolve_names(names)
    results: list[DrillResult] = []
    with drill_lock(state.layout()), httpx.Client(timeout=10.0, trust_env=False) as http:
        ctx = DrillContext(state, spec, StackProbe(state, http), progress)
        ctx.defer_recovery = len(wanted) > 1
        with DeferredWatcher(ctx):
            for name in wanted:
                progress(name, "starting")
                result = run_drill(name, ctx)
                results.append(result)
                if any(item.result is result for item in ctx.deferred):
                    progress(name, "remediated; its alert resolves in the background")
                elif on_result is not None:
                    on_result(result)
            for item in ctx.deferred:
                if item.result.recovered_at is None:
                    remaining = max(1.0, item.deadline - time.time())

                    def resolved(r: DrillResult = item.result) -> bool | None:
                        return True if r.recovered_at is not None else None

                    try:
                        what = f"{item.result.alert} to resolve"
                        ctx.wait_for(item.result.drill, what, resolved, remaining, 0.5)
                    except DrillError as exc:
                        item.result.error = str(exc)
                item.result.finished_at = time.time()
                progress(
                    item.result.drill,
                    f"recovered after {item.result.since_fault(item.result.recovered_at)} s",
                )
                if on_result is not None:
                    on_result(item.result)
    return results


__all__ = [
    "DRILLS",
    "DRILL_ORDER",
    "Check",
    "DrillContext",
    "DrillError",
    "DrillResult",
    "StackProbe",
    "resolve_names",
    "run_drill",
    "run_drills",
]
