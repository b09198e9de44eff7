"""The redis-failover drill: the Redis primary is SIGKILLed in the middle of a burst of alerts
and index writes; the Sentinels promote the replica, clients follow it, and nothing that was
acknowledged (an alert answered 202, an index write acknowledged) is missing afterwards.

With replicas (`redline up --replicas 2`) every alert is posted to every receiver, as
Alertmanager does with one webhook per receiver, and the drill also checks that each alert made
exactly one job and at most one playbook run (the audit trail's `job.accepted` and
`job.finished` records), and that the exporters never ran the canaries twice: at most one holds
the canary lease at any moment, one holds it afterwards, and the canary probes ran no more often
across the replicas than one runner's interval allows.

Only a Sentinel stack (`redline up --redis sentinel`) can fail over; on the default stack the
drill reports that it does not apply. The old primary is started again afterwards (the
Sentinels make it a replica of the new one), so the stack keeps a replica.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
import yaml

from redline.core.redisconn import FAILOVER_ERRORS, open_redis, wait_for_replicas
from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.layout import (
    COLLECTION,
    INDEX_DIM,
    PRIMARY_INDEX,
    REPLICA_INDEX,
    SENTINEL_MASTER,
    SENTINEL_PARTS,
)
from redline.devstack.parts import part_alive, signal_part
from redline.devstack.processes import spawn, wait_until
from redline.devstack.state import write_state
from redline.platform.index import (
    DeltaLog,
    IndexWriter,
    MilvusTarget,
    TargetSpec,
    to_vector,
    vector_checksum,
)
from redline.remediation.audit import AuditLog
from redline.remediation.settings import RemediationSettings

NAME = "redis-failover"
DRILL_PLAYBOOK = "drill-redis-failover"
"""The playbook label of the burst's alerts: no such playbook exists, so the worker fails the
jobs at once and runs nothing; what counts here is that each job exists."""
ALERTS_PER_SECOND = 20.0
WRITES_PER_SECOND = 10.0
BEFORE_SECONDS = 2.0
"""Burst before the kill, so some acknowledgements happen on the old primary."""
AFTER_SECONDS = 3.0
"""Burst after clients write again, so some land on the new primary."""
FAILOVER_TIMEOUT = 60.0
CANARY_PROBES = ("index_staleness", "session_keepalive")
"""Canary probes whose runs are counted across exporter replicas (never doubled)."""
LEASE_POLL_SECONDS = 0.25


@dataclass
class _Tally:
    """What one burst saw, client-side."""

    acked: dict[str, str] = field(default_factory=dict)
    acked_at: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    unavailable_at: list[float] = field(default_factory=list)
    last_ok_at: float = 0.0

    def error(self, kind: str) -> None:
        """Count an unacknowledged attempt by kind."""
        self.errors[kind] = self.errors.get(kind, 0) + 1


def _alert(fingerprint: str) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    labels = {"alertname": "RedisFailoverDrill", "drill": NAME, "playbook": DRILL_PLAYBOOK}
    return {
        "status": "firing",
        "labels": {**labels, "burst": fingerprint},
        "annotations": {"summary": "redis-failover drill burst"},
        "startsAt": now,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://127.0.0.1/drill",
        "fingerprint": fingerprint,
    }


def _payload(fingerprint: str) -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="RedisFailoverDrill",burst="{fingerprint}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "redline-remediation",
        "groupLabels": {"alertname": "RedisFailoverDrill"},
        "commonLabels": {"alertname": "RedisFailoverDrill"},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [_alert(fingerprint)],
    }


class _AlertBurst:
    """POSTs one new alert at a time to every receiver (as Alertmanager notifies each webhook);
    an alert one of them answered 202 (or 200: already recorded) is acknowledged: remembers it
    and its job id."""

    def __init__(self, urls: list[str], token: str, prefix: str) -> None:
        self.urls = urls
        self.headers = {"Authorization": f"Bearer {token}"}
        self.prefix = prefix
        self.tally = _Tally()
        self.statuses: dict[int, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill-alerts", daemon=True)

    def _run(self) -> None:
        n = 0
        with httpx.Client(timeout=5.0, trust_env=False) as http:
            while not self.stop.is_set():
                fingerprint = f"{self.prefix}{n:010x}"  # hex: what Alertmanager sends
                n += 1
                body = _payload(fingerprint)  # one startsAt: the same alert for every receiver
                for url in self.urls:
                    self._post(http, url, fingerprint, body)
                self.stop.wait(1.0 / ALERTS_PER_SECOND)

    def _post(self, http: httpx.Client, url: str, fingerprint: str, body: dict[str, Any]) -> None:
        try:
            answer = http.post(url, json=body, headers=self.headers)
        except httpx.HTTPError as exc:
            self.tally.error(f"http {type(exc).__name__}")
            self.tally.unavailable_at.append(time.time())
            return
        self.statuses[answer.status_code] = self.statuses.get(answer.status_code, 0) + 1
        # 200: already recorded (through the other receiver); acknowledged all the same, after
        # the same wait for the replicas.
        if answer.status_code in (200, 202):
            job = str(answer.json()["alerts"][0]["job_id"])
            if self.tally.acked.setdefault(fingerprint, job) != job:
                self.tally.error("two receivers answered different job ids")
            self.tally.last_ok_at = time.time()
            self.tally.acked_at.append(self.tally.last_ok_at)
        elif answer.status_code == 503 and answer.headers.get("Retry-After"):
            self.tally.unavailable_at.append(time.time())
        else:
            self.tally.error(f"status {answer.status_code}")


class _LeaseWatch:
    """Polls every exporter replica's /healthz: who holds the canary lease, how often each
    canary probe has run there."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.samples = 0
        self.overlaps = 0
        self.last_held: list[bool] = []
        self.first_runs: dict[str, int] = {}
        self.last_runs: dict[str, int] = {}
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill-lease-watch", daemon=True)

    def poll(self, http: httpx.Client) -> tuple[list[bool], dict[str, int]] | None:
        """Who holds the lease and the canary probes' runs summed over replicas (None when a
        replica did not answer)."""
        held: list[bool] = []
        runs: Counter[str] = Counter()
        for url in self.urls:
            try:
                body = http.get(f"{url}/healthz").json()
            except (httpx.HTTPError, ValueError):
                return None
            held.append(bool((body.get("canary_lease") or {}).get("held")))
            for name in CANARY_PROBES:
                runs[name] += int(body["probes"].get(name, {}).get("runs", 0))
        return held, dict(runs)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0, trust_env=False) as http:
            while not self.stop.is_set():
                seen = self.poll(http)
                if seen is not None:
                    held, runs = seen
                    if not self.first_runs:
                        self.first_runs, self.started_at = runs, time.monotonic()
                    self.last_runs, self.stopped_at = runs, time.monotonic()
                    self.samples += 1
                    self.overlaps += sum(held) > 1
                    self.last_held = held
                self.stop.wait(LEASE_POLL_SECONDS)


