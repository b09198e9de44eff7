"""The two-signal semantic-rollback gate: P99 up on the version's baseline AND accuracy down,
with enough requests; its alert, and the promtool cases that prove it."""

from __future__ import annotations

import math

from redline.rules.common import alert_rule
from redline.rules.model import AlertRule, RuleGroup, number
from redline.rules.promtool_cases import (
    AlertIndex,
    Case,
    bucket_around,
    constant,
    counter,
    expected,
    histogram,
    series,
)
from redline.rules.records import rollback_records, rollback_window
from redline.slo import catalog
from redline.slo.spec import Spec

FLOAT_GUARD = 1e-9
"""Slack on the gate's comparisons: 0.9 - 0.892 is 0.008000000000000007 in binary floating point,
so without it an accuracy drop of exactly 0.8 points would fire and +15 % exactly might not."""


def rollback_gate_expr(spec: Spec) -> str:
    """The two-signal gate: P99 up on baseline AND accuracy down, with enough requests."""
    gate = spec.rollback
    records = rollback_records(spec)
    on = "on (model, model_version)"
    by = "max by (model, model_version)"
    ratio = number(1 + gate.p99_increase_ratio)
    return (
        f"(\n  {records['p99']}\n  >= {on}\n"
        f"  ({ratio} * {by} ({catalog.MODEL_BASELINE_P99_SECONDS}) - {FLOAT_GUARD})\n)\n"
        f"and {on}\n"
        f"(\n  {by} ({catalog.MODEL_BASELINE_ACCURACY_RATIO}) - {on} {records['accuracy']}\n"
        f"  > {number(gate.accuracy_drop)} + {FLOAT_GUARD}\n)\n"
        f"and {on}\n"
        f"(\n  {records['requests']} >= {gate.min_samples}\n)"
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The two-signal semantic-rollback gate."""
    gate = spec.rollback
    rule = alert_rule(
        spec,
        "SemanticRollbackTwoSignal",
        rollback_gate_expr(spec),
        gate.for_seconds,
        "critical",
        "Model {{ $labels.model }} version {{ $labels.model_version }} regressed on latency "
        "and accuracy",
        f"Over {rollback_window(spec)} with at least {gate.min_samples} requests, P99 is "
        f"{{{{ $value | humanize }}}}s, at least {number(gate.p99_increase_ratio * 100)} % over "
        f"the version's baseline, and accuracy fell more than "
        f"{number(gate.accuracy_drop * 100)} points: roll back to the last verified snapshot.",
        gate.playbook,
    )
    return [RuleGroup("redline-rollback", spec.timing.evaluation_interval_seconds, (rule,))]


def _gate_series(
    spec: Spec, p99: float, baseline_p99: float, accuracy: float, baseline_acc: float, reqs: float
) -> dict[str, str]:
    records = rollback_records(spec)
    version = {"model": "chat", "model_version": "v2"}
    return {
        series(records["p99"], version): constant(p99, 20),
        series(catalog.MODEL_BASELINE_P99_SECONDS, version): constant(baseline_p99, 20),
        series(records["accuracy"], version): constant(accuracy, 20),
        series(catalog.MODEL_BASELINE_ACCURACY_RATIO, version): constant(baseline_acc, 20),
        series(records["requests"], version): constant(reqs, 20),
    }


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """The two-signal gate: both fire; either alone, too few requests, boundaries."""
    gate = spec.rollback
    rule = alerts.get("SemanticRollbackTwoSignal")
    version = {"model": "chat", "model_version": "v2"}
    base_p99, base_acc = 0.5, 0.9
    up = base_p99 * (1 + gate.p99_increase_ratio)  # exactly +ratio: fires
    slow = up * 1.2
    not_up = up - 0.001
    down = base_acc - gate.accuracy_drop * 2
    exactly_down = round(base_acc - gate.accuracy_drop, 9)  # exactly the drop: silent
    enough, too_few = gate.min_samples * 2, gate.min_samples - 1
    name = "SemanticRollbackTwoSignal"
    cases = [
        (
            "two signals with enough requests fire",
            slow,
            down,
            enough,
            [expected(rule, version, slow)],
        ),
        ("latency up alone stays silent", slow, base_acc, enough, []),
        ("accuracy down alone stays silent", not_up, down, enough, []),
        ("both signals under min_samples stay silent", slow, down, too_few, []),
        ("exactly +p99_increase_ratio fires", up, down, enough, [expected(rule, version, up)]),
        ("accuracy down exactly accuracy_drop stays silent", slow, exactly_down, enough, []),
    ]
    out = [
        Case(
            f"rollback gate: {title}",
            _gate_series(spec, p99, base_p99, acc, base_acc, reqs),
            600,
            [(name, alerts_expected)],
        )
        for title, p99, acc, reqs, alerts_expected in cases
    ]
    out.append(_rollback_from_raw(spec, rule))
    return out


def _rollback_from_raw(spec: Spec, rule: AlertRule) -> Case:
    """The gate end to end from raw histogram, eval counters and baselines (recordings too)."""
    gate = spec.rollback
    at, above = bucket_around(spec, spec.red_lines.latency_p99.threshold_seconds)
    p99 = at + (above - at) * 0.99
    window_minutes = gate.window_seconds / 60
    per_minute = math.ceil(gate.min_samples * 2 / window_minutes)
    version = {"model": "chat", "model_version": "v2"}
    labels = {**version, "region": spec.regions[0], "served_region": spec.regions[0]}
    quiet = {**version, "model_version": "v3"}
    quiet_labels = {**labels, **quiet}
    per_minute_quiet = math.floor(gate.min_samples / 2 / window_minutes)
    inputs = {
        **histogram(spec, labels, {above: per_minute}, 30),
        **histogram(spec, quiet_labels, {above: per_minute_quiet}, 30),
    }
    for labelset in (version, quiet):
        inputs[series(catalog.MODEL_BASELINE_P99_SECONDS, labelset)] = constant(at / 2, 30)
        inputs[series(catalog.MODEL_BASELINE_ACCURACY_RATIO, labelset)] = constant(0.9, 30)
        inputs[series(catalog.LLM_EVAL_REQUESTS_TOTAL, labelset)] = counter(100, 30)
        inputs[series(catalog.LLM_EVAL_CORRECT_TOTAL, labelset)] = counter(80, 30)
    return Case(
        "rollback gate: raw series of a regressed version fire; the same regression under "
        "min_samples stays silent",
        inputs,
        1200,
        [("SemanticRollbackTwoSignal", [expected(rule, version, p99)])],
    )
