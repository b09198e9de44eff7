"""What every drill shares: its result (the times it measured and the checks it made), its error,
and the small parsers of what the stack's APIs answer.

A drill injects one real fault into the running stack and times the whole loop: fault ->
exporter/gateway series -> Prometheus rule -> Alertmanager -> webhook -> playbook -> recovery.
Every time is measured from the moment the fault was injected:

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

Results are plain data (`DrillResult.as_dict()`), written as JSON by the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redline.core.times import parse_time

T = TypeVar("T")
Progress = Callable[[str, str], None]
"""Where a drill reports: (drill name, message)."""


class DrillError(Exception):
    """A drill could not run or its loop did not close; the message says which step."""


@dataclass(frozen=True)
class Check:
    """One assertion a drill made about the stack."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Figure:
    """One number a drill measured beyond the timings (shown on the board under the table)."""

    label: str
    value: float | int | None
    unit: str = ""

    def text(self) -> str:
        """`label value unit`, or `label -` when it was not measured."""
        if self.value is None:
            return f"{self.label} -"
        shown = f"{self.value:.3g}" if isinstance(self.value, float) else str(self.value)
        return f"{self.label} {shown}{' ' + self.unit if self.unit else ''}"


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
    allowed_failures: int | None = 0
    """The user requests this drill may see fail (None: counted, bounded by its own checks)."""
    allowance: str = ""
    """Why that many."""
    expect_alert: bool = True
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    job_id: str | None = None
    finished_at: float | None = None
    figures: list[Figure] = field(default_factory=list)
    not_applicable: str | None = None
    """Why the drill does not apply to this stack (it ran nothing); None when it ran."""

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
    def within_allowance(self) -> bool:
        """No more user requests failed than the drill allows."""
        allowed, failed = self.allowed_failures, self.failed_requests or 0
        return allowed is None or failed <= allowed

    @property
    def ok(self) -> bool:
        """The loop closed (or, for a negative drill, stayed closed), nothing was lost and no
        more user requests failed than the drill's allowance."""
        if self.error is not None or not all(check.ok for check in self.checks):
            return False
        if not self.within_allowance:
            return False
        if self.not_applicable is not None:
            return True
        if self.lost:
            return False
        if not self.expect_alert:
            return self.firing_at is None
        return self.firing_at is not None and self.recovered_at is not None

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Record a check; returns `ok`."""
        self.checks.append(Check(name, ok, detail))
        return ok

    def figure(self, label: str, value: float | int | None, unit: str = "") -> None:
        """Record a number the drill measured (floats rounded to the millisecond)."""
        shown = round(value, 3) if isinstance(value, float) else value
        self.figures.append(Figure(label, shown, unit))

    def as_dict(self) -> dict[str, Any]:
        """JSON form (durations in seconds from the fault, null when not reached)."""
        return {
            "drill": self.drill,
            "ok": self.ok,
            "alert": str(self.alert),
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
            "allowed_failures": self.allowed_failures,
            "allowance": self.allowance,
            "job_id": self.job_id,
            "checks": [vars(check) for check in self.checks],
            "figures": [vars(figure) for figure in self.figures],
            "not_applicable": self.not_applicable,
            "notes": list(self.notes),
            "error": self.error,
            "duration": self.since_fault(self.finished_at),
        }


def labels_match(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """True when every wanted label has the wanted value."""
    return all(labels.get(key) == value for key, value in wanted.items())


def matching_alerts(
    alerts: Sequence[dict[str, Any]], name: str, labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The alerts (Prometheus's active ones, pending or firing) called `name` with `labels`."""
    wanted = {"alertname": name, **(labels or {})}
    return [alert for alert in alerts if labels_match(alert["labels"], wanted)]


def exposition_total(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of the samples called `name` (e.g. `x_total`) in a /metrics text whose labels
    include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = (labels or {}).items()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= sample.labels.items()
    )


def poll_until(
    check: Callable[[], T | None],
    timeout: float,
    interval: float,
    what: str,
    error: type[Exception],
    on_error: Callable[[Exception], None] | None = None,
    retry_on: tuple[type[Exception], ...] = (),
    on_wait: Callable[[float], None] | None = None,
) -> T:
    """Call `check` every `interval` seconds until it returns a value (not None).

    Exceptions of the `retry_on` types count as "not yet" (each passed to `on_error`);
    `on_wait(seconds waited)` is called about once a second; after `timeout` seconds `error`
    is raised saying what was awaited.
    """
    started = time.monotonic()
    last_report = 0.0
    while True:
        try:
            value = check()
        except retry_on as exc:
            value = None
            if on_error is not None:
                on_error(exc)
        if value is not None:
            return value
        waited = time.monotonic() - started
        if waited > timeout:
            raise error(f"timed out after {timeout:g} s waiting for {what}")
        if on_wait is not None and waited - last_report >= 1.0:
            last_report = waited
            on_wait(waited)
        time.sleep(interval)


__all__ = [
    "exposition_total",
    "Check",
    "DrillError",
    "DrillResult",
    "Figure",
    "Progress",
    "labels_match",
    "matching_alerts",
    "parse_time",
    "poll_until",
]