class _WriteBurst:
    """Index writes through the delta log; a write counts as acknowledged once the writer
    returned and (with `redis.min_replicas_ack`) the replicas acknowledged it."""

    def __init__(self, ctx: DrillContext, prefix: str, replicas: int, timeout_ms: int) -> None:
        endpoints = ctx.endpoints
        self.client = open_redis(
            endpoints.redis_url, socket_timeout=2.0, socket_connect_timeout=1.0
        )
        self.log = DeltaLog(self.client, COLLECTION, INDEX_DIM)
        spec = TargetSpec(endpoints.milvus_primary_uri, COLLECTION, PRIMARY_INDEX)
        self.primary = MilvusTarget(spec, INDEX_DIM, 10.0)
        self.writer = IndexWriter(self.log, self.primary, endpoints.regions[0])
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.prefix = prefix
        self.tally = _Tally()
        self.last_error = ""
        self.rng = np.random.default_rng(int(time.time()))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill-index-writes", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            row_id = f"{self.prefix}{n}"
            n += 1
            vector = self.rng.standard_normal(INDEX_DIM).astype(np.float32)
            try:
                self.writer.upsert(row_id, vector)
                wait_for_replicas(self.client, self.replicas, self.timeout_ms)
            except FAILOVER_ERRORS as exc:
                self.tally.error(type(exc).__name__)
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.tally.unavailable_at.append(time.time())
            except Exception as exc:  # an unacknowledged write is not owed; count it apart
                self.tally.error(type(exc).__name__)
                self.last_error = f"{type(exc).__name__}: {exc}"
            else:
                self.tally.acked[row_id] = vector_checksum(to_vector(vector, INDEX_DIM))
                self.tally.last_ok_at = time.time()
                self.tally.acked_at.append(self.tally.last_ok_at)
            self.stop.wait(1.0 / WRITES_PER_SECOND)

    def missing(self, target: MilvusTarget) -> list[str]:
        """Acknowledged rows absent from `target` or holding another vector."""
        rows = target.fetch(list(self.tally.acked))
        return [i for i, checksum in self.tally.acked.items() if rows.get(i) is None
                or rows[i].checksum != checksum]  # fmt: skip

    def close(self) -> None:
        """Release the Milvus and Redis connections."""
        self.primary.close()
        self.client.close()


