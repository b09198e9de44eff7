"""The report model every renderer prints (JSON schema `redline.report/v1`).

The model is versioned (`SCHEMA_VERSION`); its JSON Schema is `Report.model_json_schema()`.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from redline.slo.maths import Status
from redline.slo.report.signals import SignalKind

SCHEMA_VERSION = "redline.report/v1"

CheckStatus = Literal["met", "not_met", "no_data"]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Period(_Out):
    """A report period."""

    start: datetime = Field(description="Inclusive start (UTC).")
    end: datetime = Field(description="Exclusive end (UTC).")
    seconds: int = Field(description="Length in seconds.")


class SloHour(_Out):
    """One hour of an SLO."""

    start: datetime
    events: float | None = Field(description="Events in the hour; null without data.")
    bad: float | None = Field(description="Bad events in the hour; null without data.")


class SloGroup(_Out):
    """One group of a grouped SLO (`slos[].group_by`) over the period: its own budget."""

    labels: dict[str, str] = Field(description="The group's label values.")
    status: Status
    events: float = Field(description="Events in the period.")
    bad_events: float = Field(description="Bad events in the period.")
    attainment: float | None = Field(description="Share of good events; null without events.")
    budget_consumed: float | None = Field(description="Share of the group's error budget spent.")
    budget_remaining: float | None = Field(description="Share of the group's error budget left.")
    hours_with_data: int


class SloReport(_Out):
    """An error-budget SLO over the period."""

    name: str
    objective: float = Field(description="Target share of good events.")
    sli: str = Field(description="What counts as a bad event.")
    status: Status
    message: str | None = Field(None, description="Why numbers are missing, when they are.")
    events: float = Field(description="Events in the period.")
    bad_events: float = Field(description="Bad events in the period.")
    attainment: float | None = Field(description="Share of good events; null without events.")
    budget_allowed_bad: float | None = Field(description="Bad events the objective allows.")
    budget_consumed: float | None = Field(description="Share of the error budget spent.")
    budget_remaining: float | None = Field(description="Share of the error budget left.")
    burn_rate_peak: float | None = Field(description="Highest 1 h burn rate.")
    burn_rate_peak_at: datetime | None
    burn_rate_current: float | None = Field(description="1 h burn rate at the period's end.")
    worst_hour: datetime | None = Field(description="Start of the hour with most bad share.")
    worst_hour_error_ratio: float | None
    hours_with_data: int
    hours: int
    previous_attainment: float | None
    previous_budget_consumed: float | None
    hourly: list[SloHour]
    group_by: list[str] = Field(
        default_factory=list, description="The labels the SLO is grouped by; empty when not."
    )
    groups: list[SloGroup] = Field(
        default_factory=list,
        description="One row per group, the most budget spent first; the fields above are the "
        "whole fleet's.",
    )


class SignalHour(_Out):
    """One hour of a thresholded signal."""

    start: datetime
    peak: float | None = Field(description="Worst value in the hour; null without data.")
    seconds_over: float
    measured_seconds: float


class SignalReport(_Out):
    """A red line, an RPO target, a drift score or an engine's saturation over the period."""

    key: str
    kind: SignalKind
    title: str
    instance: str = Field(description="Label values of the instance ('' when aggregated).")
    objective: str
    threshold: float
    unit: str
    above_is_bad: bool
    status: Status
    message: str | None = None
    measured_seconds: float = Field(description="Time the signal had a value.")
    seconds_over: float = Field(description="Time spent past the line.")
    attained: float | None = Field(description="Share of measured time within the line.")
    peak: float | None = Field(description="Worst value (max, or min when low is bad).")
    peak_hour: datetime | None
    last_hour_peak: float | None = Field(description="Worst value in the period's last hour.")
    p99: float | None = Field(None, description="P99 of the value over the period (RPOs).")
    worst_hour: datetime | None = Field(description="Hour with the most time past the line.")
    worst_hour_seconds_over: float | None
    alert: str
    incidents: int = Field(description="Times its alert fired in the period.")
    previous_seconds_over: float | None
    previous_peak: float | None
    hourly: list[SignalHour]


class Incident(_Out):
    """A firing alert reconstructed from the `ALERTS` series."""

    alert: str
    severity: str
    labels: dict[str, str] = Field(description="Its other labels (red_line, slo, region...).")
    start: datetime
    end: datetime | None = Field(description="When it stopped firing; null while ongoing.")
    duration_seconds: float = Field(description="Firing time (up to the period's end).")
    ongoing: bool
    started_before_period: bool


