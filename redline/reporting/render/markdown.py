"""The report as Markdown, for chat and tickets (deterministic)."""

from __future__ import annotations

from collections.abc import Sequence

from redline.reporting.gamedays import GamedayRun
from redline.reporting.render import format as f
from redline.slo.report import Report, SignalReport


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured pipe table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def signal_label(sig: SignalReport) -> str:
    """A signal's name with its instance."""
    return sig.title + (f" ({sig.instance})" if sig.instance else "")


def remediation_lines(report: Report) -> list[str]:
    """What ran, what shadow mode would have done and what was skipped, one line each; then
    the playbooks that were not plainly acting."""
    out: list[str] = []
    if report.remediation_actions:
        out += [f"- {action.text}" for action in report.remediation_actions]
    else:
        out += ["No playbook ran, shadowed or skipped in the period."]
    if report.remediation_guards:
        out += ["", "Guard rails:", ""] + [f"- {g.text}" for g in report.remediation_guards]
    return out


def render_markdown(report: Report, gamedays: Sequence[GamedayRun] | None = None) -> str:
    """The whole report as Markdown (a Game days section when game days were given)."""
    sections = [
        _overview(report),
        *([_notes(report)] if report.notes else []),
        _slos(report),
        *([_slo_groups(report)] if any(slo.groups for slo in report.slos) else []),
        _red_lines(report),
        _rpos(report),
        _drift(report),
        *([_saturation(report)] if report.saturation else []),
        _incidents(report),
        _remediation(report),
        *([gameday_lines(gamedays)] if gamedays is not None else []),
        _calendar(report),
        _deltas(report),
        _maturity(report),
    ]
    # Sections are separated, and the report ended, by one blank line.
    return "\n".join(line for section in sections for line in [*section, ""])


def _overview(report: Report) -> list[str]:
    s = report.summary
    return [
        f"# SLO report: {report.service}",
        "",
        f"**Period** {f.when(report.period.start)} to {f.when(report.period.end)} "
        f"({f.duration(report.period.seconds)}); previous period from "
        f"{f.when(report.previous_period.start)}.  ",
        f"Source: Prometheus {report.prometheus}, spec {report.spec_source}, "
        f"time-over resolution {report.step_seconds:g} s. Generated {f.when(report.generated_at)}.",
        "",
        f"**Overall: {f.status(s.status)}**: {s.slos_failing} SLO(s) failing, "
        f"{s.red_lines_breached} red line(s) crossed, {s.incidents} incident(s) "
        f"(previous period: {f.number(s.previous_incidents)}), "
        f"{f.number(s.remediation_runs)} remediation run(s){f.runs_detail(s)}.",
    ]


def _notes(report: Report) -> list[str]:
    return ["## Notes", ""] + [f"- {note}" for note in report.notes]


def _slos(report: Report) -> list[str]:
    return ["## SLOs", ""] + table(
        [
            "SLO",
            "objective",
            "attained",
            "status",
            "budget (bad events)",
            "consumed",
            "remaining",
            "peak burn (1 h)",
            "current burn",
            "worst hour",
        ],
        [
            [
                slo.name,
                f.pct(slo.objective),
                f.pct(slo.attainment),
                f.status(slo.status),
                f.number(slo.budget_allowed_bad),
                f.pct(slo.budget_consumed),
                f.pct(slo.budget_remaining),
                f.rate(slo.burn_rate_peak)
                + (f" at {f.when(slo.burn_rate_peak_at)}" if slo.burn_rate_peak_at else ""),
                f.rate(slo.burn_rate_current),
                f"{f.when(slo.worst_hour)} ({f.pct(slo.worst_hour_error_ratio)} bad)"
                if slo.worst_hour
                else f.NA,
            ]
            for slo in report.slos
        ],
    )


