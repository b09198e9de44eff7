"""Error-budget SLOs: error ratios over every burn window, budget bookkeeping and the
multiwindow burn-rate alerts (page and ticket), and the promtool cases that prove them."""

from __future__ import annotations

import math
from collections.abc import Sequence
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
    CASE_MODEL,
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
from redline.slo.alerts import Alert
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
    """PromQL for an SLO's share of bad events over `window` (one series per group)."""
    sel, by = slo.sli.selector, slo.group_by
    match slo.sli.kind:
        case "slow_requests":
            bound = slow_bound(spec, slo.sli.threshold_seconds)
            good = aggregate(
                spec, "request_duration", window, by, suffix="_bucket", selector=sel,
                matchers=[le_matcher(bound)],
            )  # fmt: skip
            total = aggregate(spec, "request_duration", window, by, suffix="_count", selector=sel)
            return f"1 - (\n{indent(good)}\n  /\n{indent(_operand(total, by))}\n)"
        case "errors":
            errors = aggregate(spec, "errors", window, by, selector=sel)
            requests = aggregate(spec, "requests", window, by, selector=sel)
            # Engines create an error series at their first error (vLLM's status="5xx"): until
            # then no errors means a ratio of 0, not no ratio at all. A group's zero must carry
            # the group's labels, which vector(0) has not: 0 x its requests has them.
            zero = f"0 * {_operand(requests, by)}" if by else "vector(0)"
            return f"(\n{indent(errors)}\n  or\n{indent(zero)}\n)\n/\n{_operand(requests, by)}"


def _operand(expr: str, by: tuple[str, ...]) -> str:
    """`expr` as the right operand of `/` or `*`: grouped by model_version on an engine, it ends
    in a `* on (model) group_left` version join, which must bind before the operator does."""
    return f"(\n{indent(expr)}\n)" if by else expr


def slo_events_expr(spec: Spec, slo: Slo, window: str) -> str:
    """PromQL for an SLO's events over `window` (the burn-rate alerts' traffic guard)."""
    sel, by = slo.sli.selector, slo.group_by
    match slo.sli.kind:
        case "slow_requests":
            return aggregate(
                spec, "request_duration", window, by, suffix="_count", fn="increase",
                selector=sel,
            )  # fmt: skip
        case "errors":
            return aggregate(spec, "requests", window, by, fn="increase", selector=sel)


GROUPS_WINDOW_SECONDS = 3600
"""A grouped SLO's groups are counted over the burn windows' shortest long window: those with
traffic in the last hour, as many as page or ticket."""


def _groups_alert(spec: Spec, slo: Slo) -> AlertRule:
    """SLOGroupsOverLimit: more groups than `max_groups` (a cardinality guard, nothing dropped)."""
    record = catalog.slo_errors_record(format_duration(GROUPS_WINDOW_SECONDS))
    labels = ", ".join(slo.group_by)
    return alert_rule(
        spec,
        Alert.SLO_GROUPS_OVER_LIMIT,
        f"count({record}{selector({'slo': slo.name})}) > {slo.max_groups}",
        0,
        Alert.SLO_GROUPS_OVER_LIMIT.severity,
        f"the {slo.name} SLO has more groups ({labels}) than its max_groups",
        f"The {slo.name} SLO is grouped by {labels} into {{{{ $value }}}} groups, over its "
        f"max_groups of {slo.max_groups}: every group is still evaluated and alerted, at a "
        "cost in series and evaluation time; coarsen group_by or raise max_groups.",
        slo=slo.name,
    )


def _group_phrase(slo: Slo) -> str:
    """`for model {{ $labels.model }}` in a grouped SLO's burn description, '' otherwise."""
    if not slo.group_by:
        return ""
    named = ", ".join(f"{label} {{{{ $labels.{label} }}}}" for label in slo.group_by)
    return f" for {named}"


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
                f"The {slo.name} SLO (objective {number(slo.objective * 100)} %)"
                f"{_group_phrase(slo)} has "
                f"{{{{ $value | humanizePercentage }}}} bad events, burning its error budget "
                f"faster than {pairs}.",
                slo.playbook if severity == "page" else None,
                slo=slo.name,
            )
        )
    if slo.group_by:
        rules.append(_groups_alert(spec, slo))
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
    if slo.group_by:
        labels = _group_labels(spec, slo, 0)
    # What the burn alerts carry besides their rule labels: the SLO and, grouped, its group.
    fired = {"slo": slo.name, **group_of(spec, slo.group_by, labels)}
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
                    [expected(page, fired, 1.0), expected(ticket, fired, 1.0)],
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
    cases.append(_onset_case(spec, slo, name, page, ticket, labels, busy, fired))
    if slo.group_by and len(_distinct_groups(spec, slo)) > 1:
        cases.append(_one_group_burning_case(spec, slo, name, page, ticket, busy))
        cases.append(_groups_over_limit_case(spec, slo, alerts))
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
    fired: dict[str, str],
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
    firing = [expected(page, fired, share), expected(ticket, fired, share)]
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