class RemediationRow(_Out):
    """Runs of one playbook with one outcome."""

    playbook: str
    outcome: str
    runs: float
    previous_runs: float | None
    mean_duration_seconds: float | None = Field(
        description="Mean over all of the playbook's runs; null for skips (nothing ran)."
    )


ActionKind = Literal["acted", "shadow", "skipped", "dry_run", "other"]


class RemediationAction(_Out):
    """Runs of a playbook that ended one way at one time, with the alert they answered."""

    at: datetime = Field(description="End of the step in which Prometheus saw the runs.")
    playbook: str
    outcome: str = Field(
        description="succeeded, failed, shadow, dry_run, or the skip: off, paused, over_budget, "
        "breaker_open."
    )
    kind: ActionKind = Field(
        description="acted (succeeded, failed), shadow (planned and checked, nothing changed), "
        "skipped, dry_run."
    )
    runs: float = Field(description="Runs with this outcome in the step.")
    alert: str | None = Field(description="The firing alert routed to the playbook; null if none.")
    target: dict[str, str] = Field(description="That alert's labels (model, region, ...).")
    text: str = Field(description="What happened, in words (what shadow mode would have done).")


class RemediationGuard(_Out):
    """A playbook whose guard rails were not plain `act` at some point of the period."""

    playbook: str
    modes: list[str] = Field(description="Modes the period saw (act, shadow, off).")
    mode_at_end: str | None
    paused_during: bool
    paused_at_end: bool
    breaker_open_during: bool
    breaker_open_at_end: bool
    text: str


class RemediationJob(_Out):
    """One job from the receiver's job store."""

    id: str
    playbook: str
    outcome: str
    started: datetime
    finished: datetime | None
    duration_seconds: float | None


class CalendarDay(_Out):
    """One UTC day of the period."""

    day: date
    slo_attainment: dict[str, float | None]
    slo_status: dict[str, Status]
    red_line_seconds_over: dict[str, float]
    incidents: int


class DeltaRow(_Out):
    """A number against the previous period of the same length."""

    subject: str
    metric: str
    unit: Literal["ratio", "seconds", "count", "value"]
    current: float | None
    previous: float | None
    change: float | None


class MaturityCheck(_Out):
    """One requirement of a maturity level."""

    level: int
    id: str
    requirement: str
    status: CheckStatus
    evidence: str


class MaturityLevel(_Out):
    """Whether one level holds."""

    level: int
    name: str
    holds: bool


class Maturity(_Out):
    """The disaster-recovery maturity assessment."""

    level: int = Field(description="Highest level whose checks (and all below) are met; 0-4.")
    level_name: str
    next_level: int | None
    missing_for_next: list[str]
    levels: list[MaturityLevel]
    checks: list[MaturityCheck]


class Summary(_Out):
    """The headline."""

    status: Status
    slos_failing: int
    red_lines_breached: int
    incidents: int
    previous_incidents: int | None
    remediation_runs: float
    remediation_shadow_runs: float = Field(0.0, description="Runs shadow mode only planned.")
    remediation_skipped_runs: float = Field(
        0.0, description="Runs skipped: mode off, paused, over budget, breaker open."
    )


class Report(_Out):
    """An SLO report (schema `redline.report/v1`)."""

    schema_version: Literal["redline.report/v1"] = "redline.report/v1"
    service: str
    spec_source: str
    prometheus: str
    generated_at: datetime
    period: Period
    previous_period: Period
    step_seconds: float = Field(description="Resolution of time-over measurements.")
    summary: Summary
    notes: list[str]
    slos: list[SloReport]
    red_lines: list[SignalReport]
    rpos: list[SignalReport]
    drift: list[SignalReport]
    saturation: list[SignalReport] = Field(
        default_factory=list,
        description="The engine's saturation (engine sources only): leading indicators of the "
        "latency red line.",
    )
    incidents: list[Incident]
    remediation: list[RemediationRow]
    remediation_jobs: list[RemediationJob] | None
    remediation_actions: list[RemediationAction] = Field(
        default_factory=list, description="What ran, what shadow mode would have done, skips."
    )
    remediation_guards: list[RemediationGuard] = Field(
        default_factory=list, description="Playbooks in shadow or off mode, paused, or disabled."
    )
    calendar: list[CalendarDay]
    deltas: list[DeltaRow]
    maturity: Maturity
