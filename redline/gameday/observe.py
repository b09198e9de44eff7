"""What a game day reads while it runs, and the timeline it builds from it.

Every poll reads, from the user's own services:
- Prometheus `/api/v1/alerts`: the expected alert firing (detect) and no longer active
  (recover); every red-line alert firing (the abort condition and a negative drill's verdict);
- Alertmanager `/api/v2/alerts`: the alert received and active there (the notification
  pipeline's first hop);
- the receiver's `/jobs` (when given): the job the alert's webhook created (notify), its first
  recorded step (playbook start) and its last successful verify (remediate);
- Prometheus: the client error ratio over the last minute (the abort condition).

`advance` is pure: it folds one `Observation` into the `Timeline`, each time kept at the poll
that first saw it (so a time is late by at most one poll interval plus the source's own lag).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from redline.core.times import parse_time
from redline.gameday.plan import RED_LINE_ALERTS, GamedayPlan
from redline.platform.prometheus import PrometheusClient


@dataclass(frozen=True)
class Observation:
    """One poll's reading."""

    at: float
    firing: frozenset[str]
    """Alert names firing in Prometheus."""
    active: frozenset[str]
    """Alert names pending or firing in Prometheus."""
    alertmanager: frozenset[str]
    """Alert names active in Alertmanager."""
    jobs: tuple[Mapping[str, Any], ...] = ()
    error_ratio: float | None = None


@dataclass
class Timeline:
    """When each step of the loop was first seen (unix seconds; None: not seen)."""

    fault_at: float
    firing_at: float | None = None
    alertmanager_at: float | None = None
    notified_at: float | None = None
    playbook_started_at: float | None = None
    remediated_at: float | None = None
    recovered_at: float | None = None
    job_id: str | None = None
    red_lines: dict[str, float] = field(default_factory=dict)
    """Each red-line alert seen firing, with when it was first seen."""
    worst_error_ratio: float = 0.0

    def since_fault(self, when: float | None) -> float | None:
        """Seconds from the fault to `when`."""
        return None if when is None else round(when - self.fault_at, 3)


def _first_step(job: Mapping[str, Any]) -> float | None:
    steps = job.get("steps") or []
    return float(steps[0]["at"]) if steps else None


def _last_verify(job: Mapping[str, Any]) -> float | None:
    ok = [s for s in job.get("steps") or [] if s.get("phase") == "verify" and s.get("ok")]
    return float(ok[-1]["at"]) if ok else None


def job_of(
    plan: GamedayPlan, fault_at: float, jobs: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The oldest firing job of the expected alert created since the fault."""
    found = [
        job
        for job in jobs
        if (job.get("alert") or {}).get("labels", {}).get("alertname") == plan.expects
        and (job.get("alert") or {}).get("status", "firing") == "firing"
        and parse_time(str(job["created_at"])) >= fault_at - 1.0
    ]
    return min(found, key=lambda job: parse_time(str(job["created_at"]))) if found else None


def advance(timeline: Timeline, plan: GamedayPlan, seen: Observation) -> None:
    """Fold one observation into the timeline (first sightings only; pure)."""
    for alert in RED_LINE_ALERTS:
        if str(alert) in seen.firing:
            timeline.red_lines.setdefault(str(alert), seen.at)
    if seen.error_ratio is not None and math.isfinite(seen.error_ratio):
        timeline.worst_error_ratio = max(timeline.worst_error_ratio, seen.error_ratio)
    expected = plan.expects
    if expected is None:
        return
    if timeline.firing_at is None and expected in seen.firing:
        timeline.firing_at = seen.at
    if timeline.alertmanager_at is None and expected in seen.alertmanager:
        timeline.alertmanager_at = seen.at
    job = job_of(plan, timeline.fault_at, seen.jobs)
    if job is not None:
        timeline.job_id = str(job.get("id", ""))
        timeline.notified_at = timeline.notified_at or parse_time(str(job["created_at"]))
        timeline.playbook_started_at = timeline.playbook_started_at or _first_step(job)
        timeline.remediated_at = timeline.remediated_at or _last_verify(job)
    if (
        timeline.firing_at is not None
        and timeline.recovered_at is None
        and expected not in seen.active
    ):
        timeline.recovered_at = seen.at


def abort_reason(plan: GamedayPlan, timeline: Timeline, seen: Observation) -> str | None:
    """Why the game day must stop now, or None."""
    safety = plan.safety
    ratio = seen.error_ratio
    if (
        safety.abort_error_ratio is not None
        and ratio is not None
        and ratio > safety.abort_error_ratio
    ):
        return (
            f"the client error ratio over the last minute is {ratio:.4f}, over the abort "
            f"condition's {safety.abort_error_ratio:g}"
        )
    if safety.abort_red_line_seconds is not None:
        for alert, since in sorted(timeline.red_lines.items()):
            breached = seen.at - since
            if alert in seen.firing and breached > safety.abort_red_line_seconds:
                return (
                    f"{alert} has been firing for {breached:.0f} s, over the abort condition's "
                    f"{safety.abort_red_line_seconds:g} s"
                )
    return None


class Observer:
    """Reads the user's Prometheus, Alertmanager and (optionally) redline's receiver."""

    def __init__(
        self,
        prometheus: PrometheusClient,
        alertmanager_url: str,
        receiver_url: str | None = None,
        receiver_token: str | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.prometheus = prometheus
        self.alertmanager_url = alertmanager_url.rstrip("/")
        self.receiver_url = receiver_url.rstrip("/") if receiver_url else None
        self.receiver_token = receiver_token
        self.http = http or httpx.Client(timeout=10.0, trust_env=False)

    def close(self) -> None:
        """Close the HTTP connections."""
        self.http.close()
        self.prometheus.close()

    def fetch(self, plan: GamedayPlan, at: float, fault_at: float) -> Observation:
        """One poll; PrometheusError or httpx.HTTPError when a source does not answer."""
        alerts = self.prometheus.alerts()
        firing = frozenset(a["labels"]["alertname"] for a in alerts if a.get("state") == "firing")
        active = frozenset(a["labels"]["alertname"] for a in alerts)
        response = self.http.get(
            f"{self.alertmanager_url}/api/v2/alerts", params={"active": "true"}
        )
        response.raise_for_status()
        alertmanager = frozenset(
            a["labels"]["alertname"]
            for a in response.json()
            if (a.get("status") or {}).get("state") == "active"
        )
        return Observation(
            at=at,
            firing=firing,
            active=active,
            alertmanager=alertmanager,
            jobs=tuple(self.jobs(plan, fault_at)),
            error_ratio=self.scalar(plan.error_ratio_query),
        )

    def jobs(self, plan: GamedayPlan, fault_at: float) -> list[Mapping[str, Any]]:
        """The receiver's job of the expected alert since the fault, with its steps (the list
        leaves them out); none when no receiver was given or no such job exists yet."""
        if self.receiver_url is None or plan.expects is None:
            return []
        headers = {"Authorization": f"Bearer {self.receiver_token}"} if self.receiver_token else {}
        response = self.http.get(
            f"{self.receiver_url}/jobs", params={"limit": "20"}, headers=headers
        )
        response.raise_for_status()
        job = job_of(plan, fault_at, response.json()["jobs"])
        if job is None:
            return []
        response = self.http.get(f"{self.receiver_url}/jobs/{job['id']}", headers=headers)
        response.raise_for_status()
        detail: Mapping[str, Any] = response.json()
        return [detail]

    def scalar(self, query: str, at: float | None = None) -> float | None:
        """The query's one value (None: no result)."""
        result = self.prometheus.instant(query, at)
        return float(result[0][1]) if result else None
