"""The SLO report builder: series read from Prometheus in, the report's numbers out (pure).

`build_report(spec, ReportInput, ...)` turns hourly series into the `Report` model that every
renderer (Markdown, HTML, PDF, CSV, JSON) prints, so all formats show the same numbers. The
model is versioned (`SCHEMA_VERSION`); its JSON Schema is `Report.model_json_schema()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from redline.slo.maths import (
    HOUR,
    Status,
    attainment,
    burn_rate,
    day_of,
    delta,
    error_budget,
    hour_starts,
    limit_status,
    red_line_status,
    runs,
    slo_status,
    typical_spacing,
)
from redline.slo.spec import Slo, Spec

SCHEMA_VERSION = "redline.report/v1"

SignalKind = Literal["red_line", "rpo", "drift"]
CheckStatus = Literal["met", "not_met", "no_data"]


class ReportError(Exception):
    """The report cannot be built (e.g. the period holds no data at all)."""


# ---------------------------------------------------------------------------------------------
# Inputs: what the fetcher read from Prometheus (plain numbers, timestamps in epoch seconds)


@dataclass(frozen=True)
class Window:
    """A report period [start, end) in epoch seconds, whole UTC hours."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ReportError(
                f"empty period: end {_iso(self.end)} is not after start {_iso(self.start)}"
            )
        if self.start % HOUR or self.end % HOUR:
            raise ReportError(
                f"the period must start and end on whole UTC hours "
                f"(got {_iso(self.start)} .. {_iso(self.end)})"
            )

    @property
    def seconds(self) -> int:
        """Length of the period."""
        return self.end - self.start

    @property
    def previous(self) -> Window:
        """The period of the same length just before this one."""
        return Window(self.start - self.seconds, self.start)

    def hours(self) -> list[float]:
        """End timestamps of the period's hours."""
        return hour_starts(self.start, self.end)


@dataclass(frozen=True)
class SloSeries:
    """An SLO's hourly events and bad share, and its 1 h bad share at a finer step."""

    hourly_total: Mapping[float, float]  # hour end -> events in that hour
    hourly_ratio: Mapping[float, float]  # hour end -> share of bad events in that hour
    burn_ratio: Sequence[tuple[float, float]] = ()  # (ts, bad share over the hour before ts)


@dataclass(frozen=True)
class SignalSeries:
    """A thresholded signal's hourly peak, and how many evaluation steps were measured / over."""

    step_seconds: float
    hourly_peak: Mapping[float, float]  # hour end -> worst value in that hour
    hourly_over: Mapping[float, float]  # hour end -> steps past the line
    hourly_samples: Mapping[float, float]  # hour end -> steps with a value
    p99: Mapping[float, float] = field(default_factory=dict)  # period end -> p99 over period
    threshold: float | None = None  # a measured threshold (drift) instead of the spec's


@dataclass(frozen=True)
class AlertSamples:
    """Timestamps at which one `ALERTS{alertstate="firing"}` series had a sample."""

    labels: Mapping[str, str]
    timestamps: Sequence[float]


@dataclass(frozen=True)
class RemediationCounts:
    """Playbook runs and their durations over one period (from the receiver's metrics)."""

    runs: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (playbook, outcome)
    duration_sum: Mapping[str, float] = field(default_factory=dict)
    duration_count: Mapping[str, float] = field(default_factory=dict)
    measured: bool = False


@dataclass(frozen=True)
class JobRun:
    """One remediation job from the receiver's job store."""

    id: str
    playbook: str
    outcome: str
    started: float
    finished: float | None


@dataclass(frozen=True)
class LiveSignals:
    """Live facts the maturity assessment reads besides the SLIs."""

    probes: Mapping[str, frozenset[str]] = field(default_factory=dict)  # probe -> regions
    probes_failing_at_end: frozenset[str] = frozenset()  # "region/probe"
    golden_evaluations: float | None = None  # golden-set evaluations in the period
    spot_unrecoverable: float | None = None  # requests a spot drain failed for good


@dataclass(frozen=True)
class ReportInput:
    """Everything the builder needs; `signals` maps a signal key to its instances."""

    window: Window
    slos: Mapping[str, SloSeries]
    signals: Mapping[str, Sequence[tuple[str, SignalSeries]]]
    alerts: Sequence[AlertSamples] = ()
    remediation: RemediationCounts = field(default_factory=RemediationCounts)
    remediation_previous: RemediationCounts = field(default_factory=RemediationCounts)
    jobs: Sequence[JobRun] | None = None
    live: LiveSignals = field(default_factory=LiveSignals)
    evaluation_interval_seconds: float = 15.0
    notes: Sequence[str] = ()


