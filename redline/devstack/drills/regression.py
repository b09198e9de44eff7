"""The regression drills: a release slower and less accurate trips the two-signal rollback gate
(SemanticRollbackTwoSignal -> semantic_rollback back to v1); a release only slower does not.

Each region is several simulator pods behind its service front: the release is deployed on
every pod, the rollback must switch every pod back, and the load generator's requests (through
the gateway and the fronts, as users' would go) must not fail while it does."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from redline.devstack.drills.base import DrillError, DrillResult, parse_time
from redline.devstack.drills.context import DeferredRecovery, DrillContext
from redline.devstack.drills.waits import (
    budget_for,
    job_matches,
    last_verify,
    require_quiet,
    run_playbook_loop,
    step_time,
    wait_firing,
    wait_recovered,
)
from redline.devstack.layout import ADAPTER
from redline.platform.snapshots import SnapshotRegistry
from redline.rules.build import rollback_records
from redline.rules.families.mutation import ROLLBACK_ALERT as MUTATION_ROLLBACK_ALERT
from redline.rules.families.rollback import rollback_gate_expr
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

REGRESSION_VERSION = "v2"
NEGATIVE_VERSION = "v3"
GOOD_VERSION = "v1"


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


GATE_QUANTILE = 0.99
"""The quantile the gate's per-version latency record estimates."""
BUCKET_MARGIN = 0.02
"""Seconds past a bucket bound that put even an instant request above it."""


def _bucket_shift(bounds: tuple[float, ...], gate: float) -> tuple[float, float] | None:
    """(lower, upper) bound of the first bucket whose P99 estimate clears `gate` when every
    request lies in it: `histogram_quantile` interpolates linearly inside a bucket, so a
    request load sitting just above `lower` reads as lower + 0.99 x (upper - lower)."""
    lower = 0.0
    for upper in bounds:
        if lower + GATE_QUANTILE * (upper - lower) >= gate:
            return lower, upper
        lower = upper
    return None


def regression_latency(spec: Spec, baseline_p99: float) -> float:
    """Latency to add so P99 clears the gate's ratio but stays under the red line.

    The P99 is read from the latency histogram, so what counts is the bucket the slow requests
    land in. With fine buckets (the gateway's, chosen around the thresholds) the baseline plus
    the added latency reaches the bound above the gate. With an engine's coarse buckets (vLLM's
    start 0.3, 0.5, 0.8) a modest slow-down can stay inside the baseline's bucket and its
    estimate under the gate, so every request is moved past the lower bound of the first
    bucket whose estimate clears it."""
    gate = (1 + spec.rollback.p99_increase_ratio) * baseline_p99
    threshold = spec.red_lines.latency_p99.threshold_seconds
    added = max(0.15, gate - baseline_p99 + 0.1)
    bounds = tuple(sorted(spec.sources.buckets))
    above = next((bound for bound in bounds if bound >= gate), None)
    if above is not None and baseline_p99 + added < above:
        shift = _bucket_shift(bounds, gate)
        if shift is not None and shift[1] <= threshold:
            added = max(added, shift[0] + BUCKET_MARGIN)
            if shift[0] + BUCKET_MARGIN < threshold - 0.1:
                return round(added, 3)
    if baseline_p99 + added >= threshold - 0.1:
        raise DrillError(
            f"baseline P99 {baseline_p99:.3f} s leaves no room between the rollback gate "
            f"({gate:.3f} s) and the latency red line"
        )
    return round(added, 3)


SETTLE_SECONDS = 2.5
"""After the job ends: the load generator rewrites its counters every second, and requests in
flight during the switch finish (or fail) within this."""


def _failures_since(ctx: DrillContext, before: Mapping[str, int]) -> dict[str, int]:
    """The load generator's failed requests since `before`, by status."""
    now = ctx.probe.loadgen_failures()
    return {k: n - before.get(k, 0) for k, n in now.items() if n - before.get(k, 0) > 0}


def check_switch_failures(
    ctx: DrillContext, result: DrillResult, before: Mapping[str, int], job: Mapping[str, Any]
) -> None:
    """Count the users' failed requests from the alert firing (before the job could switch
    anything) until the rollback job ended and its last requests landed: 0 is the target."""
    time.sleep(SETTLE_SECONDS)
    failed = _failures_since(ctx, before)
    total = sum(failed.values())
    started, ended = step_time(job, "plan"), step_time(job, "verify")
    window = (
        f"rollback job {started - (result.fault_at or started):.1f} s to "
        f"{ended - (result.fault_at or ended):.1f} s after the fault"
        if started is not None and ended is not None
        else "the rollback job"
    )
    detail = ", ".join(f"{n} x {status}" for status, n in sorted(failed.items())) or "none"
    result.check("no failed user request during the switch", total == 0,
                 f"{detail} (load generator, from the alert firing through {window})")  # fmt: skip
    result.figure("failed requests during the switch:", total)


