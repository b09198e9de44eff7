"""Read the report's series from Prometheus (chunked ranges and raw reads, queries in parallel).

Every number is computed by Prometheus at a coarse step (hourly sums of counters, subqueries
counting evaluation steps past a line), so a 30-day report moves a few thousand points, not
every raw sample. Recording rules are read where they exist (`max(recorded) or raw`, point by
point), the raw expression where they do not (e.g. data backfilled without its rules). The HTTP
transport (retries, errors) is `redline.platform.prometheus`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from redline.platform.prometheus import Labels, Points, PrometheusClient
from redline.rules.build import (
    error_ratio_record,
    p99_record,
    slo_error_ratio_expr,
)
from redline.rules.model import format_duration, number, selector
from redline.rules.records import request_duration, requests_total
from redline.slo import catalog
from redline.slo.maths import HOUR
from redline.slo.report import (
    AlertSamples,
    CrossRegionFigures,
    GuardState,
    LiveSignals,
    RemediationCounts,
    ReportInput,
    RunEvent,
    SignalDef,
    SignalSeries,
    SloSeries,
    Window,
    signal_defs,
)
from redline.slo.spec import Slo, Spec

MAX_POINTS = 10_000
"""Points per range query (Prometheus refuses more than 11,000 per series)."""

RAW_CHUNK = 7 * 86400
"""Raw-sample reads (`ALERTS`) are split into chunks of this many seconds."""

BURN_STEP = 300
"""Step of the sliding 1 h burn-rate series."""


def fetch_instant(client: PrometheusClient, query: str, at: float) -> list[tuple[Labels, float]]:
    """An instant query at `at`; NaN results are dropped."""
    return [(labels, v) for labels, v in client.instant(query, at) if math.isfinite(v)]


def fetch_range(
    client: PrometheusClient, query: str, start: float, end: float, step: int
) -> list[tuple[Labels, Points]]:
    """A range query split into chunks of at most MAX_POINTS points; NaN points dropped."""
    merged: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    chunk_start = start
    while chunk_start <= end:
        chunk_end = min(end, chunk_start + (MAX_POINTS - 1) * step)
        for labels, points in client.range(query, round(chunk_start), round(chunk_end), step):
            found = merged.setdefault(tuple(sorted(labels.items())), {})
            found.update((ts, v) for ts, v in points if math.isfinite(v))
        chunk_start = chunk_end + step
    return [(dict(key), sorted(points.items())) for key, points in sorted(merged.items())]


def fetch_raw(
    client: PrometheusClient, metric: str, labels: Mapping[str, str], start: float, end: float
) -> list[tuple[Labels, list[float]]]:
    """Raw sample timestamps of `metric{labels}` in [start, end], read in RAW_CHUNK chunks."""
    matchers = ",".join(f"{name}='{value}'" for name, value in labels.items())
    series = f"{metric}{{{matchers}}}" if matchers else metric
    merged: dict[tuple[tuple[str, str], ...], set[float]] = {}
    lo, hi = round(start), round(end)
    while lo < hi:
        size = min(RAW_CHUNK, hi - lo)
        # A range-vector instant query: the raw samples of (lo, lo + size].
        data = client.instant_raw(f"{series}[{size}s]", lo + size)
        for item in data["result"]:
            key = tuple(sorted(item["metric"].items()))
            merged.setdefault(key, set()).update(float(ts) for ts, _ in item["values"])
        lo += size
    return [(dict(key), sorted(ts)) for key, ts in sorted(merged.items())]


# ---------------------------------------------------------------------------------------------
# PromQL of each report series (pure)


def _stat(expr: str, name: str) -> str:
    return f'label_replace({expr}, "stat", "{name}", "__name__", ".*")'


def _dur(seconds: float) -> str:
    return f"{int(seconds)}s"


def check_step(step: int) -> None:
    """Steps must divide an hour so that hourly subqueries tile the period exactly."""
    if step < 1 or HOUR % step:
        raise ValueError(f"step {step} s must be a whole number of seconds that divides 3600")


def slo_total_expr(spec: Spec, slo: Slo, window: str) -> str:
    """PromQL of an SLO's events over `window` (summed counter increase)."""
    match slo.sli.kind:
        case "slow_requests":
            series = f"{request_duration(spec)}_count{selector(slo.sli.selector)}"
        case "errors":
            series = f"{requests_total(spec)}{selector(slo.sli.selector)}"
    return f"sum(increase({series}[{window}]))"


def slo_ratio_expr(spec: Spec, slo: Slo, window: str) -> str:
    """The recorded bad share where it exists, the raw expression where not."""
    recorded = f'max({error_ratio_record(window)}{{slo="{slo.name}"}})'
    return f"{recorded} or ({slo_error_ratio_expr(spec, slo, window)})"


