"""The report builder: series read from Prometheus in, the report's numbers out (pure).

`build_report(spec, ReportInput, ...)` turns hourly series into the `Report` model that every
renderer (Markdown, HTML, PDF, CSV, JSON) prints, so all formats show the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from redline.slo import catalog
from redline.slo.maths import (
    HOUR,
    Status,
    attainment,
    burn_rate,
    day_of,
    delta,
    error_budget,
    limit_status,
    red_line_status,
    runs,
    slo_status,
    typical_spacing,
)
from redline.slo.report.inputs import (
    AlertSamples,
    JobRun,
    RemediationCounts,
    ReportError,
    ReportInput,
    SignalSeries,
    SloSeries,
    Window,
)
from redline.slo.report.maturity import build_maturity
from redline.slo.report.model import (
    CalendarDay,
    DeltaRow,
    Incident,
    Period,
    RemediationJob,
    RemediationRow,
    Report,
    SignalHour,
    SignalReport,
    SloGroup,
    SloHour,
    SloReport,
    Summary,
)
from redline.slo.report.remediation import build_actions, build_guards
from redline.slo.report.signals import SignalDef, signal_defs, source_notes
from redline.slo.report.text import num, utc
from redline.slo.spec import Slo, Spec


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _r(value: float | None, digits: int = 9) -> float | None:
    return None if value is None else round(value, digits)


def _period(window: Window) -> Period:
    return Period(start=_dt(window.start), end=_dt(window.end), seconds=window.seconds)


def sli_text(spec: Spec, slo: Slo) -> str:
    """A one-line description of what an SLO counts as bad."""
    sources = spec.sources.resolve()
    match slo.sli.kind:
        case "slow_requests":
            return (
                f"requests slower than {num(slo.sli.threshold_seconds)} s "
                f"({sources.required_name('request_duration')})"
            )
        case "errors":
            return (
                f"failed requests ({sources.required_name('errors')} / "
                f"{sources.required_name('requests')})"
            )


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


def build_slo_groups(slo: Slo, series: SloSeries, window: Window) -> list[SloGroup]:
    """A grouped SLO's rows, one per group with its own budget, the most budget spent first."""
    groups = []
    for key, group in series.groups.items():
        hours = _slo_hours(group, window.hours())
        attained = attainment(hours.bad, hours.events)
        budget = error_budget(slo.objective, hours.bad, hours.events)
        groups.append(
            SloGroup(
                labels=dict(key),
                status=slo_status(attained, slo.objective, budget.consumed if budget else None),
                events=round(hours.events, 3),
                bad_events=round(hours.bad, 3),
                attainment=_r(attained),
                budget_consumed=_r(budget.consumed) if budget else None,
                budget_remaining=_r(budget.remaining) if budget else None,
                hours_with_data=hours.with_data,
            )
        )
    # Worst first; a group without events (no budget to spend) last; then by labels, stably.
    return sorted(
        groups,
        key=lambda g: (
            g.budget_consumed is None,
            -(g.budget_consumed or 0.0),
            sorted(g.labels.items()),
        ),
    )


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
            f"no samples of the {slo.name} SLI between {utc(window.start)} and "
            f"{utc(window.end)}: {sli_text(spec, slo)}"
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
        group_by=list(slo.group_by),
        groups=build_slo_groups(slo, series, window),
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
        if defn.kind == "saturation" and status == "fail":
            status = "warn"  # a leading indicator past its line warns; the red line fails
    message = None
    if totals.measured == 0:
        message = f"no samples of {defn.series} between {utc(window.start)} and {utc(window.end)}"
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
        if outcome in catalog.SKIP_OUTCOMES:
            mean = None  # a skip runs nothing: the playbook's mean is not its duration
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
            f"Prometheus holds no samples of any SLI series between {utc(window.start)} and "
            f"{utc(window.end)} (looked for {', '.join(sorted({d.series for d in defs}))} and "
            f"the SLO series): the period is before the data starts, or nothing is scraped"
        )
    notes = [*source_notes(spec), *data.notes]
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
            f"the previous period ({utc(window.previous.start)} .. {utc(window.start)}) "
            "has no data: no deltas"
        )
    if not data.remediation.measured:
        notes.append(
            f"no {catalog.REDLINE_REMEDIATION_RUNS_TOTAL} series in the period: runs unknown"
        )
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
            remediation_shadow_runs=round(
                sum(r.runs for r in remediation if r.outcome == catalog.OUTCOME_SHADOW), 3
            ),
            remediation_skipped_runs=round(
                sum(r.runs for r in remediation if r.outcome in catalog.SKIP_OUTCOMES), 3
            ),
        ),
        notes=notes,
        slos=slos,
        red_lines=red_lines,
        rpos=[s for s in signals if s.kind == "rpo"],
        drift=[s for s in signals if s.kind == "drift"],
        saturation=[s for s in signals if s.kind == "saturation"],
        incidents=current_incidents,
        remediation=remediation,
        remediation_jobs=jobs,
        remediation_actions=build_actions(spec, data.remediation_events, current_incidents, window),
        remediation_guards=build_guards(data.remediation_guards),
        calendar=build_calendar(spec, slos, red_lines, current_incidents, window),
        deltas=build_deltas(
            slos, signals, len(current_incidents), prev_count, runs_now, runs_before
        ),
        maturity=build_maturity(spec, signals, remediation, jobs, data.live),
    )
