"""The receiver's `/metrics`: webhook counters (this process) and run metrics (all workers).

Workers may run in other processes, so run counters and the duration histogram live in Redis
(counted by the job store's settle script) and are read back at scrape time, as are what
playbooks observe there (`jobs.write_recovery`: `gpu_node_failure`'s recovery histogram, in the same
hash), the guard rails (breakers, pauses) and the unfinished jobs (overdue and oldest-age
gauges); every replica of the receiver shows the same cluster-wide values (aggregate them with
`max`, not `sum`).
Families are built by a collector on a registry of the app's own, so no `_created` series and no
global registry.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from redline.remediation.audit import VerifyResult
from redline.remediation.guards import ALL, GuardSnapshot, Policies
from redline.remediation.jobs import (
    DURATION_BUCKETS,
    RECOVERY,
    RECOVERY_BUCKET,
    RECOVERY_SUM,
)
from redline.slo import catalog


@dataclass
class WebhookCounters:
    """Per-process counts of received alerts and duplicate deliveries (thread-safe)."""

    alerts: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, statuses: Mapping[str, int], duplicates: int) -> None:
        """Add alerts by status and duplicate alerts."""
        with self._lock:
            self.alerts.update(statuses)
            self.duplicates += duplicates

    def snapshot(self) -> tuple[dict[str, int], int]:
        """A consistent copy."""
        with self._lock:
            return dict(self.alerts), self.duplicates


def _counter(metric: catalog.Metric, value: float | None = None) -> CounterMetricFamily:
    # Labelled families get their samples added; unlabelled ones are one `value`.
    if value is None:
        return CounterMetricFamily(metric.family, metric.help, labels=list(metric.labels))
    return CounterMetricFamily(metric.family, metric.help, value=value)


def _gauge(metric: catalog.Metric, value: float | None = None) -> GaugeMetricFamily:
    if value is None:
        return GaugeMetricFamily(metric.family, metric.help, labels=list(metric.labels))
    return GaugeMetricFamily(metric.family, metric.help, value=value)


ALERTED_OUTCOMES = catalog.RUN_OUTCOMES
"""Run outcomes exposed (at 0) before the first run of a playbook: an alert on
`increase(...)` then sees the first failure too, not only the second."""


def build_families(
    alerts: Mapping[str, int],
    duplicates: int,
    runs: Mapping[str, str] | None,
    playbooks: Sequence[str] = (),
) -> list[Metric]:
    """Metric families from the webhook counters and the raw run-metrics hash (None: unknown);
    `playbooks` get their `ALERTED_OUTCOMES` series even before their first run."""
    alerts_family = _counter(catalog.REDLINE_WEBHOOK_ALERTS_TOTAL)
    for status in sorted({"firing", "resolved", *alerts}):
        alerts_family.add_metric([status], alerts.get(status, 0))
    duplicates_family = _counter(catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL, duplicates)
    families: list[Metric] = [alerts_family, duplicates_family]
    if runs is None:
        return families
    runs_family = _counter(catalog.REDLINE_REMEDIATION_RUNS_TOTAL)
    counted = {(playbook, outcome): 0.0 for playbook in playbooks for outcome in ALERTED_OUTCOMES}
    buckets: dict[str, list[int]] = {}
    sums: dict[str, float] = {}
    for name, raw in sorted(runs.items()):
        kind, _, rest = name.partition("|")
        if kind == "runs":
            playbook, _, outcome = rest.partition("|")
            counted[playbook, outcome] = float(raw)
        elif kind == "bucket":
            playbook, _, index = rest.partition("|")
            counts = buckets.setdefault(playbook, [0] * (len(DURATION_BUCKETS) + 1))
            counts[int(index)] += int(raw)
        elif kind == "sum":
            sums[rest] = float(raw)
    for (playbook, outcome), value in sorted(counted.items()):
        runs_family.add_metric([playbook, outcome], value)
    duration = catalog.REDLINE_REMEDIATION_DURATION_SECONDS
    duration_family = HistogramMetricFamily(
        duration.family, duration.help, labels=list(duration.labels)
    )
    for playbook, counts in sorted(buckets.items()):
        duration_family.add_metric(
            [playbook], _cumulative(DURATION_BUCKETS, counts), sums.get(playbook, 0.0)
        )
    return [*families, runs_family, duration_family, build_recovery_family(runs)]


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    # The hash counts each bucket on its own; the exposition's buckets are cumulative.
    cumulative = 0
    series: list[tuple[str, float]] = []
    for bound, count in zip([*map(floatToGoString, bounds), "+Inf"], counts, strict=True):
        cumulative += count
        series.append((bound, float(cumulative)))
    return series


def build_recovery_family(runs: Mapping[str, str]) -> HistogramMetricFamily:
    """`llm_node_failure_recovery_seconds` from the run-metrics hash (both modes, 0 before the
    first recovery: an `increase` then sees the first one)."""
    counts = {mode: [0] * (len(RECOVERY.buckets) + 1) for mode in catalog.RECOVERY_MODES}
    sums = dict.fromkeys(catalog.RECOVERY_MODES, 0.0)
    for name, raw in runs.items():
        kind, _, rest = name.partition("|")
        if kind == RECOVERY_BUCKET:
            mode, _, index = rest.partition("|")
            if mode in counts and index.isdigit() and int(index) < len(counts[mode]):
                counts[mode][int(index)] += int(raw)
        elif kind == RECOVERY_SUM and rest in sums:
            sums[rest] = float(raw)
    family = HistogramMetricFamily(RECOVERY.family, RECOVERY.help, labels=list(RECOVERY.labels))
    for mode in catalog.RECOVERY_MODES:
        family.add_metric([mode], _cumulative(RECOVERY.buckets, counts[mode]), sums[mode])
    return family


@dataclass(frozen=True)
class JobAges:
    """Unfinished jobs of one playbook: how many are past the deadline, the oldest one's age."""

    overdue: int = 0
    oldest_seconds: float = 0.0


