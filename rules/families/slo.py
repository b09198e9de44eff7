"""Error-budget SLOs: error ratios over every burn window, budget bookkeeping and the
multiwindow burn-rate alerts (page and ticket), and the promtool cases that prove them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from redline.rules.common import alert_rule
from redline.rules.model import (
    AlertRule,
    RecordingRule,
    RuleGroup,
    format_duration,
    le_matcher,
    number,
    selector,
)
from redline.rules.promtool_cases import (
    AlertIndex,
    Case,
    bucket_around,
    case_eval_step,
    expected,
    histogram,
    in_phases,
    request_counters,
)
from redline.rules.records import slow_bound
from redline.rules.signals import aggregate, indent
from redline.slo import catalog
from redline.slo.spec import Slo, Spec, parse_duration


@dataclass(frozen=True)
class BurnWindow:
    """One multiwindow burn-rate condition: both windows must burn faster than `factor`."""

    long_seconds: int
    short_seconds: int
    budget_fraction: float  # share of the period's budget this burn consumes in `long`
    severity: str


BURN_WINDOWS = (
    BurnWindow(3600, 300, 0.02, "page"),  # 14.4x over 30d
    BurnWindow(6 * 3600, 1800, 0.05, "page"),  # 6x
    BurnWindow(86400, 7200, 0.10, "ticket"),  # 3x
    BurnWindow(3 * 86400, 6 * 3600, 0.10, "ticket"),  # 1x
)


def burn_factor(window: BurnWindow, period_seconds: float) -> float:
    """How many times faster than sustainable the budget burns in this condition."""
    return window.budget_fraction * period_seconds / window.long_seconds


def burn_rate_windows() -> list[int]:
    """Every rate window (seconds) the burn-rate alerts read, shortest first."""
    seconds = {w.long_seconds for w in BURN_WINDOWS} | {w.short_seconds for w in BURN_WINDOWS}
    return sorted(seconds)


def slo_error_ratio_expr(spec: Spec, slo: Slo, window: str) -> str:
    """PromQL for an SLO's share of bad events over `window`."""
    sel = slo.sli.selector
    match slo.sli.kind:
        case "slow_requests":
            bound = slow_bound(spec, slo.sli.threshold_seconds)
            good = aggregate(
                spec, "request_duration", window, suffix="_bucket", selector=sel,
                matchers=[le_matcher(bound)],
            )  # fmt: skip
            total = aggregate(spec, "request_duration", window, suffix="_count", selector=sel)
            return f"1 - (\n{indent(good)}\n  /\n{indent(total)}\n)"
        case "errors":
            errors = aggregate(spec, "errors", window, selector=sel)
            requests = aggregate(spec, "requests", window, selector=sel)
            # Engines create an error series at their first error (vLLM's status="5xx"): until
            # then no errors means a ratio of 0, not no ratio at all.
            return f"(\n{indent(errors)}\n  or\n  vector(0)\n)\n/\n{requests}"


def slo_events_expr(spec: Spec, slo: Slo, window: str) -> str:
    """PromQL for an SLO's events over `window` (the burn-rate alerts' traffic guard)."""
    sel = slo.sli.selector
    match slo.sli.kind:
        case "slow_requests":
            return aggregate(
                spec, "request_duration", window, suffix="_count", fn="increase", selector=sel
            )
        case "errors":
            return aggregate(spec, "requests", window, fn="increase", selector=sel)


