"""The SLI recordings: latency quantiles the red line and the rollback gate read, the accuracy
verdicts and their Wilson bound, and tokens/s and time-to-first-token for the dashboards.

No alert of its own, hence no promtool case: the red-line and rollback families prove these
recordings through cases that start from the raw histogram and counters.
"""

from __future__ import annotations

from statistics import NormalDist

from redline.rules.model import RecordingRule, RuleGroup, le_matcher, number
from redline.rules.promtool_cases import AlertIndex, Case
from redline.rules.records import (
    p99_record,
    request_duration,
    rollback_records,
    rollback_window,
    slow_bound,
    source_name,
    tokens_rate_records,
    ttft_p99_record,
    window_requests_record,
    window_slow_requests_record,
)
from redline.slo import catalog
from redline.slo.spec import Spec

BY_VERSION = f"{catalog.LABEL_MODEL}, {catalog.LABEL_MODEL_VERSION}"


def wilson_upper_expr(accuracy: str, verdicts: str, confidence: float) -> str:
    """The one-sided Wilson score upper bound of the accuracy `p` over `n` verdicts at
    `confidence`: (p + z²/2n + z·sqrt(p(1−p)/n + z²/4n²)) / (1 + z²/n).

    Unlike the normal approximation it stays inside [0, 1] and is honest at p = 1 (one wrong
    answer in 120 is no evidence of a drop), which is why the gate compares the baseline with it.
    """
    z = NormalDist().inv_cdf(confidence)
    p, n = accuracy, verdicts
    return (
        f"(\n  {p}\n  + {number(z * z / 2)} / {n}\n"
        f"  + {number(z)} * sqrt({p} * (1 - {p}) / {n} + {number(z * z / 4)} / {n} ^ 2)\n)\n"
        f"/\n(1 + {number(z * z)} / {n})"
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """Recording rules for the latency quantiles, accuracy, verdicts, tokens/s and TTFT."""
    red = spec.red_lines.latency_p99
    base = request_duration(spec)
    bucket, count = f"{base}_bucket", f"{base}_count"
    window = rollback_window(spec)
    records = rollback_records(spec)
    slow = slow_bound(spec, red.threshold_seconds)
    rules = [
        RecordingRule(
            p99_record(spec),
            f"histogram_quantile({number(red.quantile)}, "
            f"sum by (le, region) (rate({bucket}[{red.window}])))",
        ),
        RecordingRule(
            window_requests_record(spec),
            f"sum by (region) (increase({count}[{red.window}]))",
        ),
        RecordingRule(
            window_slow_requests_record(spec),
            f"sum by (region) (increase({count}[{red.window}]))\n-\n"
            f"sum by (region) (increase({bucket}{{{le_matcher(slow)}}}[{red.window}]))",
        ),
        RecordingRule(
            records["p99"],
            f"histogram_quantile({number(red.quantile)}, "
            f"sum by (le, {BY_VERSION}) (rate({bucket}[{window}])))",
        ),
        RecordingRule(records["requests"], f"sum by ({BY_VERSION}) (increase({count}[{window}]))"),
        RecordingRule(
            records["accuracy"],
            f"sum by ({BY_VERSION}) (increase({catalog.LLM_EVAL_CORRECT_TOTAL}[{window}]))\n"
            f"/\nsum by ({BY_VERSION}) (increase({catalog.LLM_EVAL_REQUESTS_TOTAL}[{window}]))",
        ),
        RecordingRule(
            records["verdicts"],
            f"sum by ({BY_VERSION}) (increase({catalog.LLM_EVAL_REQUESTS_TOTAL}[{window}]))",
        ),
        # After the two it reads: rules of a group run in order, so it sees this evaluation's.
        RecordingRule(
            records["accuracy_upper"],
            wilson_upper_expr(records["accuracy"], records["verdicts"], spec.rollback.confidence),
        ),
    ]
    tokens_by = f"{catalog.LABEL_SERVED_REGION}, {BY_VERSION}"
    for kind, record in tokens_rate_records(spec).items():
        counter = source_name(spec, f"{kind}_tokens")
        rules.append(RecordingRule(record, f"sum by ({tokens_by}) (rate({counter}[{red.window}]))"))
    ttft = ttft_p99_record(spec)
    if ttft is not None:
        ttft_base = source_name(spec, "time_to_first_token")
        by = f"le, {catalog.LABEL_SERVED_REGION}, {catalog.LABEL_MODEL}"
        rules.append(
            RecordingRule(
                ttft,
                f"histogram_quantile(0.99, sum by ({by}) (rate({ttft_base}_bucket[{red.window}])))",
            )
        )
    return [
        RuleGroup("redline-sli-recordings", spec.timing.evaluation_interval_seconds, tuple(rules))
    ]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """None: recordings are proven by the cases of the alerts that read them."""
    return []
