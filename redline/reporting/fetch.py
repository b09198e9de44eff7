"""Read the report's series from Prometheus (chunked ranges and raw reads, queries in parallel).

The PromQL is `redline.reporting.queries`: every number is computed by Prometheus at a coarse
step, so a 30-day report moves a few thousand points, not every raw sample. The HTTP transport
(retries, errors) is `redline.platform.prometheus`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redline.platform.prometheus import Labels, Points, PrometheusClient
from redline.reporting.queries import (
    ENCODE,
    EVENT_STEP,
    MODE_LABEL,
    check_step,
    dur,
    fleet_slo,
    live_query,
    remediation_events_query,
    remediation_guards_query,
    remediation_query,
    signal_exprs,
    signal_p99_query,
    signal_steps_query,
    slo_hourly_query,
    slo_ratio_expr,
)
from redline.rules.build import (
    p99_record,
)
from redline.rules.records import request_duration
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
    """Hourly events and bad share over this and the previous period, and the 1 h burn; a
    grouped SLO's fleet from the raw series and each group's hours beside it."""
    previous = window.previous
    fleet, recorded = fleet_slo(slo), not slo.group_by
    hourly = fetch_range(
        client, slo_hourly_query(spec, fleet, recorded), previous.start + HOUR, window.end, HOUR
    )
    stats = {labels.get("stat", ""): dict(points) for labels, points in hourly}
    burn = fetch_range(
        client,
        slo_ratio_expr(spec, fleet, "1h", recorded),
        window.start + BURN_STEP,
        window.end,
        BURN_STEP,
    )
    groups: dict[tuple[tuple[str, str], ...], dict[str, dict[float, float]]] = {}
    if slo.group_by:
        grouped = fetch_range(
            client, slo_hourly_query(spec, slo), previous.start + HOUR, window.end, HOUR
        )
        for labels, points in grouped:
            key = tuple((name, labels.get(name, "")) for name in slo.group_by)
            groups.setdefault(key, {})[labels.get("stat", "")] = dict(points)
    return SloSeries(
        hourly_total=stats.get("total", {}),
        hourly_ratio=stats.get("ratio", {}),
        burn_ratio=[point for _, points in burn for point in points],
        groups={
            key: SloSeries(hourly_total=got.get("total", {}), hourly_ratio=got.get("ratio", {}))
            for key, got in sorted(groups.items())
        },
    )


def recording_covers(client: PrometheusClient, record: str, window: Window) -> bool:
    """Whether a recording rule has samples in (nearly) every hour of the window."""
    found = fetch_instant(
        client,
        f"count_over_time(max(count_over_time({record}[1h]))[{dur(window.seconds - 1)}:1h])",
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
        f"max(max_over_time(count_over_time({series}[1h])[{dur(window.seconds)}:1h]))",
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
    if spec.sources.resolve().mirrored:
        histogram = f"the engine's own histogram, {request_duration(spec)}_bucket"
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
