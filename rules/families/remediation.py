"""Escalation to humans when remediation itself goes wrong: a playbook run that failed, a job
past its playbook's deadline, a playbook its breaker disabled or its budget skipped, and a
receiver that is down; and the promtool cases that prove them.

None of these alerts carries a playbook: they are for people (routed to `escalation:`).
"""

from __future__ import annotations

import math

from redline.rules.common import alert_rule
from redline.rules.model import AlertRule, RuleGroup, format_duration
from redline.rules.promtool_cases import (
    SERIES_INTERVAL,
    AlertIndex,
    Case,
    constant,
    expected,
    satisfying,
    series,
)
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import PlaybookPolicy, Spec

FAILED = "failed"
OVER_BUDGET = "over_budget"
"""Run outcomes the receiver counts in `redline_remediation_runs_total` (remediation/metrics)."""


SUBJECT = "remediation_playbook"
"""The label naming the playbook an escalation alert is about. Never `playbook`: Alertmanager
routes an alert with a `playbook` label to that playbook (a failed reroute would reroute)."""

MIN_EVENT_WINDOW_SECONDS = 300


def event_window_seconds(spec: Spec) -> float:
    """Window of the run-outcome alerts: a failure keeps its alert firing this long.

    It must outlast evaluation + group_wait (else Alertmanager sees it resolved before it ever
    notified, and the page is lost) with room for a group_interval, and hold at least four
    scrapes; five minutes at least, whole minutes."""
    t = spec.timing
    seconds = max(
        MIN_EVENT_WINDOW_SECONDS,
        4 * t.scrape_interval_seconds,
        2 * (t.evaluation_interval_seconds + t.group_wait_seconds + t.group_interval_seconds),
    )
    return float(math.ceil(seconds / 60) * 60)


def per_playbook(inner: str) -> str:
    """`inner` per playbook, its `playbook` label moved to `remediation_playbook` (HA receivers
    expose the same shared state: `max`, not `sum`)."""
    moved = f'label_replace({inner}, "{SUBJECT}", "$1", "{catalog.LABEL_PLAYBOOK}", "(.*)")'
    return f"max by ({SUBJECT}) ({moved})"


def outcome_increase(spec: Spec, outcome: str) -> str:
    """Runs of each playbook that ended with `outcome` within the event window."""
    window = format_duration(event_window_seconds(spec))
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    increase = f'increase({runs}{{{catalog.LABEL_OUTCOME}="{outcome}"}}[{window}])'
    return f"{per_playbook(increase)} > 0"


def receiver_target_down_expr(spec: Spec) -> str:
    """A scrape target of the receiver's job that answers no scrape."""
    return f'up{{job=~"{spec.receiver.scrape_job}"}} == 0'


