"""PromQL of each report series (pure): hourly SLO events and bad shares, the steps a signal
spends past its line, P99s, remediation runs, events and guard states, and the live signals.

Every number is computed by Prometheus at a coarse step (hourly sums of counters, subqueries
counting evaluation steps past a line), so a 30-day report moves a few thousand points, not
every raw sample. Recording rules are read where they exist (`max(recorded) or raw`, point by
point), the raw expression where they do not (e.g. data backfilled without its rules).
"""

from __future__ import annotations

from dataclasses import dataclass

from redline.rules.build import (
    error_ratio_record,
    p99_record,
    slo_error_ratio_expr,
)
from redline.rules.families.slo import slo_events_expr
from redline.rules.model import format_duration, number
from redline.rules.signals import aggregate
from redline.slo import catalog
from redline.slo.maths import HOUR
from redline.slo.report import SignalDef
from redline.slo.spec import Slo, Spec


def _stat(expr: str, name: str) -> str:
    return f'label_replace({expr}, "stat", "{name}", "__name__", ".*")'


def dur(seconds: float) -> str:
    """A duration in whole seconds as PromQL writes it in a range or subquery (`3599s`)."""
    return f"{int(seconds)}s"


def check_step(step: int) -> None:
    """Steps must divide an hour so that hourly subqueries tile the period exactly."""
    if step < 1 or HOUR % step:
        raise ValueError(f"step {step} s must be a whole number of seconds that divides 3600")


def slo_total_expr(spec: Spec, slo: Slo, window: str) -> str:
    """PromQL of an SLO's events over `window` (summed counter increase)."""
    return slo_events_expr(spec, slo, window)


def fleet_slo(slo: Slo) -> Slo:
    """`slo` over the whole fleet: a grouped SLO's groups summed."""
    return slo.model_copy(update={"group_by": ()})


def slo_ratio_expr(spec: Spec, slo: Slo, window: str, recorded: bool = True) -> str:
    """The recorded bad share where it exists, the raw expression where not (per group when
    `slo` is grouped). `recorded=False` reads the raw series only: a grouped SLO's recordings
    hold its groups, never the fleet."""
    raw = slo_error_ratio_expr(spec, slo, window)
    if not recorded:
        return raw
    by = f" by ({', '.join(slo.group_by)}) " if slo.group_by else ""
    return f'max{by}({error_ratio_record(window)}{{slo="{slo.name}"}}) or ({raw})'


def slo_hourly_query(spec: Spec, slo: Slo, recorded: bool = True) -> str:
    """Events and bad share of each hour (points at each hour's end), per group when grouped."""
    return (
        _stat(slo_total_expr(spec, slo, "1h"), "total")
        + "\nor "
        + _stat(f"({slo_ratio_expr(spec, slo, '1h', recorded)})", "ratio")
    )


ENCODE = 1_000_000
"""Steps past the line are counted as millions and measured steps as units in one sum, so one
subquery yields both (exact: an hour has far fewer steps than a million)."""


@dataclass(frozen=True)
class SignalExprs:
    """PromQL of a signal.

    `flag` is 1 past the line and 0 within it, and exists exactly when the signal is measured;
    `peak` is the hour's worst value evaluated at the hour's last second (a raw range function
    where the signal is a stored series, a subquery where it is computed); `value` is the
    signal itself (for its P99); `by` names the labels that tell instances apart.
    """

    flag: str
    peak: str
    value: str
    threshold: str | None = None
    by: tuple[str, ...] = ()
    peak_costly: bool = False  # a subquery, read for the current period only when possible


