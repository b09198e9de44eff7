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
    red_line_by,
    rollback_records,
    rollback_window,
    slow_bound,
    tokens_rate_records,
    ttft_p99_record,
    window_requests_record,
    window_slow_requests_record,
)
from redline.rules.signals import Fn, aggregate, indent
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


def _quantile(quantile: float, buckets: str) -> str:
    """`histogram_quantile(q, buckets)`, on one line when the buckets fit on one."""
    if "\n" not in buckets:
        return f"histogram_quantile({number(quantile)}, {buckets})"
    return f"histogram_quantile(\n  {number(quantile)},\n{indent(buckets)}\n)"


def build_rules(spec: Spec) -> list[RuleGroup]:
    """Recording rules for the latency quantiles, accuracy, verdicts, tokens/s and TTFT."""
    red = spec.red_lines.latency_p99
    window = rollback_window(spec)
    records = rollback_records(spec)
    slow = slow_bound(spec, red.threshold_seconds)
    by_version = (catalog.LABEL_MODEL, catalog.LABEL_MODEL_VERSION)

    def latency(by: tuple[str, ...], over: str, suffix: str, fn: Fn = "rate", *m: str) -> str:
        return aggregate(spec, "request_duration", over, by, suffix=suffix, fn=fn, matchers=m)

    red_by = red_line_by(spec)
    count_in_window = latency(red_by, red.window, "_count", "increase")
    fast_in_window = latency(red_by, red.window, "_bucket", "increase", le_matcher(slow))
    rules = [
        RecordingRule(
            p99_record(spec),
            _quantile(red.quantile, latency(("le", *red_by), red.window, "_bucket")),
        ),
        RecordingRule(window_requests_record(spec), count_in_window),
        RecordingRule(window_slow_requests_record(spec), f"{count_in_window}\n-\n{fast_in_window}"),
        RecordingRule(
            records["p99"],
            _quantile(red.quantile, latency(("le", *by_version), window, "_bucket")),
        ),
        RecordingRule(records["requests"], latency(by_version, window, "_count", "increase")),
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
    tokens_by = (catalog.LABEL_SERVED_REGION, *by_version)
    for kind, record in tokens_rate_records(spec).items():
        expr = aggregate(spec, f"{kind}_tokens", red.window, tokens_by)
        rules.append(RecordingRule(record, expr))
    ttft = ttft_p99_record(spec)
    if ttft is not None:
        by = ("le", catalog.LABEL_SERVED_REGION, catalog.LABEL_MODEL)
        buckets = aggregate(spec, "time_to_first_token", red.window, by, suffix="_bucket")
        rules.append(RecordingRule(ttft, _quantile(0.99, buckets)))
    return [
        RuleGroup("redline-sli-recordings", spec.timing.evaluation_interval_seconds, tuple(rules))
    ]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """None: recordings are proven by the cases of the alerts that read them."""
    return []