def _sentinel(ctx: DrillContext) -> redis.Redis:
    part = ctx.state.part(SENTINEL_PARTS[0])
    if part is None or part.port is None:
        raise DrillError("the stack has no Sentinel")
    return redis.Redis(ctx.state.host, part.port, socket_timeout=2.0, decode_responses=True)


def _primary_port(sentinel: redis.Redis) -> int | None:
    addr = sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)
    return int(addr[1]) if isinstance(addr, tuple | list) and addr else None


def _restart_service(ctx: DrillContext, name: str) -> int:
    """Start a killed service binary (a Redis node) again with its argv; its new pid."""
    part = ctx.state.part(name)
    if part is None:
        raise DrillError(f"no part {name!r}")
    process = spawn(part.argv, Path(part.log))
    fresh = part.model_copy(update={"pid": process.pid, "start_ticks": process.start_ticks,
                                    "started_at": time.time()})  # fmt: skip
    ctx.state.parts[ctx.state.parts.index(part)] = fresh
    write_state(ctx.state.layout(), ctx.state)
    host, port = ctx.state.host, part.port or 0

    def answers() -> bool:
        try:
            with redis.Redis(host, port, socket_timeout=0.5) as node:
                return bool(node.ping())
        except redis.RedisError:  # still loading its AOF, or not listening yet
            return False

    wait_until(process, name, answers, 30.0)
    return process.pid


def _span(times: list[float], after: float) -> float:
    later = [t for t in times if t >= after]
    return round(max(later) - min(later), 3) if later else 0.0


def drill_redis_failover(ctx: DrillContext) -> DrillResult:
    """Primary SIGKILLed mid-burst -> Sentinels promote the replica -> nothing acked is lost."""
    result = DrillResult(NAME, "-", None, FAILOVER_TIMEOUT, expect_alert=False)
    if not ctx.endpoints.sentinel:
        result.not_applicable = (
            "the stack runs one redis-server; start it with `redline up --redis sentinel`"
        )
        ctx.say(NAME, f"does not apply: {result.not_applicable}")
        return result
    durability = ctx.spec.redis
    if durability.min_replicas_ack == 0:
        result.notes.append(
            "redis.min_replicas_ack is 0: acknowledgements do not wait for the replica, so a "
            "write acknowledged just before the kill may be lost (set it to 1)"
        )
    primary_part = ctx.state.part("redis")
    if primary_part is None or not part_alive(primary_part):
        raise DrillError("the Redis primary part is not running (restart the stack)")
    sentinel = _sentinel(ctx)
    old_port = _primary_port(sentinel)
    if old_port != primary_part.port:
        raise DrillError(f"the Sentinels' primary is :{old_port}, not the `redis` part "
                         f"(:{primary_part.port}); restart the stack first")  # fmt: skip
    tag = uuid.uuid4().hex[:6]
    token = ctx.state.layout().token_file.read_text("utf-8").strip()
    receivers = [f"{url}/alerts" for url in ctx.endpoints.receiver_urls]
    alerts = _AlertBurst(receivers, token, tag)
    lease = _LeaseWatch(ctx.endpoints.exporters_urls)
    writes = _WriteBurst(ctx, f"drill-failover-{tag}-", durability.min_replicas_ack,
                         durability.ack_timeout_ms)  # fmt: skip
    replica = MilvusTarget(
        TargetSpec(ctx.endpoints.milvus_replica_uri, COLLECTION, REPLICA_INDEX), INDEX_DIM, 10.0
    )
    try:
        lease.thread.start()
        alerts.thread.start()
        writes.thread.start()
        time.sleep(BEFORE_SECONDS)
        result.fault = f"Redis primary killed (SIGKILL, pid {primary_part.pid}, :{old_port})"
        result.fault_at = time.time()
        signal_part(primary_part, 9)
        ctx.say(NAME, f"fault injected: {result.fault}")

        def promoted() -> int | None:
            port = _primary_port(sentinel)
            return port if port is not None and port != old_port else None

        new_port = ctx.wait_for(NAME, "the Sentinels to promote the replica", promoted,
                                FAILOVER_TIMEOUT, interval=0.2)  # fmt: skip
        promoted_at = time.time()
        ctx.say(NAME, f"replica :{new_port} promoted after {promoted_at - result.fault_at:.1f} s")
        pid = _restart_service(ctx, "redis")
        ctx.say(NAME, f"old primary restarted (pid {pid}); the Sentinels make it a replica")
        result.remediated_at = time.time()

        def writing_again() -> bool | None:
            after = promoted_at
            return True if min(alerts.tally.last_ok_at, writes.tally.last_ok_at) > after else None

        try:
            ctx.wait_for(NAME, "alerts and index writes to be acknowledged again",
                         writing_again, FAILOVER_TIMEOUT, interval=0.2)  # fmt: skip
        except DrillError as exc:
            raise DrillError(
                f"{exc}; alert answers {alerts.statuses}, alert errors {alerts.tally.errors}, "
                f"index write errors {writes.tally.errors} ({writes.last_error})"
            ) from None
        result.recovered_at = time.time()
        time.sleep(AFTER_SECONDS)
    finally:
        alerts.stop.set()
        writes.stop.set()
        alerts.thread.join(15)
        writes.thread.join(15)
    try:
        _one_runner_again(ctx, lease)
    finally:
        lease.stop.set()
        lease.thread.join(15)
    try:
        _count(ctx, result, alerts, writes, replica)
        _count_runs(ctx, result, alerts)
        _count_canaries(ctx, result, lease)
    finally:
        writes.close()
        replica.close()
        sentinel.close()
    result.finished_at = time.time()
    return result


