"""Embedding drift above the exporter's calibrated threshold: its alert, and the promtool case
that proves it."""

from __future__ import annotations

import math

from redline.rules.common import alert_rule
from redline.rules.model import RuleGroup
from redline.rules.promtool_cases import AlertIndex, Case, constant, expected, series
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec


def build_rules(spec: Spec) -> list[RuleGroup]:
    """Embedding drift above the exporter's calibrated threshold."""
    on = "on (collection, method)"
    rule = alert_rule(
        spec,
        Alert.EMBEDDING_DRIFT,
        f"max by (collection, method) ({catalog.EMBEDDING_DRIFT_SCORE})\n> {on}\n"
        f"max by (collection, method) ({catalog.EMBEDDING_DRIFT_THRESHOLD})",
        spec.drift.for_seconds,
        "warning",
        "Embeddings of {{ $labels.collection }} drifted from the reference",
        "The {{ $labels.method }} drift score is {{ $value | humanize }}, above the calibrated "
        "threshold: retrieval quality may be degrading.",
    )
    return [RuleGroup("redline-drift", spec.timing.evaluation_interval_seconds, (rule,))]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Drift over the calibrated threshold fires; under it does not."""
    drifted = {"collection": "documents", "method": spec.drift.method}
    steady = {**drifted, "collection": "faq"}
    for_minutes = math.ceil(spec.drift.for_seconds / 60) + 5
    return [
        Case(
            "embedding drift: score over the threshold fires, under it does not",
            {
                series(catalog.EMBEDDING_DRIFT_SCORE, drifted): constant(0.05, for_minutes + 5),
                series(catalog.EMBEDDING_DRIFT_THRESHOLD, drifted): constant(0.01, for_minutes + 5),
                series(catalog.EMBEDDING_DRIFT_SCORE, steady): constant(0.005, for_minutes + 5),
                series(catalog.EMBEDDING_DRIFT_THRESHOLD, steady): constant(0.01, for_minutes + 5),
            },
            for_minutes * 60,
            [(Alert.EMBEDDING_DRIFT, [expected(alerts.get(Alert.EMBEDDING_DRIFT), drifted, 0.05)])],
        )
    ]
