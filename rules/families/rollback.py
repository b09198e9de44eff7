"""The two-signal semantic-rollback gate: P99 up on the version's baseline AND accuracy down,
with enough requests; its alert, and the promtool cases that prove it."""

from __future__ import annotations

import math
from statistics import NormalDist

from redline.rules.common import alert_rule
from redline.rules.model import AlertRule, RuleGroup, number
from redline.rules.promtool_cases import (
    AlertIndex,
    Case,
    active_versions,
    bucket_around,
    case_model,
    constant,
    counter,
    expected,
    histogram,
    series,
)
from redline.rules.records import rollback_records, rollback_window
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

FLOAT_GUARD = 1e-9
"""Slack on the gate's comparisons: 0.9 - 0.892 is 0.008000000000000007 in binary floating point,
so without it an accuracy drop of exactly 0.8 points would fire and +15 % exactly might not."""


def rollback_gate_expr(spec: Spec) -> str:
    """The two-signal gate: P99 up on baseline AND accuracy significantly down, with enough
    requests and enough accuracy verdicts."""
    gate = spec.rollback
    records = rollback_records(spec)
    on = "on (model, model_version)"
    by = "max by (model, model_version)"
    ratio = number(1 + gate.p99_increase_ratio)
    # Where versions are joined from the registry, an engine's cumulative counters are stamped
    # with the version active when they are read, so a rolled-back version keeps up to one
    # window of mirrored traffic: only the active version may fire.
    active_only = (
        f"\nand {on}\n{catalog.MODEL_ACTIVE_VERSION_RECORD}"
        if spec.sources.resolve().version_from_registry()
        else ""
    )
    # The accuracy leg compares the baseline with the Wilson upper bound, not the point value:
    # it fires only when even the most generous accuracy the verdicts allow is too low.
    return (
        f"(\n  {records['p99']}\n  >= {on}\n"
        f"  ({ratio} * {by} ({catalog.MODEL_BASELINE_P99_SECONDS}) - {FLOAT_GUARD})\n)\n"
        f"and {on}\n"
        f"(\n  {by} ({catalog.MODEL_BASELINE_ACCURACY_RATIO}) - {on} {records['accuracy_upper']}\n"
        f"  > {number(gate.accuracy_drop)} + {FLOAT_GUARD}\n)\n"
        f"and {on}\n"
        f"(\n  {records['requests']} >= {gate.min_samples}\n)\n"
        f"and {on}\n"
        f"(\n  {records['verdicts']} >= {gate.min_eval_samples}\n)" + active_only
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The two-signal semantic-rollback gate."""
    gate = spec.rollback
    rule = alert_rule(
        spec,
        Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL,
        rollback_gate_expr(spec),
        gate.for_seconds,
        "critical",
        "Model {{ $labels.model }} version {{ $labels.model_version }} regressed on latency "
        "and accuracy",
        f"Over {rollback_window(spec)} with at least {gate.min_samples} requests, P99 is "
        f"{{{{ $value | humanize }}}}s, at least {number(gate.p99_increase_ratio * 100)} % over "
        f"the version's baseline, and accuracy fell more than "
        f"{number(gate.accuracy_drop * 100)} points (at {number(gate.confidence * 100)} % "
        f"confidence over at least {gate.min_eval_samples} verdicts): roll back to the last "
        "verified snapshot.",
        gate.playbook,
    )
    return [RuleGroup("redline-rollback", spec.timing.evaluation_interval_seconds, (rule,))]


VERSION = {"model": "chat", "model_version": "v2"}
"""The model version the record-level cases regress."""


def wilson_upper(accuracy: float, verdicts: float, confidence: float) -> float:
    """The one-sided Wilson score upper bound the recording computes (to predict a case)."""
    z = NormalDist().inv_cdf(confidence)
    n, p = verdicts, accuracy
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (p + z * z / (2 * n) + spread) / (1 + z * z / n)


def _gate_series(
    spec: Spec,
    p99: float,
    baseline_p99: float,
    accuracy: float,
    baseline_acc: float,
    reqs: float,
    verdicts: float,
    *,
    bound: bool = True,
) -> dict[str, str]:
    """Recorded inputs of the gate; `accuracy` is the Wilson bound itself when `bound`, else the
    point value from which the recordings compute the bound."""
    records = rollback_records(spec)
    accuracy_record = records["accuracy_upper"] if bound else records["accuracy"]
    return {
        series(records["p99"], VERSION): constant(p99, 20),
        series(catalog.MODEL_BASELINE_P99_SECONDS, VERSION): constant(baseline_p99, 20),
        series(accuracy_record, VERSION): constant(accuracy, 20),
        series(catalog.MODEL_BASELINE_ACCURACY_RATIO, VERSION): constant(baseline_acc, 20),
        series(records["requests"], VERSION): constant(reqs, 20),
        series(records["verdicts"], VERSION): constant(verdicts, 20),
        # Engine profiles: the gate fires for the registry's active version only.
        **active_versions(spec, VERSION, 20),
    }


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """The two-signal gate: both fire; either alone, too few requests or verdicts, boundaries;
    the Wilson bound on one wrong answer and on a true drop; the raw series end to end."""
    gate = spec.rollback
    rule = alerts.get(Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL)
    base_p99, base_acc = 0.5, 0.9
    up = base_p99 * (1 + gate.p99_increase_ratio)  # exactly +ratio: fires
    slow = up * 1.2
    not_up = up - 0.001
    down = base_acc - gate.accuracy_drop * 2
    exactly_down = round(base_acc - gate.accuracy_drop, 9)  # exactly the drop: silent
    enough, too_few = gate.min_samples * 2, gate.min_samples - 1
    verdicts, too_few_verdicts = gate.min_eval_samples * 2, gate.min_eval_samples - 1
    name = Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL
    fires = [expected(rule, VERSION, slow)]
    cases = [
        ("two signals with enough requests fire", slow, down, enough, verdicts, fires),
        ("latency up alone stays silent", slow, base_acc, enough, verdicts, []),
        ("accuracy down alone stays silent", not_up, down, enough, verdicts, []),
        ("both signals under min_samples stay silent", slow, down, too_few, verdicts, []),
        (
            "both signals under min_eval_samples verdicts stay silent",
            slow,
            down,
            enough,
            too_few_verdicts,
            [],
        ),
        (
            "exactly +p99_increase_ratio fires",
            up,
            down,
            enough,
            verdicts,
            [expected(rule, VERSION, up)],
        ),
        (
            "accuracy down exactly accuracy_drop stays silent",
            slow,
            exactly_down,
            enough,
            verdicts,
            [],
        ),
    ]
    out = [
        Case(
            f"rollback gate: {title}",
            _gate_series(spec, p99, base_p99, acc, base_acc, reqs, n),
            600,
            [(name, alerts_expected)],
        )
        for title, p99, acc, reqs, n, alerts_expected in cases
    ]
    out.extend(_wilson_cases(spec, rule, slow, enough))
    out.extend(_rollback_from_raw(spec, rule))
    return out


def _wilson_cases(spec: Spec, rule: AlertRule, slow: float, enough: int) -> list[Case]:
    """The accuracy leg on its statistics: one wrong answer in 120 is no evidence of a drop, a
    true 2-point drop over 2000 verdicts is (whether each fires follows from the spec)."""
    gate = spec.rollback
    one_wrong = max(120, gate.min_eval_samples)
    many = max(2000, gate.min_eval_samples)
    out = []
    for title, baseline, n, accuracy in (
        (f"one wrong answer out of {one_wrong}", 1.0, one_wrong, (one_wrong - 1) / one_wrong),
        (f"a 2-point drop over {many} verdicts", 0.9, many, 0.88),
    ):
        drop = baseline - wilson_upper(accuracy, n, gate.confidence)
        fires = drop > gate.accuracy_drop + FLOAT_GUARD
        out.append(
            Case(
                f"rollback gate: {title} {'fires' if fires else 'stays silent'}",
                _gate_series(spec, slow, 0.5, accuracy, baseline, enough, n, bound=False),
                600,
                [
                    (
                        Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL,
                        [expected(rule, VERSION, slow)] if fires else [],
                    )
                ],
            )
        )
    return out


def _rollback_from_raw(spec: Spec, rule: AlertRule) -> list[Case]:
    """The gate end to end from the source's raw histogram (the engine's, for an engine profile,
    with the registry's active version), eval counters and baselines (recordings too)."""
    gate = spec.rollback
    at, above = bucket_around(spec, spec.red_lines.latency_p99.threshold_seconds)
    p99 = at + (above - at) * 0.99
    window_minutes = gate.window_seconds / 60
    version = {"model": case_model(spec), "model_version": "v2"}
    out = []
    for title, per_minute, alerts_expected in (
        (
            "raw series of a regressed version fire",
            math.ceil(gate.min_samples * 2 / window_minutes),
            [expected(rule, version, p99)],
        ),
        (
            "raw series of the same regression under min_samples stay silent",
            math.floor(gate.min_samples / 2 / window_minutes),
            [],
        ),
    ):
        labels = {**version, "region": spec.regions[0], "served_region": spec.regions[0]}
        inputs = histogram(spec, labels, {above: per_minute}, 30)
        inputs[series(catalog.MODEL_BASELINE_P99_SECONDS, version)] = constant(at / 2, 30)
        inputs[series(catalog.MODEL_BASELINE_ACCURACY_RATIO, version)] = constant(0.9, 30)
        inputs[series(catalog.LLM_EVAL_REQUESTS_TOTAL, version)] = counter(100, 30)
        inputs[series(catalog.LLM_EVAL_CORRECT_TOTAL, version)] = counter(80, 30)
        out.append(
            Case(
                f"rollback gate: {title}",
                inputs,
                1200,
                [(Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL, alerts_expected)],
            )
        )
    return out