def slo_hourly_query(spec: Spec, slo: Slo) -> str:
    """Events and bad share of each hour (points at each hour's end)."""
    return (
        _stat(slo_total_expr(spec, slo, "1h"), "total")
        + "\nor "
        + _stat(f"({slo_ratio_expr(spec, slo, '1h')})", "ratio")
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
    sub = f"[{_dur(HOUR - 1)}:{_dur(step)}]"
    if recorded:
        value = f"max({p99_record(spec)})"
        return SignalExprs(
            f"{value} > bool {thr}", f"max_over_time({value}{sub})", value, peak_costly=True
        )
    base = request_duration(spec)
    value = (
        f"max(histogram_quantile({number(red.quantile)}, sum by (le, region) "
        f"(rate({base}_bucket[{red.window}]))))"
    )
    flag = f"{value} > bool {thr}"
    if red.threshold_seconds in spec.sources.buckets:
        good = (
            f'sum by (region) (rate({base}_bucket{{le="{thr}"}}[{red.window}]))\n'
            f"  / sum by (region) (rate({base}_count[{red.window}]))"
        )
        flag = f"min({good}) < bool {number(red.quantile)}"
    return SignalExprs(flag, f"max_over_time({value}{sub})", value, peak_costly=True)


def signal_exprs(spec: Spec, defn: SignalDef, step: int, recorded: bool = False) -> SignalExprs:
    """PromQL of one report signal (the keep-alive line's condition is its alert's)."""
    thr = number(defn.threshold)
    sub = f"[{_dur(HOUR - 1)}:{_dur(step)}]"
    hour = f"[{_dur(HOUR - 1)}]"

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
    return f"sum_over_time((({exprs.flag}) * {ENCODE} + 1)[{_dur(HOUR - 1)}:{_dur(step)}])"


def signal_p99_query(exprs: SignalExprs, period: int, step: int) -> str:
    """P99 of a signal over the `period` seconds up to each evaluation."""
    return f"quantile_over_time(0.99, ({exprs.value})[{_dur(period - 1)}:{_dur(step)}])"


def remediation_query(period: int) -> str:
    """Runs by playbook and outcome and run-duration sums/counts over `period` seconds.

    Every receiver replica exports the cluster-wide totals, so replicas are combined with max.
    """
    w = _dur(period)
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
    return f"({by} ({runs}) - {by} ({runs} offset {_dur(step)})) > 0"


def remediation_guards_query(period: int) -> str:
    """Per playbook: the modes seen in the period and at its end, and whether it was paused or
    its breaker open during the period and at its end (instant, at the period's end)."""
    w = _dur(period)
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
    w = _dur(period)
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


# ---------------------------------------------------------------------------------------------
# Fetching

HourlySeries = dict[str, dict[float, float]]


def _hourly(
    client: PrometheusClient,
    query: str,
    window: Window,
    by: Sequence[str] = (),
    previous: bool = True,
) -> dict[str, dict[float, float]]:
    """An hour-scoped query evaluated at each hour's last second over both periods.

    Keys are instances; timestamps are moved to the hour's end, so an hour holds the steps of
    [start, end) and the sample at a period's first second belongs to that period.
    """
    first = window.previous.start if previous else window.start
    result = fetch_range(client, query, first + HOUR - 1, window.end - 1, HOUR)
    out: dict[str, dict[float, float]] = {}
    for labels, points in result:
        instance = "/".join(labels.get(name, "") for name in by)
        out.setdefault(instance, {}).update({ts + 1: v for ts, v in points})
    return out


def fetch_slo_series(client: PrometheusClient, spec: Spec, slo: Slo, window: Window) -> SloSeries:
    """Hourly events and bad share over this and the previous period, and the 1 h burn."""
    previous = window.previous
    hourly = fetch_range(
        client, slo_hourly_query(spec, slo), previous.start + HOUR, window.end, HOUR
    )
    stats = {labels.get("stat", ""): dict(points) for labels, points in hourly}
    burn = fetch_range(
        client, slo_ratio_expr(spec, slo, "1h"), window.start + BURN_STEP, window.end, BURN_STEP
    )
    return SloSeries(
        hourly_total=stats.get("total", {}),
        hourly_ratio=stats.get("ratio", {}),
        burn_ratio=[point for _, points in burn for point in points],
    )


def recording_covers(client: PrometheusClient, record: str, window: Window) -> bool:
    """Whether a recording rule has samples in (nearly) every hour of the window."""
    found = fetch_instant(
        client,
        f"count_over_time(max(count_over_time({record}[1h]))[{_dur(window.seconds - 1)}:1h])",
        window.end,
    )
    hours = window.seconds // HOUR
    return bool(found) and found[0][1] >= 0.99 * hours


def fetch_signal_series(
    client: PrometheusClient,
    spec: Spec,
    defn: SignalDef,
    window: Window,
    step: int,
    recorded: bool = False,
) -> list[tuple[str, SignalSeries]]:
    """Hourly worst value and measured / past-the-line steps per instance of one signal."""
    exprs = signal_exprs(spec, defn, step, recorded)
    # The previous period only feeds the deltas: time over for red lines, peaks for the rest.
    red_line = defn.kind == "red_line"
    steps = _hourly(client, signal_steps_query(exprs, step), window, exprs.by, red_line)
    peaks = _hourly(client, exprs.peak, window, exprs.by, not (red_line and exprs.peak_costly))
    thresholds = _hourly(client, exprs.threshold, window, exprs.by) if exprs.threshold else {}
    p99: dict[str, dict[float, float]] = {}
    if defn.kind == "rpo":
        quantiles = fetch_range(
            client,
            signal_p99_query(exprs, window.seconds, step),
            window.start - 1,
            window.end - 1,
            window.seconds,
        )
        for labels, points in quantiles:
            instance = "/".join(labels.get(name, "") for name in exprs.by)
            p99[instance] = {ts + 1: v for ts, v in points}
    out: list[tuple[str, SignalSeries]] = []
    for instance in sorted(set(steps) | set(peaks)):
        encoded = steps.get(instance, {})
        samples = {ts: float(round(v) % ENCODE) for ts, v in encoded.items()}
        over = {ts: float(round(v) // ENCODE) for ts, v in encoded.items()}
        limits = thresholds.get(instance, {})
        out.append(
            (
                instance,
                SignalSeries(
                    step_seconds=float(step),
                    hourly_peak=peaks.get(instance, {}),
                    hourly_over=over,
                    hourly_samples=samples,
                    p99=p99.get(instance, {}),
                    threshold=max(limits.values()) if limits else None,
                ),
            )
        )
    return out


def fetch_remediation(
    client: PrometheusClient, window: Window
) -> tuple[RemediationCounts, RemediationCounts]:
    """Remediation run counts and durations of this period and the previous one."""
    result = fetch_range(
        client, remediation_query(window.seconds), window.start, window.end, window.seconds
    )
    counts: dict[float, dict[str, Any]] = {
        float(window.start): {"runs": {}, "sum": {}, "count": {}},
        float(window.end): {"runs": {}, "sum": {}, "count": {}},
    }
    measured: set[float] = set()
    for labels, points in result:
        stat = labels.get("stat", "")
        for ts, value in points:
            if ts not in counts:
                continue
            if stat == "runs":
                measured.add(ts)
                counts[ts]["runs"][(labels.get("playbook", ""), labels.get("outcome", ""))] = value
            elif stat in ("sum", "count"):
                counts[ts][stat][labels.get("playbook", "")] = value

    def build(ts: float) -> RemediationCounts:
        c = counts[ts]
        return RemediationCounts(
            runs=c["runs"],
            duration_sum=c["sum"],
            duration_count=c["count"],
            measured=ts in measured,
        )

    return build(float(window.end)), build(float(window.start))


def fetch_remediation_events(client: PrometheusClient, window: Window, step: int) -> list[RunEvent]:
    """Runs by playbook, outcome and the step (at least a minute) in which they ended."""
    step = max(step, EVENT_STEP)
    result = fetch_range(
        client, remediation_events_query(step), window.start + step, window.end, step
    )
    return [
        RunEvent(
            ts, labels.get(catalog.LABEL_PLAYBOOK, ""), labels.get(catalog.LABEL_OUTCOME, ""), v
        )
        for labels, points in result
        for ts, v in points
    ]


def fetch_remediation_guards(client: PrometheusClient, window: Window) -> list[GuardState]:
    """Each playbook's modes, pauses and breaker over the period and at its end."""
    found: dict[str, dict[str, Any]] = {}
    for labels, value in fetch_instant(
        client, remediation_guards_query(window.seconds), window.end
    ):
        playbook = labels.get(catalog.LABEL_PLAYBOOK, "")
        state = found.setdefault(playbook, {"modes": set(), "end": None, "flags": set()})
        stat = labels.get("stat", "")
        if stat == "mode_seen":
            state["modes"].add(labels.get(MODE_LABEL, ""))
        elif stat == "mode_end":
            state["end"] = labels.get(MODE_LABEL)
        elif value >= 1:
            state["flags"].add(stat)
    return [
        GuardState(
            playbook=playbook,
            modes_seen=frozenset(state["modes"]),
            mode_at_end=state["end"],
            paused_during="paused_seen" in state["flags"],
            paused_at_end="paused_end" in state["flags"],
            breaker_open_during="breaker_seen" in state["flags"],
            breaker_open_at_end="breaker_end" in state["flags"],
        )
        for playbook, state in sorted(found.items())
    ]


def fetch_live(client: PrometheusClient, window: Window) -> LiveSignals:
    """The maturity assessment's live signals over the period."""
    probes: dict[str, set[str]] = {}
    failing: set[str] = set()
    evals: float | None = None
    spot: float | None = None
    pairs: dict[tuple[str, str], dict[str, float]] = {}
    for labels, value in fetch_instant(client, live_query(window.seconds), window.end):
        stat = labels.get("stat")
        region, probe = labels.get("region", ""), labels.get("probe", "")
        if stat in ("similarity", "similarity_min", "agreement"):
            pairs.setdefault((labels.get(catalog.LABEL_MODEL, ""), region), {})[stat] = value
        elif stat == "seen":
            probes.setdefault(probe, set()).add(region)
        elif stat == "last" and value == 0:
            failing.add(f"{region}/{probe}")
        elif stat == "evals":
            evals = value
        elif stat == "spot":
            spot = value
    return LiveSignals(
        probes={k: frozenset(v) for k, v in probes.items()},
        probes_failing_at_end=frozenset(failing),
        golden_evaluations=evals,
        spot_unrecoverable=spot,
        cross_region=[
            CrossRegionFigures(
                model=model,
                region=region,
                similarity_mean=found.get("similarity"),
                similarity_min=found.get("similarity_min"),
                agreement_ratio=found.get("agreement"),
            )
            for (model, region), found in sorted(pairs.items())
        ],
    )


def fetch_alerts(client: PrometheusClient, window: Window) -> list[AlertSamples]:
    """Raw samples of firing `ALERTS` over this and the previous period."""
    raw = fetch_raw(client, "ALERTS", {"alertstate": "firing"}, window.previous.start, window.end)
    return [AlertSamples(labels=labels, timestamps=ts) for labels, ts in raw]


def detect_step(client: PrometheusClient, spec: Spec, window: Window) -> int:
    """The time-over resolution: the spec's scrape interval, or the data's if it is coarser.

    Evaluating more often than samples exist adds cost and no information, so the step is
    the shortest sampling interval of the request series seen in any hour of the window
    (rounded up to a divisor of an hour), never shorter than the spec's scrape interval.
    """
    base = int(math.ceil(spec.timing.scrape_interval_seconds))
    series = f"{request_duration(spec)}_count"
    found = fetch_instant(
        client,
        f"max(max_over_time(count_over_time({series}[1h])[{_dur(window.seconds)}:1h]))",
        window.end,
    )
    interval = float(base)
    if found and found[0][1] > 1:
        interval = max(interval, HOUR / (found[0][1] - 1))
    return next(d for d in range(max(1, math.floor(interval * 0.95)), HOUR + 1) if HOUR % d == 0)


def fetch_report_input(
    client: PrometheusClient, spec: Spec, window: Window, step: int | None = None, workers: int = 4
) -> ReportInput:
    """Everything `build_report` needs for `window`, read from Prometheus (queries in parallel).

    `step` is the time-over resolution; None picks it with `detect_step`.
    """
    client.check()
    if step is None:
        step = detect_step(client, spec, window)
    check_step(step)
    recorded = recording_covers(client, p99_record(spec), window)
    histogram = f"the raw histogram {request_duration(spec)}_bucket"
    if not spec.sources.resolve().direct("request_duration"):
        histogram = f"the rules' mirror of the engine's histogram, {request_duration(spec)}_bucket"
    notes = [
        f"P99 latency read from the recording rule {p99_record(spec)}"
        if recorded
        else f"P99 latency computed from {histogram} (its recording rule does not cover the period)"
    ]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="promquery") as pool:
        # The costly signal subqueries go first so they overlap with everything else.
        signal_jobs = {
            defn.key: pool.submit(fetch_signal_series, client, spec, defn, window, step, recorded)
            for defn in signal_defs(spec)
        }
        slo_jobs = {
            slo.name: pool.submit(fetch_slo_series, client, spec, slo, window) for slo in spec.slos
        }
        remediation_job = pool.submit(fetch_remediation, client, window)
        events_job = pool.submit(fetch_remediation_events, client, window, step)
        guards_job = pool.submit(fetch_remediation_guards, client, window)
        alerts_job = pool.submit(fetch_alerts, client, window)
        live_job = pool.submit(fetch_live, client, window)
        remediation, remediation_previous = remediation_job.result()
        return ReportInput(
            window=window,
            slos={name: job.result() for name, job in slo_jobs.items()},
            signals={key: job.result() for key, job in signal_jobs.items()},
            alerts=alerts_job.result(),
            remediation=remediation,
            remediation_previous=remediation_previous,
            remediation_events=events_job.result(),
            remediation_guards=guards_job.result(),
            live=live_job.result(),
            evaluation_interval_seconds=spec.timing.evaluation_interval_seconds,
            notes=tuple(notes),
        )