def latency_exprs(spec: Spec, step: int, recorded: bool) -> SignalExprs:
    """The P99 red line from its recording rule, or from the raw histogram.

    From the histogram, "P99 above the threshold" is evaluated as "under 99 % of requests at or
    below the threshold bucket", which is the same condition (histogram_quantile interpolates
    inside the bucket past the threshold) and far cheaper than the quantile itself.
    """
    red = spec.red_lines.latency_p99
    thr = number(red.threshold_seconds)
    sub = f"[{dur(HOUR - 1)}:{dur(step)}]"
    if recorded:
        value = f"max({p99_record(spec)})"
        return SignalExprs(
            f"{value} > bool {thr}", f"max_over_time({value}{sub})", value, peak_costly=True
        )
    buckets = aggregate(spec, "request_duration", red.window, ("le", "region"), suffix="_bucket")
    value = f"max(histogram_quantile({number(red.quantile)}, {buckets}))"
    flag = f"{value} > bool {thr}"
    if red.threshold_seconds in spec.sources.buckets:
        fast = aggregate(
            spec, "request_duration", red.window, ("region",), suffix="_bucket",
            matchers=[f'le="{thr}"'],
        )  # fmt: skip
        count = aggregate(spec, "request_duration", red.window, ("region",), suffix="_count")
        good = f"{fast}\n  / {count}"
        flag = f"min({good}) < bool {number(red.quantile)}"
    return SignalExprs(flag, f"max_over_time({value}{sub})", value, peak_costly=True)


def signal_exprs(spec: Spec, defn: SignalDef, step: int, recorded: bool = False) -> SignalExprs:
    """PromQL of one report signal (the keep-alive line's condition is its alert's)."""
    thr = number(defn.threshold)
    sub = f"[{dur(HOUR - 1)}:{dur(step)}]"
    hour = f"[{dur(HOUR - 1)}]"

    def gauge(series: str, worst: str = "max") -> SignalExprs:
        value = f"{worst}({series})"
        op = ">" if worst == "max" else "<"
        return SignalExprs(
            f"{value} {op} bool {thr}", f"{worst}({worst}_over_time({series}{hour}))", value
        )

    match defn.key:
        case "latency_p99":
            return latency_exprs(spec, step, recorded)
        case "context_keepalive":
            keep = spec.red_lines.context_keepalive
            # The same short window the keep-alive alert counts evictions over.
            window = format_duration(max(60.0, 4 * spec.timing.scrape_interval_seconds))
            # Measured while the keep-alive probe exports all three of its series.
            ttl = catalog.SESSION_CONTEXT_TTL_SECONDS
            flag = (
                f"((min({catalog.SESSION_KEEPALIVE_PROBE_SUCCESS}) == bool 0)\n"
                f"  + (min({ttl}) < bool {number(keep.min_seconds)})\n"
                f"  + (sum(increase({catalog.SESSION_CONTEXT_EVICTED_TOTAL}[{window}])) > bool 0))"
                " > bool 0"
            )
            return SignalExprs(flag, f"min(min_over_time({ttl}{hour}))", f"min({ttl})")
        case "index_consistency":
            return gauge(catalog.VECTORDB_INDEX_STALENESS_SECONDS.name)
        case "rpo_lora_adapter":
            value = f"(time() - min({catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS}))"
            return SignalExprs(
                f"{value} > bool {thr}", f"max_over_time({value}{sub})", value, peak_costly=True
            )
        case "rpo_session_state":
            return gauge(catalog.SESSION_CDC_RPO_SECONDS.name)
        case "rpo_embedding_index":
            return gauge(catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.name)
        case "engine_queue_time" | "engine_kv_cache":
            return gauge(defn.series)
        case "drift":
            by = "max by (collection, method)"
            score, limit = catalog.EMBEDDING_DRIFT_SCORE, catalog.EMBEDDING_DRIFT_THRESHOLD
            value = f"{by} ({score})"
            threshold = f"{by} ({limit})"
            return SignalExprs(
                f"{value} > bool on (collection, method) {threshold}",
                f"{by} (max_over_time({score}{hour}))",
                value,
                f"{by} (max_over_time({limit}{hour}))",
                ("collection", "method"),
            )
        case _:
            raise KeyError(defn.key)


def signal_steps_query(exprs: SignalExprs, step: int) -> str:
    """Per hour: steps past the line x ENCODE + measured steps (one subquery)."""
    return f"sum_over_time((({exprs.flag}) * {ENCODE} + 1)[{dur(HOUR - 1)}:{dur(step)}])"


def signal_p99_query(exprs: SignalExprs, period: int, step: int) -> str:
    """P99 of a signal over the `period` seconds up to each evaluation."""
    return f"quantile_over_time(0.99, ({exprs.value})[{dur(period - 1)}:{dur(step)}])"