def build_slo_group(spec: Spec, slo: Slo) -> RuleGroup:
    """Error ratios over every burn window, budget bookkeeping and the burn-rate alerts."""
    period = parse_duration(slo.period)
    budget = 1 - slo.objective
    labels = {"slo": slo.name}
    rules: list[RecordingRule | AlertRule] = []
    for seconds in [*burn_rate_windows(), int(period)]:
        window = format_duration(seconds)
        expr = slo_error_ratio_expr(spec, slo, window)
        rules.append(RecordingRule(catalog.slo_errors_record(window), expr, labels))
    sel = selector(labels)
    if slo.min_events:
        for seconds in sorted({w.long_seconds for w in BURN_WINDOWS}):
            window = format_duration(seconds)
            rules.append(
                RecordingRule(
                    catalog.slo_events_record(window), slo_events_expr(spec, slo, window), labels
                )
            )
    rules.append(
        RecordingRule(catalog.SLO_OBJECTIVE_RECORD, f"vector({number(slo.objective)})", labels)
    )
    rules.append(
        RecordingRule(
            catalog.SLO_ERROR_BUDGET_REMAINING_RECORD,
            f"1 - ({catalog.slo_errors_record(format_duration(period))}{sel} / {number(budget)})",
            labels,
        )
    )
    for severity in ("page", "ticket"):
        windows = [w for w in BURN_WINDOWS if w.severity == severity]
        conditions = []
        for w in windows:
            threshold = number(burn_factor(w, period) * budget)
            long_w, short_w = format_duration(w.long_seconds), format_duration(w.short_seconds)
            # Too few events in the long window say nothing about the budget: no page.
            guard = (
                f"\n  and\n  {catalog.slo_events_record(long_w)}{sel} >= {slo.min_events}"
                if slo.min_events
                else ""
            )
            conditions.append(
                f"(\n  {catalog.slo_errors_record(long_w)}{sel} > {threshold}\n"
                f"  and\n  {catalog.slo_errors_record(short_w)}{sel} > {threshold}{guard}\n)"
            )
        pairs = ", ".join(
            f"{number(burn_factor(w, period))}x over "
            f"{format_duration(w.long_seconds)}/{format_duration(w.short_seconds)}"
            for w in windows
        )
        rules.append(
            alert_rule(
                spec,
                slo.burn_alert_name,
                "\nor\n".join(conditions),
                # No `for`: the short window already resets the alert once the burn stops, so
                # it fires at the first evaluation where the workbook's two windows hold.
                0,
                severity,
                f"{slo.name} SLO is burning its {slo.period} error budget ({severity})",
                f"The {slo.name} SLO (objective {number(slo.objective * 100)} %) has "
                f"{{{{ $value | humanizePercentage }}}} bad events, burning its error budget "
                f"faster than {pairs}.",
                slo.playbook if severity == "page" else None,
                slo=slo.name,
            )
        )
    return RuleGroup(
        f"redline-slo-{slo.name}", spec.timing.evaluation_interval_seconds, tuple(rules)
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """One group per SLO, in the spec's order."""
    return [build_slo_group(spec, slo) for slo in spec.slos]


def build_slo_cases(spec: Spec, alerts: AlertIndex, slo: Slo) -> list[Case]:
    """Burn-rate alerts: all-bad traffic pages and tickets; traffic within budget is silent;
    all-bad traffic under `min_events` in the long windows is silent."""
    budget = 1 - slo.objective
    labels = {"region": spec.regions[0], "model": "chat", "model_version": "v1", "status": "200"}
    labels.update(slo.sli.selector)
    # 30 minutes of traffic at the case's evaluation: the long windows hold 30 minutes of events.
    minutes = 30
    busy = max(100, math.ceil(slo.min_events / minutes) * 2)
    quiet = slo.min_events / (2 * minutes)  # half of min_events by the evaluation

    def all_bad(per_minute: float) -> dict[str, str]:
        match slo.sli.kind:
            case "slow_requests":
                _, above = bucket_around(spec, slo.sli.threshold_seconds)
                return histogram(spec, labels, {above: per_minute}, 60)
            case "errors":
                return request_counters(spec, labels, per_minute, per_minute, 60)

    match slo.sli.kind:
        case "slow_requests":
            at, above = bucket_around(spec, slo.sli.threshold_seconds)
            # Half the budget: 1000 requests a minute, budget/2 of them slow.
            bad_per_min = 1000 * budget / 2
            good = histogram(
                spec, labels, {at: int(1000 - bad_per_min), above: int(bad_per_min)}, 60
            )
        case "errors":
            good = request_counters(spec, labels, 10000, 10000 * budget / 2, 60)
    name = slo.burn_alert_name
    page, ticket = alerts.get(name, severity="page"), alerts.get(name, severity="ticket")
    period = parse_duration(slo.period)
    fastest = max(burn_factor(w, period) for w in BURN_WINDOWS) * budget
    assert fastest < 1, "an all-bad SLI must burn faster than the fastest alert"
    cases = [
        Case(
            f"{slo.name} SLO: every request bad pages and tickets",
            all_bad(busy),
            minutes * 60,
            [
                (
                    name,
                    [
                        expected(page, {"slo": slo.name}, 1.0),
                        expected(ticket, {"slo": slo.name}, 1.0),
                    ],
                ),
            ],
        ),
        Case(
            f"{slo.name} SLO: half the budget's error rate is silent",
            good,
            minutes * 60,
            [(name, [])],
        ),
    ]
    cases.append(_onset_case(spec, slo, name, page, ticket, labels, busy))
    if slo.min_events:
        cases.append(
            Case(
                f"{slo.name} SLO: every request bad but fewer than min_events "
                f"({slo.min_events}) is silent",
                all_bad(quiet),
                minutes * 60,
                [(name, [])],
            )
        )
    return cases


MAX_GOOD_MINUTES = 30
"""At most this much good traffic before the outage of the onset case."""


def _onset_case(
    spec: Spec,
    slo: Slo,
    name: str,
    page: AlertRule,
    ticket: AlertRule,
    labels: dict[str, str],
    busy: int,
) -> Case:
    """Detection at workbook speed: good traffic, then every request bad from one sample on.
    The short windows first hold a bad sample at that sample's time, and both alerts fire at
    that very evaluation; one evaluation earlier (the windows hold only good samples) neither
    does. A `for`, or a guard that lagged, would fail the first check.

    The good minutes are as many as leave the first minute of the outage over the fastest page
    threshold in the long window (14.4x the budget over 1h): 30 for a 99.9 % objective, 5 for
    99 %; the traffic is enough for `min_events` by then.
    """
    period = parse_duration(slo.period)
    budget = 1 - slo.objective
    fastest = max(burn_factor(w, period) for w in BURN_WINDOWS if w.severity == "page") * budget
    good_minutes = max(g for g in range(MAX_GOOD_MINUTES + 1) if 1 / (g + 1) > fastest)
    per_minute = max(busy, math.ceil(slo.min_events / (good_minutes + 1)))
    match slo.sli.kind:
        case "slow_requests":
            at, above = bucket_around(spec, slo.sli.threshold_seconds)
            good = histogram(spec, labels, {at: per_minute}, good_minutes)
            bad = histogram(spec, labels, {above: per_minute}, MAX_GOOD_MINUTES)
        case "errors":
            good = request_counters(spec, labels, per_minute, 0, good_minutes)
            bad = request_counters(spec, labels, per_minute, per_minute, MAX_GOOD_MINUTES)
    first_bad = (good_minutes + 1) * 60
    before = first_bad - int(case_eval_step(spec))
    # Both counters start at 0 on the same samples, so rate() neither extrapolates them nor
    # differs between them: the long windows hold exactly one bad minute in good_minutes + 1.
    share = 1 / (good_minutes + 1)
    firing = [
        expected(page, {"slo": slo.name}, share),
        expected(ticket, {"slo": slo.name}, share),
    ]
    return Case(
        f"{slo.name} SLO: an outage pages and tickets at the first evaluation holding a bad "
        f"sample ({format_duration(first_bad)}), not one before ({format_duration(before)})",
        in_phases((good, good_minutes), (bad, MAX_GOOD_MINUTES)),
        first_bad,
        [(name, firing)],
        earlier=[(before, name, [])],
    )


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """The burn-rate cases of every SLO, in the spec's order."""
    return [case for slo in spec.slos for case in build_slo_cases(spec, alerts, slo)]