def _group_labels(spec: Spec, slo: Slo, index: int) -> dict[str, str]:
    """A request's labels in the cases' `index`th group: each group label its own value.

    Model and version change together: an engine profile's version is the snapshot registry's
    active one, one per model. `served_region` follows `region`, as a request served where it
    arrived has it."""
    region = spec.regions[index] if index < len(spec.regions) else f"region-{index}"
    labels = {
        "region": region,
        "served_region": region,
        "model": CASE_MODEL if index == 0 else f"model-{index}",
        "model_version": f"v{index + 1}",
        "status": "200",
    }
    labels.update(slo.sli.selector)
    return labels


def group_of(spec: Spec, by: Sequence[str], labels: dict[str, str]) -> dict[str, str]:
    """The labels `by` a request with `labels` is counted under (a constant model wins)."""
    model = spec.sources.resolve().profile.model
    group: dict[str, str] = {label: labels[label] for label in by}
    if model is not None and catalog.LABEL_MODEL in group:
        group[catalog.LABEL_MODEL] = model
    return group


def _distinct_groups(spec: Spec, slo: Slo) -> set[tuple[tuple[str, str], ...]]:
    """The groups the cases' first two label sets fall in: one when the source cannot tell them
    apart (a profile's constant model grouped by model alone), and there is nothing to case."""
    groups = (group_of(spec, slo.group_by, _group_labels(spec, slo, i)) for i in (0, 1))
    return {tuple(sorted(group.items())) for group in groups}


def _one_group_burning_case(
    spec: Spec, slo: Slo, name: str, page: AlertRule, ticket: AlertRule, busy: int
) -> Case:
    """The averages-hide-failures scenario: one group with 2 % of the traffic fails a fifth of
    its requests (more where the budget is wide), the other is healthy. That group pages and
    tickets under its own labels; the healthy group stays silent."""
    budget = 1 - slo.objective
    period = parse_duration(slo.period)
    fastest = max(burn_factor(w, period) for w in BURN_WINDOWS if w.severity == "page") * budget
    bad = math.ceil(busy * (0.2 if fastest < 0.2 else (1 + fastest) / 2))
    healthy, burning = _group_labels(spec, slo, 0), _group_labels(spec, slo, 1)
    minutes = 30
    match slo.sli.kind:
        case "slow_requests":
            at, above = bucket_around(spec, slo.sli.threshold_seconds)
            inputs = {
                **histogram(spec, healthy, {at: 49 * busy}, minutes),
                **histogram(spec, burning, {at: busy - bad, above: bad}, minutes),
            }
        case "errors":
            inputs = {
                **request_counters(spec, healthy, 49 * busy, 0, minutes),
                **request_counters(spec, burning, busy, bad, minutes),
            }
    group = {"slo": slo.name, **group_of(spec, slo.group_by, burning)}
    share = bad / busy
    return Case(
        f"{slo.name} SLO grouped by {', '.join(slo.group_by)}: a group with 2 % of the traffic "
        f"failing {number(share * 100)} % of it pages and tickets alone",
        inputs,
        minutes * 60,
        [(name, [expected(page, group, share), expected(ticket, group, share)])],
    )


def _groups_over_limit_case(spec: Spec, slo: Slo, alerts: AlertIndex) -> Case:
    """SLOGroupsOverLimit: max_groups groups are silent; one more group fires it. The groups
    have served without an error, so an engine has no error series for them yet."""
    limit = slo.max_groups
    rule = alerts.get(Alert.SLO_GROUPS_OVER_LIMIT, slo=slo.name)

    def traffic(index: int, minutes: int) -> dict[str, str]:
        labels = _group_labels(spec, slo, index)
        match slo.sli.kind:
            case "slow_requests":
                at, _ = bucket_around(spec, slo.sli.threshold_seconds)
                return histogram(spec, labels, {at: 10}, minutes)
            case "errors":
                # No error series: a group that never failed is a group all the same.
                return request_counters(spec, labels, 10, None, minutes)

    before, after = 10, 5
    at_limit = {k: v for i in range(limit) for k, v in traffic(i, before).items()}
    over = {**at_limit, **traffic(limit, after)}
    return Case(
        f"{slo.name} SLO: {limit} groups (max_groups) are silent, {limit + 1} fire "
        f"{Alert.SLO_GROUPS_OVER_LIMIT}",
        in_phases((at_limit, before), (over, after)),
        (before + after) * 60,
        [(Alert.SLO_GROUPS_OVER_LIMIT, [expected(rule, {}, limit + 1)])],
        earlier=[(before * 60, Alert.SLO_GROUPS_OVER_LIMIT, [])],
    )