def _switching_job(
    ctx: DrillContext, result: DrillResult, labels: Mapping[str, str], gate_job: dict[str, Any]
) -> dict[str, Any]:
    """The rollback job that switched the pods: the gate's own, or — when the canaries' answers
    mutated while the gate's conditions held — the one `OutputConsistencyMutationRollback`
    started first, after which the gate's job found the good version already active."""
    if _verified_pods(gate_job):
        return gate_job
    assert result.playbook is not None
    after = (result.fault_at or 0.0) - 1.0
    for listed in ctx.probe.jobs(result.playbook):
        if not job_matches(listed, MUTATION_ROLLBACK_ALERT, labels):
            continue
        if parse_time(listed["created_at"]) < after:
            continue
        job = ctx.probe.job(listed["id"])  # the listing carries no steps
        verify = last_verify(job)
        if verify is not None and _verified_pods(job):
            result.notes.append(
                f"rolled back by {MUTATION_ROLLBACK_ALERT} (job {job['id']}): the canaries' "
                f"answers mutated while the gate's conditions held; the gate's job "
                f"{gate_job['id']} then found {GOOD_VERSION} already active"
            )
            result.remediated_at = float(verify["at"])
            result.playbook_started_at = step_time(job, "plan")
            result.notified_at = parse_time(job["created_at"])
            result.job_id = job["id"]
            return dict(job)
    return gate_job


def _verified_pods(job: Mapping[str, Any]) -> dict[str, Any]:
    """The pods the job's last successful verify step reported (empty: it switched none)."""
    verify = last_verify(job)
    pods: dict[str, Any] = (verify.get("data") or {}).get("pods") or {} if verify else {}
    return pods


def check_every_pod(ctx: DrillContext, result: DrillResult, job: Mapping[str, Any]) -> None:
    """Every pod of every region serves the good version (asked of each pod, not the fronts),
    and the rollback's verify step reported every one of them."""
    versions = ctx.probe.pod_versions()
    good = sorted(pod for pod, version in versions.items() if version == GOOD_VERSION)
    per_region = ctx.endpoints.pods
    result.check(
        f"every pod serves {GOOD_VERSION}",
        len(good) == len(versions) == per_region * len(ctx.endpoints.regions),
        ", ".join(f"{pod}={version}" for pod, version in sorted(versions.items())),
    )
    reported = _verified_pods(job)
    result.check(
        "the rollback verified every pod",
        len(reported) == len(versions),
        f"{len(reported)} pod(s) in the verify step: {', '.join(sorted(reported))}",
    )
    unit = f"({per_region} per region) serve {GOOD_VERSION}"
    if len(good) != len(versions):
        unit = f"of {len(versions)} {unit}"
    result.figure("pods:", len(good), unit)


def _gate_series(ctx: DrillContext, version: str) -> dict[str, float | None]:
    records = rollback_records(ctx.spec)
    selector = f'{{model="{ADAPTER}",model_version="{version}"}}'
    return {name: ctx.probe.value(record + selector) for name, record in records.items()}


def _restore_good(ctx: DrillContext, version: str) -> None:
    _deploy(ctx, GOOD_VERSION)
    _set_version_faults(ctx, version, None)


def _gate_onset(ctx: DrillContext, version: str, start: float, end: float) -> float | None:
    """When the gate's conditions first held for `version`: the first rule evaluation at or
    after `start` where the gate's own expression (`rollback_gate_expr`: requests, accuracy
    verdicts, accuracy's upper bound under the baseline, P99 up) was true on the recorded
    series, less one scrape and one evaluation interval (it may have held that much earlier).
    What lies between is the traffic and the verdicts the gate waits for, not the pipeline."""
    timing = ctx.spec.timing
    records = rollback_records(ctx.spec)
    selector = f'{{model="{ADAPTER}",model_version="{version}"}}'
    query = (
        f"(\n{rollback_gate_expr(ctx.spec)}\n)\n"
        f"and on (model, model_version) {records['requests']}{selector}"
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
    result = DrillResult("regression", Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL, gate.playbook,
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
        # The job starts after Alertmanager's group_wait and switches after staging and a
        # golden check on every pod: counting from here covers the whole switch.
        failures_before = ctx.probe.loadgen_failures()
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
            f"{gate.min_samples} requests and {gate.min_eval_samples} accuracy verdicts of "
            f"{version} within {gate.window_seconds} s, its accuracy significantly under the "
            "baseline and its P99 up (first evaluation of the gate's expression showing all, "
            "less a scrape and an evaluation interval)"
        )
        job = run_playbook_loop(ctx, result, labels, 180.0)
        job = _switching_job(ctx, result, labels, job)
        check_switch_failures(ctx, result, failures_before, job)
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
        check_every_pod(ctx, result, job)
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
    result = DrillResult("regression-negative", Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL, gate.playbook,
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
                    and job_matches(j, result.alert, labels)]  # fmt: skip
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


__all__ = ["drill_regression", "drill_regression_negative", "regression_latency"]
