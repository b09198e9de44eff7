"""The report as CSV tables (one file per table, stable column names) and as versioned JSON."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import date, datetime

from redline.reporting.gamedays import GamedayRun, ReportWithGamedays
from redline.reporting.render import format as f
from redline.slo.report import Report, SignalReport

CellValue = str | float | int | bool | None | datetime | date


def _text(value: CellValue) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _csv(columns: Sequence[str], rows: Sequence[Sequence[CellValue]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_text(v) for v in row])
    return buffer.getvalue()


SLO_COLUMNS = (
    "slo", "objective", "status", "events", "bad_events", "attainment", "budget_allowed_bad",
    "budget_consumed", "budget_remaining", "burn_rate_peak", "burn_rate_peak_at",
    "burn_rate_current", "worst_hour", "worst_hour_error_ratio", "hours_with_data", "hours",
    "previous_attainment", "previous_budget_consumed",
)  # fmt: skip
SIGNAL_COLUMNS = (
    "kind", "key", "instance", "title", "objective", "threshold", "unit", "status",
    "measured_seconds", "seconds_over", "attained", "peak", "peak_hour", "p99", "last_hour_peak",
    "worst_hour", "worst_hour_seconds_over", "alert", "incidents", "previous_seconds_over",
    "previous_peak",
)  # fmt: skip
INCIDENT_COLUMNS = (
    "start", "end", "duration_seconds", "alert", "severity", "labels", "ongoing",
    "started_before_period",
)  # fmt: skip
REMEDIATION_COLUMNS = ("playbook", "outcome", "runs", "previous_runs", "mean_duration_seconds")
ACTION_COLUMNS = ("at", "playbook", "outcome", "kind", "runs", "alert", "target", "text")
GUARD_COLUMNS = (
    "playbook", "modes", "mode_at_end", "paused_during", "paused_at_end", "breaker_open_during",
    "breaker_open_at_end", "text",
)  # fmt: skip
JOB_COLUMNS = ("id", "playbook", "outcome", "started", "finished", "duration_seconds")
CALENDAR_COLUMNS = ("day", "kind", "subject", "attainment", "status", "seconds_over", "incidents")
DELTA_COLUMNS = ("subject", "metric", "unit", "current", "previous", "change")
MATURITY_COLUMNS = ("level", "check", "requirement", "status", "evidence")
SLO_GROUP_COLUMNS = (
    "slo", "group", "status", "events", "bad_events", "attainment", "budget_consumed",
    "budget_remaining", "hours_with_data",
)  # fmt: skip
GAMEDAY_COLUMNS = (
    "drill", "kind", "namespace", "name", "expects", "fault_at", "ended_at", "detect_seconds",
    "alertmanager_seconds", "notify_seconds", "playbook_start_seconds", "remediate_seconds",
    "rto_seconds", "rpo_seconds", "failed_requests", "worst_error_ratio", "red_lines_fired",
    "job_id", "detect_budget_seconds", "rto_budget_seconds", "rpo_budget_seconds", "aborted",
    "error", "problems", "verdict", "source",
)  # fmt: skip
SLO_HOURLY_COLUMNS = ("slo", "hour", "events", "bad_events")
SIGNAL_HOURLY_COLUMNS = (
    "kind",
    "key",
    "instance",
    "hour",
    "peak",
    "seconds_over",
    "measured_seconds",
)


def _signal_row(s: SignalReport) -> list[CellValue]:
    return [
        s.kind, s.key, s.instance, s.title, s.objective, s.threshold, s.unit, s.status,
        s.measured_seconds, s.seconds_over, s.attained, s.peak, s.peak_hour, s.p99,
        s.last_hour_peak, s.worst_hour, s.worst_hour_seconds_over, s.alert, s.incidents,
        s.previous_seconds_over, s.previous_peak,
    ]  # fmt: skip


def render_csv_tables(
    report: Report, gamedays: Sequence[GamedayRun] | None = None
) -> dict[str, str]:
    """File name -> CSV text of each table of the report (`gamedays.csv` when game days were
    given)."""
    signals = [*report.red_lines, *report.rpos, *report.drift, *report.saturation]
    tables = {
        "slos.csv": _csv(SLO_COLUMNS, _slo_rows(report)),
        "red_lines.csv": _csv(SIGNAL_COLUMNS, [_signal_row(s) for s in report.red_lines]),
        "rpos.csv": _csv(SIGNAL_COLUMNS, [_signal_row(s) for s in report.rpos]),
        "drift.csv": _csv(SIGNAL_COLUMNS, [_signal_row(s) for s in report.drift]),
        "saturation.csv": _csv(SIGNAL_COLUMNS, [_signal_row(s) for s in report.saturation]),
        "incidents.csv": _csv(INCIDENT_COLUMNS, _incident_rows(report)),
        "remediation.csv": _csv(
            REMEDIATION_COLUMNS,
            [
                [r.playbook, r.outcome, r.runs, r.previous_runs, r.mean_duration_seconds]
                for r in report.remediation
            ],
        ),
        "remediation_actions.csv": _csv(ACTION_COLUMNS, _action_rows(report)),
        "remediation_guards.csv": _csv(GUARD_COLUMNS, _guard_rows(report)),
        "calendar.csv": _csv(CALENDAR_COLUMNS, _calendar_rows(report)),
        "deltas.csv": _csv(
            DELTA_COLUMNS,
            [[d.subject, d.metric, d.unit, d.current, d.previous, d.change] for d in report.deltas],
        ),
        "maturity.csv": _csv(
            MATURITY_COLUMNS,
            [[c.level, c.id, c.requirement, c.status, c.evidence] for c in report.maturity.checks],
        ),
        "slo_hourly.csv": _csv(
            SLO_HOURLY_COLUMNS,
            [[s.name, h.start, h.events, h.bad] for s in report.slos for h in s.hourly],
        ),
        "signal_hourly.csv": _csv(
            SIGNAL_HOURLY_COLUMNS,
            [
                [s.kind, s.key, s.instance, h.start, h.peak, h.seconds_over, h.measured_seconds]
                for s in signals
                for h in s.hourly
            ],
        ),
    }
    if any(s.groups for s in report.slos):
        tables["slo_groups.csv"] = _csv(
            SLO_GROUP_COLUMNS,
            [
                [
                    s.name,
                    f.group(g.labels),
                    g.status,
                    g.events,
                    g.bad_events,
                    g.attainment,
                    g.budget_consumed,
                    g.budget_remaining,
                    g.hours_with_data,
                ]  # fmt: skip
                for s in report.slos
                for g in s.groups
            ],
        )
    if report.remediation_jobs is not None:
        tables["remediation_jobs.csv"] = _csv(
            JOB_COLUMNS,
            [
                [j.id, j.playbook, j.outcome, j.started, j.finished, j.duration_seconds]
                for j in report.remediation_jobs
            ],
        )
    if gamedays is not None:
        tables["gamedays.csv"] = _csv(GAMEDAY_COLUMNS, _gameday_rows(gamedays))
    return tables


def _gameday_rows(runs: Sequence[GamedayRun]) -> list[list[CellValue]]:
    return [
        [
            g.drill,
            g.experiment.kind,
            g.experiment.namespace,
            g.experiment.name,
            g.expects,
            g.fault_at,
            g.ended_at,
            g.detect_seconds,
            g.alertmanager_seconds,
            g.notify_seconds,
            g.playbook_start_seconds,
            g.remediate_seconds,
            g.rto_seconds,
            g.rpo_seconds,
            g.failed_requests,
            g.worst_error_ratio,
            ";".join(f"{k}={_text(v)}" for k, v in g.red_lines_fired.items()),
            g.job_id,
            g.budgets.detect_seconds,
            g.budgets.rto_seconds,
            g.budgets.rpo_seconds,
            g.aborted,
            g.error,
            ";".join(g.problems),
            g.verdict,
            g.source,
        ]  # fmt: skip
        for g in runs
    ]


def _slo_rows(report: Report) -> list[list[CellValue]]:
    return [
        [
            s.name,
            s.objective,
            s.status,
            s.events,
            s.bad_events,
            s.attainment,
            s.budget_allowed_bad,
            s.budget_consumed,
            s.budget_remaining,
            s.burn_rate_peak,
            s.burn_rate_peak_at,
            s.burn_rate_current,
            s.worst_hour,
            s.worst_hour_error_ratio,
            s.hours_with_data,
            s.hours,
            s.previous_attainment,
            s.previous_budget_consumed,
        ]  # fmt: skip
        for s in report.slos
    ]


def _incident_rows(report: Report) -> list[list[CellValue]]:
    return [
        [
            i.start,
            i.end,
            i.duration_seconds,
            i.alert,
            i.severity,
            ";".join(f"{k}={v}" for k, v in i.labels.items()),
            i.ongoing,
            i.started_before_period,
        ]  # fmt: skip
        for i in report.incidents
    ]


def _action_rows(report: Report) -> list[list[CellValue]]:
    return [
        [
            a.at,
            a.playbook,
            a.outcome,
            a.kind,
            a.runs,
            a.alert,
            ";".join(f"{k}={v}" for k, v in a.target.items()),
            a.text,
        ]  # fmt: skip
        for a in report.remediation_actions
    ]


def _guard_rows(report: Report) -> list[list[CellValue]]:
    return [
        [
            g.playbook,
            ";".join(g.modes),
            g.mode_at_end,
            g.paused_during,
            g.paused_at_end,
            g.breaker_open_during,
            g.breaker_open_at_end,
            g.text,
        ]  # fmt: skip
        for g in report.remediation_guards
    ]


def _calendar_rows(report: Report) -> list[list[CellValue]]:
    rows: list[list[CellValue]] = []
    for d in report.calendar:
        for name, value in d.slo_attainment.items():
            rows.append([d.day, "slo", name, value, d.slo_status[name], None, None])
        for key, seconds in d.red_line_seconds_over.items():
            rows.append([d.day, "red_line", key, None, None, seconds, None])
        rows.append([d.day, "incidents", "", None, None, None, d.incidents])
    return rows


def render_json(report: Report, gamedays: Sequence[GamedayRun] | None = None) -> str:
    """The report as JSON (schema `redline.report/v1`; `gamedays` when game days were given)."""
    if gamedays is None:
        return report.model_dump_json(indent=2) + "\n"
    fields = {name: getattr(report, name) for name in Report.model_fields}
    with_gamedays = ReportWithGamedays(**fields, gamedays=list(gamedays))
    return with_gamedays.model_dump_json(indent=2) + "\n"


def render_schema() -> str:
    """The JSON Schema of the report (with its optional game days)."""
    schema = ReportWithGamedays.model_json_schema()
    schema["$id"] = "https://redline.dev/schemas/report/v1.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