def _slo_groups(report: Report) -> list[str]:
    return ["### SLO groups", "", "Each group's own budget, the most spent first.", ""] + table(
        ["SLO", "group", "attained", "status", "events", "bad events", "consumed", "remaining"],
        [
            [
                slo.name,
                f.group(g.labels),
                f.pct(g.attainment),
                f.status(g.status),
                f.number(g.events),
                f.number(g.bad_events),
                f.pct(g.budget_consumed),
                f.pct(g.budget_remaining),
            ]
            for slo in report.slos
            for g in slo.groups
        ],
    )


def _red_lines(report: Report) -> list[str]:
    return ["## Red lines", ""] + table(
        [
            "red line",
            "objective",
            "status",
            "time over",
            "within",
            "peak",
            "worst hour",
            "incidents",
        ],
        [
            [
                signal_label(sig),
                sig.objective,
                f.status(sig.status),
                f.duration(sig.seconds_over),
                f.pct(sig.attained),
                f.measure(sig.peak, sig.unit),
                f"{f.when(sig.worst_hour)} ({f.duration(sig.worst_hour_seconds_over)} over)"
                if sig.worst_hour
                else f.NA,
                str(sig.incidents),
            ]
            for sig in report.red_lines
        ],
    )


def _rpos(report: Report) -> list[str]:
    return ["## Recovery-point objectives", ""] + table(
        ["target", "objective", "status", "max", "p99", "time over", "incidents"],
        [
            [
                signal_label(sig),
                sig.objective,
                f.status(sig.status),
                f.measure(sig.peak, sig.unit),
                f.measure(sig.p99, sig.unit),
                f.duration(sig.seconds_over),
                str(sig.incidents),
            ]
            for sig in report.rpos
        ],
    )


def _peaks(title: str, names: tuple[str, str], rows: list[tuple[str, SignalReport]]) -> list[str]:
    """A section of signals judged by their peak against a line (drift, saturation)."""
    return [f"## {title}", ""] + table(
        [*names, "status", "peak", "peak hour", "time over"],
        [
            [
                name,
                f.measure(sig.threshold, sig.unit),
                f.status(sig.status),
                f.measure(sig.peak, sig.unit),
                f.when(sig.peak_hour),
                f.duration(sig.seconds_over),
            ]
            for name, sig in rows
        ],
    )


def _saturation(report: Report) -> list[str]:
    rows = [(signal_label(sig), sig) for sig in report.saturation]
    return _peaks("Engine saturation (leading indicators)", ("signal", "warns over"), rows)


def _drift(report: Report) -> list[str]:
    rows = [(sig.instance or f.NA, sig) for sig in report.drift]
    return _peaks("Embedding drift", ("collection/method", "threshold"), rows)


def _incidents(report: Report) -> list[str]:
    if not report.incidents:
        return ["## Incidents", "", "No alert fired in the period."]
    return ["## Incidents", ""] + table(
        ["start", "end", "duration", "alert", "severity", "labels"],
        [
            [
                f.when(i.start) + (" (before period)" if i.started_before_period else ""),
                "ongoing" if i.ongoing else f.when(i.end),
                f.duration(i.duration_seconds),
                i.alert,
                i.severity,
                ", ".join(f"{k}={v}" for k, v in i.labels.items()),
            ]
            for i in report.incidents
        ],
    )


def _remediation(report: Report) -> list[str]:
    out = ["## Remediation", ""] + remediation_lines(report)
    out += ["", "Runs per playbook and outcome:", ""]
    if report.remediation:
        out += table(
            ["playbook", "outcome", "runs", "previous period", "mean duration"],
            [
                [
                    r.playbook,
                    r.outcome,
                    f.number(r.runs),
                    f.number(r.previous_runs),
                    f.duration(r.mean_duration_seconds),
                ]
                for r in report.remediation
            ],
        )
    else:
        out += ["No remediation run in the period."]
    if report.remediation_jobs:
        out += ["", "Jobs from the receiver's job store:", ""]
        out += table(
            ["started", "playbook", "outcome", "duration", "job"],
            [
                [f.when(j.started), j.playbook, j.outcome, f.duration(j.duration_seconds), j.id]
                for j in report.remediation_jobs
            ],
        )
    return out


