"""The receiver's `/metrics`: webhook counters (this process) and run metrics (all workers).

Workers may run in other processes, so run counters and the duration histogram live in Redis
(`JobStore._count_run`) and are read back at scrape time; every replica of the receiver shows
the same cluster-wide values (aggregate them with `max`, not `sum`). Families are built by a
collector on a registry of the app's own, so no `_created` series and no global registry.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
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
from redline.remediation.jobs import DURATION_BUCKETS
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


def build_families(
    alerts: Mapping[str, int], duplicates: int, runs: Mapping[str, str] | None
) -> list[Metric]:
    """Metric families from the webhook counters and the raw run-metrics hash (None: unknown)."""
    alerts_family = _counter(catalog.REDLINE_WEBHOOK_ALERTS_TOTAL)
    for status in sorted({"firing", "resolved", *alerts}):
        alerts_family.add_metric([status], alerts.get(status, 0))
    duplicates_family = _counter(catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL, duplicates)
    families: list[Metric] = [alerts_family, duplicates_family]
    if runs is None:
        return families
    runs_family = _counter(catalog.REDLINE_REMEDIATION_RUNS_TOTAL)
    buckets: dict[str, list[int]] = {}
    sums: dict[str, float] = {}
    for name, raw in sorted(runs.items()):
        kind, _, rest = name.partition("|")
        if kind == "runs":
            playbook, _, outcome = rest.partition("|")
            runs_family.add_metric([playbook, outcome], float(raw))
        elif kind == "bucket":
            playbook, _, index = rest.partition("|")
            counts = buckets.setdefault(playbook, [0] * (len(DURATION_BUCKETS) + 1))
            counts[int(index)] += int(raw)
        elif kind == "sum":
            sums[rest] = float(raw)
    duration = catalog.REDLINE_REMEDIATION_DURATION_SECONDS
    duration_family = HistogramMetricFamily(
        duration.family, duration.help, labels=list(duration.labels)
    )
    for playbook, counts in sorted(buckets.items()):
        cumulative = 0
        series: list[tuple[str, float]] = []
        for bound, count in zip(
            [*map(floatToGoString, DURATION_BUCKETS), "+Inf"], counts, strict=True
        ):
            cumulative += count
            series.append((bound, float(cumulative)))
        duration_family.add_metric([playbook], series, sums.get(playbook, 0.0))
    return [*families, runs_family, duration_family]


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