def remediation_query(period: int) -> str:
    """Runs by playbook and outcome and run-duration sums/counts over `period` seconds.

    Every receiver replica exports the cluster-wide totals, so replicas are combined with max.
    """
    w = dur(period)
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    duration = catalog.REDLINE_REMEDIATION_DURATION_SECONDS
    return "\nor ".join(
        [
            _stat(f"max by (playbook, outcome) (increase({runs}[{w}]))", "runs"),
            _stat(f"max by (playbook) (increase({duration.sum}[{w}]))", "sum"),
            _stat(f"max by (playbook) (increase({duration.count}[{w}]))", "count"),
        ]
    )


MODE_LABEL = catalog.REDLINE_REMEDIATION_MODE.labels[1]
"""The mode gauge's `mode` label (act, shadow, off)."""

EVENT_STEP = 60
"""Shortest step at which runs are placed in time (a minute: "at 10:02")."""


def remediation_events_query(step: int) -> str:
    """Runs by playbook and outcome that ended in the `step` seconds before each evaluation.

    The difference of the counter and its value one step earlier, so consecutive steps tile the
    period without counting a run twice (an `increase` over a longer range would, and over one
    step it sees too few samples); only steps with runs come back. A counter reset (Redis lost
    the run metrics) reads as no runs for that step. Replicas expose the same totals: max.
    """
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    by = f"max by ({catalog.LABEL_PLAYBOOK}, {catalog.LABEL_OUTCOME})"
    return f"({by} ({runs}) - {by} ({runs} offset {dur(step)})) > 0"


def remediation_guards_query(period: int) -> str:
    """Per playbook: the modes seen in the period and at its end, and whether it was paused or
    its breaker open during the period and at its end (instant, at the period's end)."""
    w = dur(period)
    playbook, modes = catalog.LABEL_PLAYBOOK, catalog.REDLINE_REMEDIATION_MODE
    paused, breaker = catalog.REDLINE_REMEDIATION_PAUSED, catalog.REDLINE_REMEDIATION_BREAKER_OPEN
    by_mode = f"max by ({playbook}, {MODE_LABEL})"
    return "\nor ".join(
        [
            _stat(f"{by_mode} (max_over_time({modes}[{w}])) == 1", "mode_seen"),
            _stat(f"{by_mode} (last_over_time({modes}[1h])) == 1", "mode_end"),
            _stat(f"max by ({playbook}) (max_over_time({paused}[{w}]))", "paused_seen"),
            _stat(f"max by ({playbook}) (last_over_time({paused}[1h]))", "paused_end"),
            _stat(f"max by ({playbook}) (max_over_time({breaker}[{w}]))", "breaker_seen"),
            _stat(f"max by ({playbook}) (last_over_time({breaker}[1h]))", "breaker_end"),
        ]
    )


def live_query(period: int) -> str:
    """Probe coverage, probes' last state, golden-set evaluations, unrecoverable spot
    interruptions, cross-region similarity and output agreement per model and backup region
    (instant)."""
    w = dur(period)
    probe, interrupted = catalog.LLM_PROBE_SUCCESS, catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL
    similarity = catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY
    lowest = catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN
    agreement = catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO
    # Replicas of the exporter measure the same pairs: averaged, the lowest reading kept.
    pair = f"{catalog.LABEL_MODEL}, {catalog.LABEL_REGION}"
    return "\nor ".join(
        [
            _stat(f"count by (region, probe) (count_over_time({probe}[{w}]))", "seen"),
            _stat(f"min by (region, probe) (last_over_time({probe}[1h]))", "last"),
            _stat(f"sum(increase({catalog.LLM_EVAL_REQUESTS_TOTAL}[{w}]))", "evals"),
            _stat(f'sum(increase({interrupted}{{recoverable="false"}}[{w}]))', "spot"),
            _stat(f"avg by ({pair}) (avg_over_time({similarity}[{w}]))", "similarity"),
            _stat(f"min by ({pair}) (min_over_time({lowest}[{w}]))", "similarity_min"),
            _stat(f"avg by ({pair}) (avg_over_time({agreement}[{w}]))", "agreement"),
        ]
    )