def gameday_rows(runs: Sequence[GamedayRun]) -> list[list[str]]:
    """The §5 table's rows: fault | RTO | RPO | failed requests | verdict."""
    return [
        [
            run.fault,
            # A drill that expects no alert has no recovery to time (as `redline gameday` prints).
            f.seconds(run.rto_seconds) if run.expects else f.NA,
            f.seconds(run.rpo_seconds),
            f.number(run.failed_requests),
            run.verdict,
        ]
        for run in runs
    ]


def gameday_step_rows(runs: Sequence[GamedayRun]) -> list[list[str]]:
    """Each run's steps in seconds from the fault, with its time and budgets."""
    return [
        [
            run.fault,
            f.when(run.fault_at),
            run.expects or "no red-line alert",
            f.seconds(run.detect_seconds),
            f.seconds(run.alertmanager_seconds),
            f.seconds(run.notify_seconds),
            f.seconds(run.playbook_start_seconds),
            f.seconds(run.remediate_seconds),
            f.seconds(run.rto_seconds),
            f.budgets(run.budgets),
        ]
        for run in runs
    ]


GAMEDAY_HEADERS = ["fault", "RTO", "RPO", "failed requests", "verdict"]
GAMEDAY_STEP_HEADERS = [
    "fault",
    "fault at",
    "expects",
    "detect",
    "in Alertmanager",
    "notify",
    "playbook start",
    "remediate",
    "recover",
    "budgets",
]


def gameday_lines(runs: Sequence[GamedayRun]) -> list[str]:
    """The Game days section: the §5 table, then each run's steps."""
    out = ["## Game days", ""]
    if not runs:
        return out + ["No game day's fault fell in the period."]
    within = sum(run.outcome == "pass" for run in runs)
    out += [f"{len(runs)} game day(s) (`redline gameday run`), {within} within every budget.", ""]
    out += table(GAMEDAY_HEADERS, gameday_rows(runs))
    out += ["", "Each run's steps, in seconds from the fault:", ""]
    return out + table(GAMEDAY_STEP_HEADERS, gameday_step_rows(runs))


def _calendar(report: Report) -> list[str]:
    slo_names = [slo.name for slo in report.slos]
    line_keys = [sig.key for sig in report.red_lines]
    rows = table(
        ["day", *slo_names, "red-line time over", "incidents"],
        [
            [
                f.day(d.day),
                *[
                    f.pct(d.slo_attainment.get(n)) + (" !" if d.slo_status.get(n) == "fail" else "")
                    for n in slo_names
                ],
                f.duration(sum(d.red_line_seconds_over.get(k, 0.0) for k in line_keys)),
                str(d.incidents),
            ]
            for d in report.calendar
        ],
    )
    return [
        "## Calendar (attainment per UTC day)",
        "",
        *rows,
        "",
        "`!` marks a day below the objective.",
    ]


def _deltas(report: Report) -> list[str]:
    return ["## Against the previous period", ""] + table(
        ["subject", "metric", "this period", "previous", "change"],
        [
            [
                d.subject,
                d.metric,
                f.plain(d.current, d.unit),
                f.plain(d.previous, d.unit),
                f.signed(d.change, d.unit),
            ]
            for d in report.deltas
        ],
    )


def _maturity(report: Report) -> list[str]:
    m = report.maturity
    out = [
        "## Disaster-recovery maturity",
        "",
        f"**Level {m.level}: {m.level_name}.**"
        + (f" Missing for level {m.next_level}:" if m.next_level else " Every level holds."),
        "",
    ]
    out += [f"- {item}" for item in m.missing_for_next]
    out += [""]
    out += table(
        ["level", "requirement", "status", "evidence"],
        [[str(c.level), c.requirement, c.status.replace("_", " "), c.evidence] for c in m.checks],
    )
    return out