@dataclass(frozen=True)
class SignalDef:
    """A thresholded signal of the spec: a red line, an RPO target, or embedding drift."""

    key: str
    kind: SignalKind
    title: str
    series: str
    threshold: float
    unit: str
    above_is_bad: bool
    alert: str
    objective: str


def _num(value: float) -> str:
    return f"{value:g}"


def signal_defs(spec: Spec) -> list[SignalDef]:
    """The red lines, RPO targets and drift of the spec, in report order."""
    red, rpo = spec.red_lines, spec.rpo
    lat = red.latency_p99
    quantile = f"P{_num(lat.quantile * 100)}"
    reroute = " incl. reroute" if lat.includes_reroute else ""
    return [
        SignalDef(
            "latency_p99",
            "red_line",
            f"{quantile} latency{reroute} ({lat.window})",
            f"{spec.sources.request_duration}_bucket",
            lat.threshold_seconds,
            "s",
            True,
            "RedLineLatencyP99",
            f"{quantile} <= {_num(lat.threshold_seconds)} s",
        ),
        SignalDef(
            "context_keepalive",
            "red_line",
            "Conversation context keep-alive",
            "session_context_ttl_seconds",
            red.context_keepalive.min_seconds,
            "s",
            False,
            "RedLineContextKeepalive",
            f"context lives >= {_num(red.context_keepalive.min_seconds)} s",
        ),
        SignalDef(
            "index_consistency",
            "red_line",
            "Vector index replica staleness",
            "vectordb_index_staleness_seconds",
            red.index_consistency.max_staleness_seconds,
            "s",
            True,
            "RedLineIndexStaleness",
            f"staleness <= {_num(red.index_consistency.max_staleness_seconds)} s",
        ),
        SignalDef(
            "rpo_lora_adapter",
            "rpo",
            "LoRA adapter checkpoints",
            "model_checkpoint_last_success_timestamp_seconds",
            rpo.lora_adapter.max_seconds,
            "s",
            True,
            "LoRACheckpointRPOBreach",
            f"RPO <= {_num(rpo.lora_adapter.max_seconds)} s",
        ),
        SignalDef(
            "rpo_session_state",
            "rpo",
            "Session state (CDC)",
            "session_cdc_rpo_seconds",
            rpo.session_state.max_seconds,
            "s",
            True,
            "SessionRPOBreach",
            f"RPO <= {_num(rpo.session_state.max_seconds)} s",
        ),
        SignalDef(
            "rpo_embedding_index",
            "rpo",
            "Index delta log",
            "vectordb_delta_log_oldest_pending_age_seconds",
            rpo.embedding_index.max_seconds,
            "s",
            True,
            "IndexDeltaLogRPOBreach",
            f"RPO <= {_num(rpo.embedding_index.max_seconds)} s",
        ),
        SignalDef(
            "drift",
            "drift",
            "Embedding drift",
            "embedding_drift_score",
            spec.drift.threshold,
            "",
            True,
            "EmbeddingDrift",
            f"{spec.drift.method} score <= calibrated threshold",
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Output: the report model (JSON schema `redline.report/v1`)


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


class SignalHour(_Out):
    """One hour of a thresholded signal."""

    start: datetime
    peak: float | None = Field(description="Worst value in the hour; null without data.")
    seconds_over: float
    measured_seconds: float


class SignalReport(_Out):
    """A red line, an RPO target or a drift score over the period."""

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
    mean_duration_seconds: float | None = Field(description="Mean over all of the playbook's runs.")


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
    incidents: list[Incident]
    remediation: list[RemediationRow]
    remediation_jobs: list[RemediationJob] | None
    calendar: list[CalendarDay]
    deltas: list[DeltaRow]
    maturity: Maturity


# ---------------------------------------------------------------------------------------------
# Builders


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _r(value: float | None, digits: int = 9) -> float | None:
    return None if value is None else round(value, digits)


def _period(window: Window) -> Period:
    return Period(start=_dt(window.start), end=_dt(window.end), seconds=window.seconds)


def sli_text(spec: Spec, slo: Slo) -> str:
    """A one-line description of what an SLO counts as bad."""
    match slo.sli.kind:
        case "slow_requests":
            return (
                f"requests slower than {_num(slo.sli.threshold_seconds)} s "
                f"({spec.sources.request_duration})"
            )
        case "errors":
            return f"failed requests ({spec.sources.errors_total} / {spec.sources.requests_total})"


@dataclass(frozen=True)
class _Hours:
    events: float
    bad: float
    with_data: int
    per_hour: list[tuple[float, float | None, float | None]]  # (hour end, events, bad)


def _slo_hours(series: SloSeries, hours: Iterable[float]) -> _Hours:
    events = bad = 0.0
    with_data = 0
    per_hour: list[tuple[float, float | None, float | None]] = []
    for end in hours:
        total = series.hourly_total.get(end)
        ratio = series.hourly_ratio.get(end)
        if total is not None and total == 0:
            ratio = 0.0 if ratio is None else ratio
        if total is None or ratio is None:
            per_hour.append((end, None, None))
            continue
        hour_bad = ratio * total
        events += total
        bad += hour_bad
        with_data += 1
        per_hour.append((end, total, hour_bad))
    return _Hours(events, bad, with_data, per_hour)


def build_slo_report(spec: Spec, slo: Slo, series: SloSeries, window: Window) -> SloReport:
    """Attainment, budget, burn rates and the worst hour of one SLO."""
    current = _slo_hours(series, window.hours())
    previous = _slo_hours(series, window.previous.hours())
    attained = attainment(current.bad, current.events)
    budget = error_budget(slo.objective, current.bad, current.events)
    prev_budget = error_budget(slo.objective, previous.bad, previous.events)
    message = None
    if current.with_data == 0:
        message = (
            f"no samples of the {slo.name} SLI between {_iso(window.start)} and "
            f"{_iso(window.end)}: {sli_text(spec, slo)}"
        )
    elif current.events == 0:
        message = "no requests in the period: attainment is undefined, not 100 %"
    elif current.with_data < len(current.per_hour):
        missing = len(current.per_hour) - current.with_data
        message = f"{missing} of {len(current.per_hour)} hours have no data"
    worst: tuple[float, float] | None = None
    for end, events, hour_bad in current.per_hour:
        if events and hour_bad is not None:
            ratio = hour_bad / events
            if worst is None or ratio > worst[1]:
                worst = (end - HOUR, ratio)
    burn = [(ts, r) for ts, r in series.burn_ratio if window.start < ts <= window.end]
    peak = max(burn, key=lambda p: p[1]) if burn else None
    last = max(burn, key=lambda p: p[0]) if burn else None
    current_burn = None
    if last is not None and last[0] >= window.end - 2 * spec.timing.evaluation_interval_seconds:
        current_burn = burn_rate(last[1], slo.objective)
    return SloReport(
        name=slo.name,
        objective=slo.objective,
        sli=sli_text(spec, slo),
        status=slo_status(attained, slo.objective, budget.consumed if budget else None),
        message=message,
        events=round(current.events, 3),
        bad_events=round(current.bad, 3),
        attainment=_r(attained),
        budget_allowed_bad=_r(budget.allowed_bad, 3) if budget else None,
        budget_consumed=_r(budget.consumed) if budget else None,
        budget_remaining=_r(budget.remaining) if budget else None,
        burn_rate_peak=_r(burn_rate(peak[1], slo.objective), 6) if peak else None,
        burn_rate_peak_at=_dt(peak[0]) if peak else None,
        burn_rate_current=_r(current_burn, 6),
        worst_hour=_dt(worst[0]) if worst else None,
        worst_hour_error_ratio=_r(worst[1]) if worst else None,
        hours_with_data=current.with_data,
        hours=len(current.per_hour),
        previous_attainment=_r(attainment(previous.bad, previous.events)),
        previous_budget_consumed=_r(prev_budget.consumed) if prev_budget else None,
        hourly=[
            SloHour(start=_dt(end - HOUR), events=_r(ev, 3), bad=_r(b, 3))
            for end, ev, b in current.per_hour
        ],
    )


@dataclass(frozen=True)
class _SignalTotals:
    measured: float
    over: float
    peak: float | None
    peak_end: float | None


def _worse(a: float, b: float, above_is_bad: bool) -> bool:
    return a > b if above_is_bad else a < b


def _signal_totals(
    series: SignalSeries, hours: Iterable[float], above_is_bad: bool
) -> _SignalTotals:
    measured = over = 0.0
    peak: float | None = None
    peak_end: float | None = None
    for end in hours:
        measured += series.hourly_samples.get(end, 0.0) * series.step_seconds
        over += series.hourly_over.get(end, 0.0) * series.step_seconds
        value = series.hourly_peak.get(end)
        if value is not None and (peak is None or _worse(value, peak, above_is_bad)):
            peak, peak_end = value, end
    return _SignalTotals(measured, over, peak, peak_end)


def _incidents_of(alert: str, incidents: Sequence[Incident], window: Window) -> int:
    start, end = _dt(window.start), _dt(window.end)
    return sum(
        1
        for i in incidents
        if i.alert == alert and i.start < end and (i.end is None or i.end > start)
    )


def build_signal_report(
    defn: SignalDef,
    instance: str,
    series: SignalSeries,
    window: Window,
    incidents: Sequence[Incident],
) -> SignalReport:
    """Time past the line, peaks, the worst hour and the status of one signal."""
    hours = window.hours()
    totals = _signal_totals(series, hours, defn.above_is_bad)
    previous = _signal_totals(series, window.previous.hours(), defn.above_is_bad)
    threshold = series.threshold if series.threshold is not None else defn.threshold
    fired = _incidents_of(defn.alert, incidents, window)
    if defn.kind == "red_line":
        status = red_line_status(totals.measured, totals.over, fired > 0)
    else:
        status = limit_status(totals.measured > 0, totals.peak, threshold, defn.above_is_bad)
    message = None
    if totals.measured == 0:
        message = f"no samples of {defn.series} between {_iso(window.start)} and {_iso(window.end)}"
    worst: tuple[float, float] | None = None
    for end in hours:
        seconds = series.hourly_over.get(end, 0.0) * series.step_seconds
        if seconds > 0 and (worst is None or seconds > worst[1]):
            worst = (end, seconds)
    p99 = series.p99.get(float(window.end))
    return SignalReport(
        key=defn.key,
        kind=defn.kind,
        title=defn.title,
        instance=instance,
        objective=defn.objective,
        threshold=threshold,
        unit=defn.unit,
        above_is_bad=defn.above_is_bad,
        status=status,
        message=message,
        measured_seconds=round(totals.measured, 3),
        seconds_over=round(totals.over, 3),
        attained=_r(1 - totals.over / totals.measured) if totals.measured else None,
        peak=_r(totals.peak, 6),
        peak_hour=_dt(totals.peak_end - HOUR) if totals.peak_end is not None else None,
        last_hour_peak=_r(series.hourly_peak.get(float(window.end)), 6),
        p99=_r(p99, 6),
        worst_hour=_dt(worst[0] - HOUR) if worst else None,
        worst_hour_seconds_over=round(worst[1], 3) if worst else None,
        alert=defn.alert,
        incidents=fired,
        previous_seconds_over=round(previous.over, 3) if previous.measured else None,
        previous_peak=_r(previous.peak, 6),
        hourly=[
            SignalHour(
                start=_dt(end - HOUR),
                peak=_r(series.hourly_peak.get(end), 6),
                seconds_over=round(series.hourly_over.get(end, 0.0) * series.step_seconds, 3),
                measured_seconds=round(
                    series.hourly_samples.get(end, 0.0) * series.step_seconds, 3
                ),
            )
            for end in hours
        ],
    )


_INCIDENT_HIDDEN = frozenset({"__name__", "alertname", "alertstate", "severity"})


def build_incidents(
    alerts: Sequence[AlertSamples], window: Window, evaluation_interval: float
) -> list[Incident]:
    """Firing periods of each ALERTS series that overlap the window, oldest first.

    A series' samples are one evaluation interval apart while it fires (measured from the
    samples themselves, falling back to the spec's interval); a gap of more than two intervals
    ends one incident, and it ends one interval after its last sample.
    """
    found: list[Incident] = []
    for series in alerts:
        interval = typical_spacing(series.timestamps, evaluation_interval)
        for run in runs(series.timestamps, 2 * max(interval, evaluation_interval)):
            stop = run.last + interval
            if stop <= window.start or run.first >= window.end:
                continue
            ongoing = stop >= window.end
            end = min(stop, window.end)
            labels = {k: v for k, v in sorted(series.labels.items()) if k not in _INCIDENT_HIDDEN}
            found.append(
                Incident(
                    alert=series.labels.get("alertname", "?"),
                    severity=series.labels.get("severity", ""),
                    labels=labels,
                    start=_dt(run.first),
                    end=None if ongoing else _dt(stop),
                    duration_seconds=round(end - run.first, 3),
                    ongoing=ongoing,
                    started_before_period=run.first < window.start,
                )
            )
    found.sort(key=lambda i: (i.start, i.alert, sorted(i.labels.items())))
    return found


def build_remediation(
    current: RemediationCounts, previous: RemediationCounts
) -> list[RemediationRow]:
    """Runs per playbook and outcome, with the mean duration of the playbook's runs."""
    keys = sorted(set(current.runs) | set(previous.runs))
    rows: list[RemediationRow] = []
    for playbook, outcome in keys:
        count = current.duration_count.get(playbook, 0.0)
        mean = current.duration_sum.get(playbook, 0.0) / count if count > 0 else None
        prev = previous.runs.get((playbook, outcome), 0.0) if previous.measured else None
        runs_now = current.runs.get((playbook, outcome), 0.0)
        if round(runs_now) == 0 and (prev is None or round(prev) == 0):
            continue
        rows.append(
            RemediationRow(
                playbook=playbook,
                outcome=outcome,
                runs=round(runs_now, 3),
                previous_runs=round(prev, 3) if prev is not None else None,
                mean_duration_seconds=_r(mean, 3),
            )
        )
    return rows


def build_jobs(jobs: Sequence[JobRun], window: Window) -> list[RemediationJob]:
    """The job store's jobs that started in the period, oldest first."""
    inside = [j for j in jobs if window.start <= j.started < window.end]
    return [
        RemediationJob(
            id=j.id,
            playbook=j.playbook,
            outcome=j.outcome,
            started=_dt(j.started),
            finished=_dt(j.finished) if j.finished is not None else None,
            duration_seconds=round(j.finished - j.started, 3) if j.finished is not None else None,
        )
        for j in sorted(inside, key=lambda j: (j.started, j.id))
    ]


def build_calendar(
    spec: Spec,
    slos: Sequence[SloReport],
    red_lines: Sequence[SignalReport],
    incidents: Sequence[Incident],
    window: Window,
) -> list[CalendarDay]:
    """Day-by-day attainment of every SLO and time past every red line (UTC days)."""
    days = sorted({day_of(end) for end in window.hours()})
    objectives = {slo.name: slo.objective for slo in spec.slos}
    events: dict[tuple[str, date], list[float]] = {}
    for slo in slos:
        for hour in slo.hourly:
            if hour.events is None or hour.bad is None:
                continue
            acc = events.setdefault((slo.name, hour.start.date()), [0.0, 0.0])
            acc[0] += hour.events
            acc[1] += hour.bad
    over: dict[tuple[str, date], float] = {}
    for line in red_lines:
        for sig in line.hourly:
            key = (line.key, sig.start.date())
            over[key] = over.get(key, 0.0) + sig.seconds_over
    calendar: list[CalendarDay] = []
    for day in days:
        attained: dict[str, float | None] = {}
        status: dict[str, Status] = {}
        for slo in slos:
            total, bad = events.get((slo.name, day), (0.0, 0.0))
            value = attainment(bad, total)
            attained[slo.name] = _r(value)
            if value is None:
                status[slo.name] = "no_data"
            else:
                status[slo.name] = "pass" if value >= objectives[slo.name] else "fail"
        calendar.append(
            CalendarDay(
                day=day,
                slo_attainment=attained,
                slo_status=status,
                red_line_seconds_over={
                    line.key: round(over.get((line.key, day), 0.0), 3) for line in red_lines
                },
                incidents=sum(1 for i in incidents if i.start.date() == day),
            )
        )
    return calendar


def build_deltas(
    slos: Sequence[SloReport],
    signals: Sequence[SignalReport],
    incidents: int,
    previous_incidents: int | None,
    runs_now: float,
    runs_before: float | None,
) -> list[DeltaRow]:
    """Headline numbers against the previous period of the same length."""
    rows: list[DeltaRow] = []
    for slo in slos:
        rows.append(
            DeltaRow(
                subject=f"slo:{slo.name}",
                metric="attainment",
                unit="ratio",
                current=slo.attainment,
                previous=slo.previous_attainment,
                change=_r(delta(slo.attainment, slo.previous_attainment)),
            )
        )
        rows.append(
            DeltaRow(
                subject=f"slo:{slo.name}",
                metric="budget_consumed",
                unit="ratio",
                current=slo.budget_consumed,
                previous=slo.previous_budget_consumed,
                change=_r(delta(slo.budget_consumed, slo.previous_budget_consumed)),
            )
        )
    for sig in signals:
        subject = f"{sig.kind}:{sig.key}" + (f":{sig.instance}" if sig.instance else "")
        if sig.kind == "red_line":
            current = sig.seconds_over if sig.measured_seconds else None
            rows.append(
                DeltaRow(
                    subject=subject,
                    metric="seconds_over",
                    unit="seconds",
                    current=current,
                    previous=sig.previous_seconds_over,
                    change=_r(delta(current, sig.previous_seconds_over), 3),
                )
            )
        else:
            rows.append(
                DeltaRow(
                    subject=subject,
                    metric="peak",
                    unit="value",
                    current=sig.peak,
                    previous=sig.previous_peak,
                    change=_r(delta(sig.peak, sig.previous_peak), 6),
                )
            )
    rows.append(
        DeltaRow(
            subject="incidents",
            metric="count",
            unit="count",
            current=float(incidents),
            previous=None if previous_incidents is None else float(previous_incidents),
            change=None if previous_incidents is None else float(incidents - previous_incidents),
        )
    )
    rows.append(
        DeltaRow(
            subject="remediation",
            metric="runs",
            unit="count",
            current=round(runs_now, 3),
            previous=None if runs_before is None else round(runs_before, 3),
            change=_r(delta(runs_now, runs_before), 3),
        )
    )
    return rows


LEVEL_NAMES = {
    0: "none",
    1: "basic availability",
    2: "semantic consistency",
    3: "state resilience",
    4: "cross-region continuity",
}


def _check(
    level: int, cid: str, requirement: str, status: CheckStatus, evidence: str
) -> MaturityCheck:
    return MaturityCheck(
        level=level, id=cid, requirement=requirement, status=status, evidence=evidence
    )


def _verified(
    playbooks: Iterable[str],
    remediation: Sequence[RemediationRow],
    jobs: Sequence[RemediationJob] | None,
) -> tuple[CheckStatus, str]:
    wanted = set(playbooks)
    runs_ok = sum(r.runs for r in remediation if r.playbook in wanted and r.outcome == "succeeded")
    runs_ok += sum(1 for j in jobs or () if j.playbook in wanted and j.outcome == "succeeded")
    names = " or ".join(sorted(wanted))
    if runs_ok >= 1:
        return "met", f"{runs_ok:g} verified run(s) of {names}"
    if not remediation and not jobs:
        return "no_data", "no remediation runs recorded in the period"
    return "not_met", f"no succeeded run of {names} in the period"


def _signal_held(
    signals: Sequence[SignalReport], key: str, wording: str
) -> tuple[CheckStatus, str]:
    found = [s for s in signals if s.key == key]
    if not found or all(s.measured_seconds == 0 for s in found):
        return "no_data", f"{wording}: not measured in the period"
    worst = [s for s in found if s.seconds_over > 0 or s.status == "fail"]
    if worst:
        s = worst[0]
        return "not_met", (
            f"{wording}: {s.seconds_over:g} s past the line, worst {s.peak:g}{s.unit} "
            f"(limit {s.threshold:g}{s.unit})"
        )
    s = found[0]
    return "met", f"{wording}: held, worst {s.peak:g}{s.unit} (limit {s.threshold:g}{s.unit})"


def build_maturity(
    spec: Spec,
    signals: Sequence[SignalReport],
    remediation: Sequence[RemediationRow],
    jobs: Sequence[RemediationJob] | None,
    live: LiveSignals,
) -> Maturity:
    """Score the four disaster-recovery levels from live signals and the spec."""
    checks: list[MaturityCheck] = []
    regions = set(spec.regions)
    for probe, label in (("healthz", "health"), ("chat_dry_run", "dry-run")):
        seen = set(live.probes.get(probe, frozenset()))
        missing = sorted(regions - seen)
        status: CheckStatus = "met" if not missing else ("no_data" if not seen else "not_met")
        evidence = (
            f'llm_probe_success{{probe="{probe}"}} on {", ".join(sorted(seen))}'
            if not missing
            else f"no {probe} probe series for region(s) {', '.join(missing)}"
        )
        checks.append(
            _check(1, f"{probe}_probes", f"{label} probes on every region", status, evidence)
        )
    measured_any = any(live.probes.values())
    failing = sorted(live.probes_failing_at_end)
    checks.append(
        _check(
            1,
            "self_recovery",
            "failed parts came back by themselves (every probe succeeding at the period's end)",
            "no_data" if not measured_any else ("not_met" if failing else "met"),
            f"still failing: {', '.join(failing)}" if failing else "all probes succeeding",
        )
    )
    evals = live.golden_evaluations
    checks.append(
        _check(
            2,
            "golden_set",
            "outputs compared on the golden set per model version",
            "no_data" if evals is None else ("met" if evals > 0 else "not_met"),
            "llm_eval_requests_total absent"
            if evals is None
            else f"{evals:.0f} golden-set evaluations in the period",
        )
    )
    status_, evidence_ = _verified([spec.rollback.playbook], remediation, jobs)
    checks.append(
        _check(2, "rollback_verified", "rollbacks verified on the golden set", status_, evidence_)
    )
    for cid, key, wording in (
        (
            "session_rpo",
            "rpo_session_state",
            f"session CDC RPO <= {_num(spec.rpo.session_state.max_seconds)} s",
        ),
        (
            "keepalive",
            "context_keepalive",
            f"context keep-alive >= {_num(spec.red_lines.context_keepalive.min_seconds)} s",
        ),
        (
            "index_rpo",
            "rpo_embedding_index",
            f"index RPO <= {_num(spec.rpo.embedding_index.max_seconds)} s",
        ),
        (
            "lora_rpo",
            "rpo_lora_adapter",
            f"LoRA checkpoints within {_num(spec.rpo.lora_adapter.max_seconds)} s",
        ),
    ):
        st, ev = _signal_held(signals, key, wording)
        checks.append(_check(3, cid, wording, st, ev))
    lora = spec.rpo.lora_adapter
    interval = lora.checkpoint_interval_seconds
    spec_ok = interval is None or interval <= lora.max_seconds
    checks.append(
        _check(
            3,
            "lora_interval",
            "the spec checkpoints LoRA adapters at least as often as their RPO",
            "met" if spec_ok else "not_met",
            f"checkpoint interval {_num(interval or 0)} s vs RPO {_num(lora.max_seconds)} s"
            if interval is not None
            else "no checkpoint interval set",
        )
    )
    st, ev = _verified(["delta_log_replay", "freeze_and_replay"], remediation, jobs)
    checks.append(_check(3, "replay_verified", "index replays verified", st, ev))
    lat = spec.red_lines.latency_p99
    multi = len(spec.regions) >= 2 and lat.includes_reroute
    checks.append(
        _check(
            4,
            "regions",
            "two or more regions, latency measured end to end incl. reroute",
            "met" if multi else "not_met",
            f"regions {', '.join(spec.regions)}; includes_reroute={lat.includes_reroute}",
        )
    )
    st, ev = _verified(["reroute"], remediation, jobs)
    checks.append(_check(4, "reroute_verified", "reroute verified", st, ev))
    st, ev = _signal_held(
        signals, "latency_p99", f"P99 incl. reroute <= {_num(lat.threshold_seconds)} s"
    )
    checks.append(
        _check(4, "latency", f"P99 incl. reroute <= {_num(lat.threshold_seconds)} s", st, ev)
    )
    red = [s for s in signals if s.kind == "red_line"]
    failing_lines = [s.key for s in red if s.status in ("fail", "warn")]
    unmeasured = [s.key for s in red if s.status == "no_data"]
    red_status: CheckStatus = (
        "not_met" if failing_lines else ("no_data" if unmeasured or not red else "met")
    )
    red_evidence = (
        f"crossed: {', '.join(failing_lines)}"
        if failing_lines
        else (f"not measured: {', '.join(unmeasured)}" if unmeasured else "every red line held")
    )
    checks.append(_check(4, "red_lines", "every red line held", red_status, red_evidence))
    # An aborted stream that resumed elsewhere is recoverable; only a request the client could
    # not complete (`recoverable="false"`) breaks the promise.
    spot = live.spot_unrecoverable
    checks.append(
        _check(
            4,
            "spot_drain",
            "spot preemptions drained with no unrecoverable client error",
            "no_data" if spot is None else ("met" if round(spot) == 0 else "not_met"),
            "llm_spot_interrupted_requests_total absent"
            if spot is None
            else f"{spot:.0f} unrecoverable interruption(s)",
        )
    )
    holds = {lvl: all(c.status == "met" for c in checks if c.level == lvl) for lvl in range(1, 5)}
    level = 0
    for lvl in range(1, 5):
        if not holds[lvl]:
            break
        level = lvl
    next_level = level + 1 if level < 4 else None
    missing = [
        f"{c.requirement} ({'not measured' if c.status == 'no_data' else 'not met'}: {c.evidence})"
        for c in checks
        if next_level is not None and c.level == next_level and c.status != "met"
    ]
    return Maturity(
        level=level,
        level_name=LEVEL_NAMES[level],
        next_level=next_level,
        missing_for_next=missing,
        levels=[
            MaturityLevel(level=lvl, name=LEVEL_NAMES[lvl], holds=holds[lvl]) for lvl in range(1, 5)
        ],
        checks=checks,
    )


def _worst_status(statuses: Iterable[Status]) -> Status:
    order: dict[Status, int] = {"no_data": 0, "pass": 1, "warn": 2, "fail": 3}
    values = list(statuses)
    measured = [s for s in values if s != "no_data"]
    if not measured:
        return "no_data"
    return max(measured, key=lambda s: order[s])


def build_report(
    spec: Spec,
    data: ReportInput,
    *,
    spec_source: str,
    prometheus: str,
    generated_at: datetime,
) -> Report:
    """The whole report; ReportError when the period holds no data at all."""
    window = data.window
    defs = signal_defs(spec)
    interval = data.evaluation_interval_seconds
    current_incidents = build_incidents(data.alerts, window, interval)
    previous_incidents = [
        i
        for i in build_incidents(data.alerts, window.previous, interval)
        if not i.started_before_period
    ]
    slos = [
        build_slo_report(spec, slo, data.slos.get(slo.name, SloSeries({}, {})), window)
        for slo in spec.slos
    ]
    signals: list[SignalReport] = []
    for defn in defs:
        instances = data.signals.get(defn.key) or [("", SignalSeries(1.0, {}, {}, {}))]
        for instance, series in instances:
            signals.append(build_signal_report(defn, instance, series, window, current_incidents))
    if all(s.hours_with_data == 0 for s in slos) and all(s.measured_seconds == 0 for s in signals):
        raise ReportError(
            f"Prometheus holds no samples of any SLI series between {_iso(window.start)} and "
            f"{_iso(window.end)} (looked for {', '.join(sorted({d.series for d in defs}))} and "
            f"the SLO series): the period is before the data starts, or nothing is scraped"
        )
    notes = list(data.notes)
    notes += [f"SLO {s.name}: {s.message}" for s in slos if s.message]
    notes += [
        f"{s.title}{' ' + s.instance if s.instance else ''}: {s.message}"
        for s in signals
        if s.message
    ]
    previous_has_data = any(s.previous_attainment is not None for s in slos) or any(
        s.previous_seconds_over is not None or s.previous_peak is not None for s in signals
    )
    if not previous_has_data:
        notes.append(
            f"the previous period ({_iso(window.previous.start)} .. {_iso(window.start)}) "
            "has no data: no deltas"
        )
    if not data.remediation.measured:
        notes.append("no redline_remediation_runs_total series in the period: runs unknown")
    remediation = build_remediation(data.remediation, data.remediation_previous)
    jobs = build_jobs(data.jobs, window) if data.jobs is not None else None
    red_lines = [s for s in signals if s.kind == "red_line"]
    runs_now = sum(r.runs for r in remediation)
    runs_before = (
        sum(r.previous_runs or 0.0 for r in remediation)
        if data.remediation_previous.measured
        else None
    )
    prev_count = len(previous_incidents) if previous_has_data else None
    return Report(
        service=spec.service,
        spec_source=spec_source,
        prometheus=prometheus,
        generated_at=generated_at,
        period=_period(window),
        previous_period=_period(window.previous),
        step_seconds=max(
            (s.step_seconds for v in data.signals.values() for _, s in v), default=0.0
        ),
        summary=Summary(
            status=_worst_status([s.status for s in slos] + [s.status for s in red_lines]),
            slos_failing=sum(1 for s in slos if s.status == "fail"),
            red_lines_breached=sum(1 for s in red_lines if s.seconds_over > 0),
            incidents=len(current_incidents),
            previous_incidents=prev_count,
            remediation_runs=round(runs_now, 3),
        ),
        notes=notes,
        slos=slos,
        red_lines=red_lines,
        rpos=[s for s in signals if s.kind == "rpo"],
        drift=[s for s in signals if s.kind == "drift"],
        incidents=current_incidents,
        remediation=remediation,
        remediation_jobs=jobs,
        calendar=build_calendar(spec, slos, red_lines, current_incidents, window),
        deltas=build_deltas(
            slos, signals, len(current_incidents), prev_count, runs_now, runs_before
        ),
        maturity=build_maturity(spec, signals, remediation, jobs, data.live),
    )
