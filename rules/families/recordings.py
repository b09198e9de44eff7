"""The SLI recordings: latency quantiles the red line and the rollback gate read.

No alert of its own, hence no promtool case: the red-line and rollback families prove these
recordings through cases that start from the raw histogram and counters.
"""

from __future__ import annotations

from redline.rules.model import RecordingRule, RuleGroup, number
from redline.rules.promtool_cases import AlertIndex, Case
from redline.rules.records import p99_record, rollback_records, rollback_window
from redline.slo import catalog
from redline.slo.spec import Spec


def build_rules(spec: Spec) -> list[RuleGroup]:
    """Recording rules for the latency quantiles the red line and the rollback gate read."""
    red = spec.red_lines.latency_p99
    bucket = f"{spec.sources.resolve().required_name('request_duration')}_bucket"
    count = f"{spec.sources.resolve().required_name('request_duration')}_count"
    window = rollback_window(spec)
    records = rollback_records(spec)
    by_version = "model, model_version"
    rules = (
        RecordingRule(
            p99_record(spec),
            f"histogram_quantile({number(red.quantile)}, "
            f"sum by (le, region) (rate({bucket}[{red.window}])))",
        ),
        RecordingRule(
            records["p99"],
            f"histogram_quantile({number(red.quantile)}, "
            f"sum by (le, {by_version}) (rate({bucket}[{window}])))",
        ),
        RecordingRule(records["requests"], f"sum by ({by_version}) (increase({count}[{window}]))"),
        RecordingRule(
            records["accuracy"],
            f"sum by ({by_version}) (increase({catalog.LLM_EVAL_CORRECT_TOTAL}[{window}]))\n"
            f"/\nsum by ({by_version}) (increase({catalog.LLM_EVAL_REQUESTS_TOTAL}[{window}]))",
        ),
    )
    return [RuleGroup("redline-sli-recordings", spec.timing.evaluation_interval_seconds, rules)]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """None: recordings are proven by the cases of the alerts that read them."""
    return []
