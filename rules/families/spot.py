"""Spot preemption: an unhandled notice (runs spot_drain), notice -> DRAINING p95 over its
target, and a replacement still not ready after a whole notice window; and the promtool cases
that prove them."""

from __future__ import annotations

import math

from redline.rules.common import alert_rule
from redline.rules.model import RecordingRule, RuleGroup, number
from redline.rules.promtool_cases import AlertIndex, Case, constant, counter, expected, series
from redline.rules.records import spot_p95_record
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration


def build_spot_alerts(spec: Spec) -> RuleGroup:
    """Spot preemption: an unhandled notice (runs spot_drain), notice -> DRAINING p95 over its
    target, and a replacement still not ready after a whole notice window."""
    spot = spec.spot
    window = spot.alert_window
    target = number(spot.notice_to_draining_p95_seconds)
    ready_latency = catalog.LLM_SPOT_REPLACEMENT_READY_LATENCY_SECONDS
    slow_replacement = "\nor\n".join(
        f'max by (node, provider) ({ready_latency}{{provider="{p}"}}) '
        f"> {number(spot.notice_for(p))}"
        for p in ("aws", "gcp")
    )
    rules = (
        RecordingRule(
            spot_p95_record(spec),
            "histogram_quantile(0.95, sum by (le) "
            f"(rate({catalog.LLM_SPOT_NOTICE_TO_DRAINING_SECONDS.bucket}[{window}])))",
        ),
        alert_rule(
            spec,
            Alert.SPOT_PREEMPTION_NOTICE,
            f"max by (node, provider) ({catalog.LLM_SPOT_NOTICE_PENDING}) == 1",
            0,
            "warning",
            "Spot node {{ $labels.node }} got an interruption notice that no drain handled yet",
            "The {{ $labels.provider }} node {{ $labels.node }} will be reclaimed: close its "
            "admission, triage what runs on it and wait for its replacement (the spot agent does "
            "this by itself; this alert runs the same flow when it did not).",
            spot.playbook,
        ),
        alert_rule(
            spec,
            Alert.SPOT_NOTICE_TO_DRAINING_SLOW,
            f"{spot_p95_record(spec)} > {target}",
            0,
            "ticket",
            "Spot nodes take too long from notice to DRAINING",
            f"The p95 from an interruption notice to DRAINING over {window} is "
            f"{{{{ $value | humanizeDuration }}}} (target {target} s): requests run on nodes "
            "that are about to go away.",
        ),
        alert_rule(
            spec,
            Alert.SPOT_REPLACEMENT_SLOW,
            f"(\n{slow_replacement}\n)\nand on (node)\n"
            f'(max by (node) ({catalog.LLM_NODE_STATE}{{state="terminating"}}) == 1)',
            0,
            "page",
            "The replacement of spot node {{ $labels.node }} is not ready after a notice window",
            "The replacement of the {{ $labels.provider }} node {{ $labels.node }} has not passed "
            "the readiness gate (health, model loaded, dummy inference) "
            "{{ $value | humanizeDuration }} after its drain: capacity stays short for longer "
            "than the notice window.",
        ),
    )
    return RuleGroup("redline-spot", spec.timing.evaluation_interval_seconds, rules)


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The spot group (the spot drills load it on its own too)."""
    return [build_spot_alerts(spec)]


def _notice_histogram(
    labels: dict[str, str], per_bucket: dict[float, int], minutes: int
) -> dict[str, str]:
    """Bucket series of notice -> DRAINING; `per_bucket` maps an upper bound to observations a
    minute (the last bound gets +Inf too)."""
    bucket = catalog.LLM_SPOT_NOTICE_TO_DRAINING_SECONDS.bucket
    out: dict[str, str] = {}
    cumulative = 0
    for bound in sorted(per_bucket):
        cumulative += per_bucket[bound]
        out[series(bucket, {**labels, "le": number(bound)})] = counter(cumulative, minutes)
    out[series(bucket, {**labels, "le": "+Inf"})] = counter(cumulative, minutes)
    return out


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Spot: a pending notice fires (a handled one does not); notice -> DRAINING p95 over the
    target fires, under it does not; a replacement still not ready after its provider's notice
    window fires, one within the window or already recovered does not."""
    spot = spec.spot
    target = spot.notice_to_draining_p95_seconds
    window_minutes = math.ceil(parse_duration(spot.alert_window) / 60)
    minutes = window_minutes + 20
    eval_at = (window_minutes + 10) * 60
    slow_labels = {"node": "spot-a", "provider": "aws"}
    # Every notice took between target and 2 x target: p95 interpolates to 1.95 x target.
    slow = _notice_histogram(slow_labels, {target: 0, target * 2: 10}, minutes)
    fast = _notice_histogram(slow_labels, {target / 2: 10, target: 0}, minutes)
    aws, gcp = spot.notice_for("aws"), spot.notice_for("gcp")
    states: dict[str, str] = {}
    for node, state in (("a", "terminating"), ("b", "terminating"), ("c", "recovered")):
        for value in ("ready", "draining", "terminating", "recovered"):
            states[series(catalog.LLM_NODE_STATE, {"node": node, "state": value})] = constant(
                1 if value == state else 0, 20
            )
    ready_latency = catalog.LLM_SPOT_REPLACEMENT_READY_LATENCY_SECONDS
    latency = {
        series(ready_latency, {"node": "a", "provider": "aws"}): (constant(aws + 30, 20)),
        series(ready_latency, {"node": "b", "provider": "gcp"}): (constant(gcp - 1, 20)),
        series(ready_latency, {"node": "c", "provider": "gcp"}): (constant(gcp * 10, 20)),
    }
    pending = {
        series(catalog.LLM_SPOT_NOTICE_PENDING, {"node": "spot-a", "provider": "gcp"}): constant(
            1, 20
        ),
        series(catalog.LLM_SPOT_NOTICE_PENDING, {"node": "spot-b", "provider": "aws"}): constant(
            0, 20
        ),
    }
    notice_rule = alerts.get(Alert.SPOT_PREEMPTION_NOTICE)
    return [
        Case(
            "spot: a pending notice fires spot_drain, a handled one stays silent",
            pending,
            600,
            [
                (
                    Alert.SPOT_PREEMPTION_NOTICE,
                    [expected(notice_rule, {"node": "spot-a", "provider": "gcp"}, 1)],
                )
            ],
        ),
        Case(
            "spot: notice -> DRAINING p95 over its target fires",
            slow,
            eval_at,
            [
                (
                    Alert.SPOT_NOTICE_TO_DRAINING_SLOW,
                    [expected(alerts.get(Alert.SPOT_NOTICE_TO_DRAINING_SLOW), {}, target * 1.95)],
                )
            ],
        ),
        Case(
            "spot: notice -> DRAINING p95 under its target stays silent",
            fast,
            eval_at,
            [(Alert.SPOT_NOTICE_TO_DRAINING_SLOW, [])],
        ),
        Case(
            "spot: a replacement slower than the notice window fires; within it or recovered "
            "stays silent",
            {**states, **latency},
            600,
            [
                (
                    Alert.SPOT_REPLACEMENT_SLOW,
                    [
                        expected(
                            alerts.get(Alert.SPOT_REPLACEMENT_SLOW),
                            {"node": "a", "provider": "aws"},
                            aws + 30,
                        )
                    ],
                )
            ],
        ),
    ]