def _count(
    ctx: DrillContext,
    result: DrillResult,
    alerts: _AlertBurst,
    writes: _WriteBurst,
    replica: MilvusTarget,
) -> None:
    """Every acknowledged alert has its job; every acknowledged write is on both copies."""
    fault_at = result.fault_at or 0.0
    token = ctx.state.layout().token_file.read_text("utf-8").strip()
    lost_jobs: list[str] = []
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        for fingerprint, job_id in alerts.tally.acked.items():
            answer = http.get(f"{ctx.endpoints.receiver_url}/jobs/{job_id}",
                              headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            if answer.status_code != 200:
                lost_jobs.append(f"{fingerprint} (job {job_id}: {answer.status_code})")

    on_primary = writes.missing(writes.primary)
    try:
        ctx.wait_for(NAME, "the index replica to hold every acknowledged write",
                     lambda: True if not writes.missing(replica) else None, 60.0, 1.0)  # fmt: skip
        on_replica: list[str] = []
    except DrillError:
        on_replica = writes.missing(replica)
    unavailable = sorted(alerts.tally.unavailable_at + writes.tally.unavailable_at)
    seconds_503 = _span(alerts.tally.unavailable_at, fault_at)
    result.figure("alerts answered 202 (or 200: recorded through another receiver)",
                  len(alerts.tally.acked))  # fmt: skip
    result.figure("jobs that exist", len(alerts.tally.acked) - len(lost_jobs))
    result.figure("index writes acknowledged", len(writes.tally.acked))
    result.figure("acknowledged writes on both copies",
                  len(writes.tally.acked) - len(set(on_primary) | set(on_replica)))  # fmt: skip
    result.figure("seconds of 503 (receiver, client-side)", seconds_503, "s")
    result.figure("seconds of failed index writes", _span(writes.tally.unavailable_at, fault_at),
                  "s")  # fmt: skip
    result.figure("alert answers 503", alerts.statuses.get(503, 0))
    result.lost = len(lost_jobs) + len(set(on_primary) | set(on_replica))
    result.lost_detail = (
        f"{len(lost_jobs)} job(s) of 202 answers missing, {len(on_primary)} acknowledged "
        f"write(s) missing on the primary index, {len(on_replica)} on the replica"
    )
    other = {k: v for k, v in alerts.tally.errors.items() if not k.startswith("http")}
    result.check("every 202 has its job", not lost_jobs, ", ".join(lost_jobs[:5]) or "all found")
    result.check("no answer other than 202 (200: a duplicate) or 503 + Retry-After", not other,
                 ", ".join(f"{k}: {v}" for k, v in other.items()) or "none")  # fmt: skip
    result.check("acknowledged writes on both index copies", not on_primary and not on_replica,
                 result.lost_detail)  # fmt: skip
    for what, tally in (("alerts", alerts.tally), ("index writes", writes.tally)):
        before = sum(1 for t in tally.acked_at if t < fault_at)
        result.check(f"{what} acknowledged before and after the failover",
                     0 < before < len(tally.acked_at),
                     f"{before} before the kill, {len(tally.acked_at) - before} after")  # fmt: skip
    result.figure("alert and index-write attempts refused during the failover (retried)",
                  len(unavailable))  # fmt: skip


def _one_runner_again(ctx: DrillContext, lease: _LeaseWatch) -> None:
    """Wait until an exporter holds the canary lease again (it may have lapsed while Redis
    failed over); a drill failure names the replicas' view if none does."""

    def one_holds() -> bool | None:
        return True if sum(lease.last_held) == 1 else None

    try:
        ctx.wait_for(NAME, "one exporter to hold the canary lease", one_holds, 30.0, 0.25)
    except DrillError:
        pass  # reported by the check in _count_canaries


def _count_runs(ctx: DrillContext, result: DrillResult, alerts: _AlertBurst) -> None:
    """Each alert of the burst was accepted once and run (settled) at most once, whichever
    receiver and worker handled it: from the audit trail in Redis."""
    settings = RemediationSettings.model_validate(
        yaml.safe_load(ctx.state.layout().settings_file("remediation").read_text("utf-8"))
    )
    client = open_redis(ctx.endpoints.redis_url, socket_timeout=5.0, decode_responses=True)
    try:
        records = [json.loads(line) for line in AuditLog(client, settings.key_prefix).records()]
    finally:
        client.close()
    # Every job the burst's alerts made (by fingerprint: a second job for one alert would carry
    # another id), not only the ids the receivers answered.
    burst = [r for r in records if r["kind"] == "job.accepted"
             and str(r["data"].get("fingerprint", "")).startswith(alerts.prefix)]  # fmt: skip
    accepted = Counter(r["data"]["fingerprint"] for r in burst)
    jobs = {r["job_id"] for r in burst}
    finished = Counter(r["job_id"] for r in records if r["kind"] == "job.finished"
                       and r["job_id"] in jobs)  # fmt: skip
    twice = sorted(fp for fp, n in accepted.items() if n > 1)
    run_twice = sorted(job for job, n in finished.items() if n > 1)
    result.figure("receivers posted to", len(alerts.urls))
    result.figure("alerts accepted more than once", len(twice))
    result.figure("jobs run more than once", len(run_twice))
    result.check("each alert accepted once (one job) across the receivers", not twice,
                 ", ".join(twice[:5]) or f"{len(accepted)} alerts, one job each")  # fmt: skip
    result.check("no duplicate playbook run", not run_twice,
                 ", ".join(run_twice[:5]) or f"{len(finished)} jobs settled once each")  # fmt: skip


def _count_canaries(ctx: DrillContext, result: DrillResult, lease: _LeaseWatch) -> None:
    """The canary lease never had two holders, one holds it now, and the canary probes ran no
    more often across the exporter replicas than one runner's schedule allows."""
    settings = yaml.safe_load(ctx.state.layout().settings_file("exporters").read_text("utf-8"))
    window = lease.stopped_at - lease.started_at
    result.figure("exporter replicas", len(lease.urls))
    result.figure("lease samples with two canary runners", lease.overlaps)
    result.check("never two canary runners at once", lease.samples > 0 and lease.overlaps == 0,
                 f"{lease.overlaps} of {lease.samples} samples")  # fmt: skip
    result.check("one canary runner after the failover", sum(lease.last_held) == 1,
                 f"lease held by replicas {lease.last_held}")  # fmt: skip
    section = {"index_staleness": "index_staleness", "session_keepalive": "keepalive"}
    for probe in CANARY_PROBES:
        interval = float(settings[section[probe]]["interval_seconds"])
        ran = lease.last_runs.get(probe, 0) - lease.first_runs.get(probe, 0)
        # One runner: a run per interval (a quarter more for scheduling jitter), plus one at
        # each end and at a handover; two runners would make about twice as many.
        most = int(window / interval * 1.25) + 3
        result.figure(f"{probe} runs across replicas in {window:.0f} s", ran)
        result.check(f"{probe} canaries not doubled", ran <= most,
                     f"{ran} runs in {window:.1f} s (one runner: at most {most})")  # fmt: skip


__all__ = ["NAME", "drill_redis_failover"]