def build_job_ages(
    active: Iterable[tuple[str, float]], policies: Policies, now: float
) -> dict[str, JobAges]:
    """Per playbook, from (playbook, created at) of the unfinished jobs."""
    ages: dict[str, JobAges] = {}
    for playbook, created in active:
        age = max(now - created, 0.0)
        late = age > policies.get(playbook).deadline_seconds
        last = ages.get(playbook, JobAges())
        ages[playbook] = JobAges(last.overdue + int(late), max(last.oldest_seconds, age))
    return ages


def build_guard_families(
    playbooks: Sequence[str],
    policies: Policies,
    guards: GuardSnapshot,
    ages: Mapping[str, JobAges],
) -> list[Metric]:
    """Breaker, pause, mode, overdue and oldest-age gauges of every known playbook (and of any
    playbook the state names)."""
    names = sorted(
        {*playbooks, *guards.breakers_open, *guards.failures, *guards.paused, *ages} - {"", ALL}
    )
    breaker = _gauge(catalog.REDLINE_REMEDIATION_BREAKER_OPEN)
    paused = _gauge(catalog.REDLINE_REMEDIATION_PAUSED)
    mode = _gauge(catalog.REDLINE_REMEDIATION_MODE)
    overdue = _gauge(catalog.REDLINE_REMEDIATION_JOBS_OVERDUE)
    oldest = _gauge(catalog.REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS)
    for name in names:
        breaker.add_metric([name], 1.0 if name in guards.breakers_open else 0.0)
        paused.add_metric([name], 1.0 if guards.is_paused(name) else 0.0)
        current = policies.get(name).mode
        for value in catalog.REMEDIATION_MODES:
            mode.add_metric([name, value], 1.0 if value == current else 0.0)
        age = ages.get(name, JobAges())
        overdue.add_metric([name], float(age.overdue))
        oldest.add_metric([name], round(age.oldest_seconds, 3))
    return [breaker, paused, mode, overdue, oldest]


@dataclass(frozen=True)
class AuditStatus:
    """The last verification of the audit trail: each copy's result and when it ran."""

    verified_at: float
    copies: Mapping[str, VerifyResult]  # "redis", and "file" with a JSONL mirror


def build_audit_families(status: AuditStatus | None) -> list[Metric]:
    """Chain state per copy (1 intact, 0 broken), records per copy, time of the verification."""
    if status is None:
        return []  # never verified (Redis down since start): absent, not "intact"
    intact = _gauge(catalog.REDLINE_AUDIT_CHAIN_INTACT)
    records = _gauge(catalog.REDLINE_AUDIT_RECORDS)
    for copy, result in sorted(status.copies.items()):
        intact.add_metric([copy], 1.0 if result.ok else 0.0)
        records.add_metric([copy], float(result.count))
    verified = _gauge(catalog.REDLINE_AUDIT_VERIFIED_TIMESTAMP_SECONDS, status.verified_at)
    return [intact, records, verified]


class _Snapshot(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        """The snapshot's families."""
        return iter(self._families)


def render_metrics(families: list[Metric]) -> bytes:
    """The text exposition of `families` (a fresh registry each scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))
    return generate_latest(registry)