def receiver_unscraped_expr(spec: Spec) -> str:
    """No receiver series from the receiver's job, unless a target is down (that pages by
    itself): the job is not scraped, or `receiver.scrape_job` does not match its name."""
    job = spec.receiver.scrape_job
    return (
        f'absent({catalog.REDLINE_WEBHOOK_ALERTS_TOTAL}{{job=~"{job}"}})\n'
        f"unless on () ({receiver_target_down_expr(spec)})"
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """RemediationFailed, RemediationStuck, RemediationDisabled, RemediationOverBudget and
    ReceiverDown, all paging a human."""
    timing = spec.timing
    window = format_duration(event_window_seconds(spec))
    defaults = PlaybookPolicy()
    name = "{{ $labels.remediation_playbook }}"
    absent_for = format_duration(timing.absent_for_seconds)
    job = spec.receiver.scrape_job
    restart = "Check the receiver (/healthz, logs); until it is back, act on those alerts by hand."
    resume = "redline remediation resume {{ $labels.remediation_playbook }} --reason '...'"
    rules: list[AlertRule] = [
        alert_rule(
            spec,
            Alert.REMEDIATION_FAILED,
            outcome_increase(spec, FAILED),
            0,
            "page",
            "Playbook {{ $labels.remediation_playbook }} failed",
            f"A {name} run ended failed within the last {window}: the alert it was fixing is "
            f"still a problem. Read the job's steps (`GET /jobs?playbook={name}&status=failed` "
            "on the receiver, or the audit trail) and finish the fix by hand.",
        ),
        alert_rule(
            spec,
            Alert.REMEDIATION_STUCK,
            f"{per_playbook(str(catalog.REDLINE_REMEDIATION_JOBS_OVERDUE))} > 0",
            0,
            "page",
            "Playbook {{ $labels.remediation_playbook }} has jobs past their deadline",
            "{{ $value }} unfinished {{ $labels.remediation_playbook }} job(s) are older than the "
            f"playbook's deadline (remediation.playbooks.<name>.deadline, {defaults.deadline} "
            "by default): "
            "a step hangs or no worker takes the job. See the receiver's `/jobs` and "
            f"{catalog.REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS}; check the workers.",
        ),
        alert_rule(
            spec,
            Alert.REMEDIATION_DISABLED,
            f"{per_playbook(str(catalog.REDLINE_REMEDIATION_BREAKER_OPEN))} == 1",
            0,
            "page",
            "Playbook {{ $labels.remediation_playbook }} is disabled by its breaker",
            f"Its runs failed too many times in a row (remediation.playbooks.<name>.breaker."
            f"failures, {defaults.breaker.failures} by default) and it no longer acts: its "
            f"alerts are not remediated. A human must fix the cause, then `{resume}`.",
        ),
        alert_rule(
            spec,
            Alert.REMEDIATION_OVER_BUDGET,
            outcome_increase(spec, OVER_BUDGET),
            0,
            "page",
            "Playbook {{ $labels.remediation_playbook }} skipped a run: over budget",
            f"Within the last {window} the playbook was asked to act more often than its "
            "budget (remediation.playbooks.<name>.budget) allows and skipped: the fault keeps "
            "coming back, or the fix does not hold. Handle the alert by hand.",
        ),
        alert_rule(
            spec,
            Alert.RECEIVER_DOWN,
            receiver_target_down_expr(spec),
            timing.absent_for_seconds,
            "page",
            "The remediation receiver {{ $labels.instance }} is down",
            f"Its scrape (job {{{{ $labels.job }}}}) has failed for {absent_for}: alerts with a "
            f"playbook are not remediated. {restart}",
            cause="target_down",
        ),
        alert_rule(
            spec,
            Alert.RECEIVER_DOWN,
            receiver_unscraped_expr(spec),
            timing.absent_for_seconds,
            "page",
            "No remediation receiver is scraped",
            f"No series {catalog.REDLINE_WEBHOOK_ALERTS_TOTAL} from a job matching "
            f"`{job}` (receiver.scrape_job) for {absent_for}: the receiver is not deployed or "
            "not scraped, or scrape_job does not name its job; alerts with a playbook may not be "
            f"remediated. {restart}",
            cause="no_series",
        ),
    ]
    return [RuleGroup("redline-remediation", timing.evaluation_interval_seconds, tuple(rules))]


def _runs(playbook: str, outcome: str) -> str:
    labels = {catalog.LABEL_PLAYBOOK: playbook, catalog.LABEL_OUTCOME: outcome}
    return series(catalog.REDLINE_REMEDIATION_RUNS_TOTAL, labels)


def _outcome_cases(spec: Spec, alerts: AlertIndex, alert: str, outcome: str) -> list[Case]:
    """One playbook's count steps up once (fires), another's stays (silent); once the event
    window has passed, the stepped one is silent too."""
    window_steps = math.ceil(event_window_seconds(spec) / SERIES_INTERVAL)
    before = 10
    steps = before + 2 * window_steps + 5
    # the counter is 0 for `before` steps, then 1 (one run ended with `outcome`)
    stepped = f"0+0x{before} 1+0x{steps - before - 1}"
    inputs = {
        _runs("reroute", outcome): stepped,
        _runs("semantic_rollback", outcome): constant(0, steps),
        _runs("reroute", "succeeded"): f"0+1x{steps}",
    }
    rule = alerts.get(alert)
    return [
        Case(
            f"remediation: one {outcome} run of a playbook fires {alert}; the other is silent",
            inputs,
            (before + 2) * SERIES_INTERVAL,
            [(alert, [expected(rule, {SUBJECT: "reroute"}, 0)])],
        ),
        Case(
            f"remediation: {alert} is silent once the {outcome} run left the window",
            inputs,
            (before + window_steps + 3) * SERIES_INTERVAL,
            [(alert, [])],
        ),
    ]


def _gauge_case(name: str, alert: str, metric: catalog.Metric, bad: float, rule: AlertRule) -> Case:
    playbook = catalog.LABEL_PLAYBOOK
    # Two receivers (HA) expose the same shared state: one alert per playbook.
    inputs = {
        series(metric, {playbook: "reroute", "instance": "a"}): constant(bad, 10),
        series(metric, {playbook: "reroute", "instance": "b"}): constant(bad, 10),
        series(metric, {playbook: "semantic_rollback", "instance": "a"}): constant(0, 10),
    }
    return Case(
        name, inputs, 5 * SERIES_INTERVAL, [(alert, [expected(rule, {SUBJECT: "reroute"}, bad)])]
    )


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Each alert fires on its bad input and stays silent on the good one beside it."""
    cases = _outcome_cases(spec, alerts, Alert.REMEDIATION_FAILED, FAILED)
    cases += _outcome_cases(spec, alerts, Alert.REMEDIATION_OVER_BUDGET, OVER_BUDGET)
    cases.append(
        _gauge_case(
            f"remediation: overdue jobs of one playbook fire {Alert.REMEDIATION_STUCK}, "
            "none is silent",
            Alert.REMEDIATION_STUCK,
            catalog.REDLINE_REMEDIATION_JOBS_OVERDUE,
            2,
            alerts.get(Alert.REMEDIATION_STUCK),
        )
    )
    cases.append(
        _gauge_case(
            f"remediation: an open breaker fires {Alert.REMEDIATION_DISABLED}, a closed one "
            "is silent",
            Alert.REMEDIATION_DISABLED,
            catalog.REDLINE_REMEDIATION_BREAKER_OPEN,
            1,
            alerts.get(Alert.REMEDIATION_DISABLED),
        )
    )
    cases.extend(_receiver_cases(spec, alerts))
    return cases


def _receiver_cases(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """A down target pages with its instance (the absent rule stays quiet then); no receiver
    series from the job pages once; receivers up and answering, beside another job that is
    down and a receiver series of another job, are silent."""
    minutes = math.ceil(spec.timing.absent_for_seconds / 60) + 5
    down = alerts.get(Alert.RECEIVER_DOWN, cause="target_down")
    unscraped = alerts.get(Alert.RECEIVER_DOWN, cause="no_series")
    job = _a_job(spec.receiver.scrape_job)
    other = _other_job(spec.receiver.scrape_job)
    alerts_total = catalog.REDLINE_WEBHOOK_ALERTS_TOTAL
    first = {"job": job, "instance": "receiver-1:9095"}
    second = {**first, "instance": "receiver-2:9095"}
    present = {series(alerts_total, {**second, "status": "firing"}): constant(0, minutes)}
    elsewhere = {
        series("up", {"job": other, "instance": "x:1"}): constant(0, minutes),
        series(alerts_total, {"job": other, "status": "firing"}): constant(0, minutes),
    }
    eval_at = minutes * SERIES_INTERVAL
    return [
        Case(
            "receiver: a receiver target that answers no scrape pages, once",
            {
                series("up", first): constant(0, minutes),
                series("up", second): constant(1, minutes),
                **present,
            },
            eval_at,
            [(Alert.RECEIVER_DOWN, [expected(down, first, 0)])],
        ),
        Case(
            "receiver: no receiver series from the receiver's job pages",
            elsewhere,
            eval_at,
            [(Alert.RECEIVER_DOWN, [expected(unscraped, {}, 1)])],
        ),
        Case(
            "receiver: receivers up and answering are silent (another job down is not theirs)",
            {series("up", first): constant(1, minutes), **present, **elsewhere},
            eval_at,
            [(Alert.RECEIVER_DOWN, [])],
        ),
    ]


def _a_job(pattern: str) -> str:
    """A job name the configured `scrape_job` regex matches (itself when it is a plain name)."""
    return satisfying((f'job=~"{pattern}"',), {})["job"]


def _other_job(pattern: str) -> str:
    """A job name the configured `scrape_job` regex does not match."""
    return satisfying((f'job!~"{pattern}"',), {"job": "gateway"})["job"]
