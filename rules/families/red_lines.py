"""The three SLA red lines (latency P99, context keep-alive, index consistency): instant
critical alerts, and the promtool cases that prove them."""

from __future__ import annotations

from dataclasses import dataclass

from redline.rules.common import alert_rule
from redline.rules.families.slo import group_of
from redline.rules.model import AlertRule, RuleGroup, format_duration, number
from redline.rules.promtool_cases import (
    SERIES_INTERVAL,
    AlertIndex,
    Case,
    bucket_around,
    constant,
    expected,
    histogram,
    series,
)
from redline.rules.records import (
    p99_record,
    red_line_by,
    window_requests_record,
    window_slow_requests_record,
)
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration


def build_rules(spec: Spec) -> list[RuleGroup]:
    """Instant alerts on the three SLA red lines (severity critical)."""
    red = spec.red_lines
    lat, keep, idx = red.latency_p99, red.context_keepalive, red.index_consistency
    quantile = f"P{number(lat.quantile * 100)}"
    short = format_duration(max(60.0, 4 * spec.timing.scrape_interval_seconds))
    # Only a source in the data path (redline's gateway) measures reroutes; `validate` warns.
    measured = lat.includes_reroute and spec.sources.resolve().profile.includes_reroute
    reroute = "including cross-region reroutes " if measured else ""
    requests = window_requests_record(spec)
    on = ", ".join(red_line_by(spec))
    of = "".join(f" {label} {{{{ $labels.{label} }}}}" for label in lat.group_by)
    # Over fewer than min_requests the P99 is the slowest request: no evidence for a reroute.
    evidence = f"\nand on ({on})\n{requests} >= {lat.min_requests}" if lat.min_requests else ""
    rules: tuple[AlertRule, ...] = (
        alert_rule(
            spec,
            Alert.RED_LINE_LATENCY_P99,
            f"{p99_record(spec)} > {number(lat.threshold_seconds)}{evidence}",
            lat.for_seconds,
            "critical",
            f"{quantile} latency of region {{{{ $labels.region }}}}{of} is over the "
            f"{number(lat.threshold_seconds)} s red line",
            f"End-to-end {quantile} {reroute}over {lat.window} is "
            f"{{{{ $value | humanize }}}}s (red line {number(lat.threshold_seconds)} s).",
            lat.playbook,
            red_line="latency_p99",
        ),
    )
    if lat.min_requests and lat.slow_requests_page:
        rules += (
            alert_rule(
                spec,
                Alert.RED_LINE_LATENCY_SLOW_REQUESTS,
                f"{window_slow_requests_record(spec)} >= {lat.slow_requests_page}\n"
                f"and on ({on})\n{requests} < {lat.min_requests}",
                lat.for_seconds,
                "page",
                f"Region {{{{ $labels.region }}}}{of}: requests slower than the "
                f"{number(lat.threshold_seconds)} s red line, too few for a {quantile}",
                f"{{{{ $value | humanize }}}} requests over {lat.window} took longer than "
                f"{number(lat.threshold_seconds)} s, out of fewer than {lat.min_requests}: too "
                f"few for a {quantile} to act on (no reroute), enough for a human to look.",
                red_line="latency_p99",
            ),
        )
    rules += (
        alert_rule(
            spec,
            Alert.RED_LINE_CONTEXT_KEEPALIVE,
            f"min({catalog.SESSION_KEEPALIVE_PROBE_SUCCESS}) == 0\n"
            f"or\nmin({catalog.SESSION_CONTEXT_TTL_SECONDS}) < {number(keep.min_seconds)}\n"
            f"or\nsum(increase({catalog.SESSION_CONTEXT_EVICTED_TOTAL}[{short}])) > 0",
            keep.for_seconds,
            "critical",
            f"Conversation context is not kept alive for {number(keep.min_seconds)} s",
            f"A canary session died, session TTLs fell under {number(keep.min_seconds)} s, or "
            f"sessions were evicted before {number(keep.min_seconds)} s "
            f"(value {{{{ $value | humanize }}}}).",
            keep.playbook,
            red_line="context_keepalive",
        ),
        alert_rule(
            spec,
            Alert.RED_LINE_INDEX_STALENESS,
            f"max by (collection, replica) ({catalog.VECTORDB_INDEX_STALENESS_SECONDS}) "
            f"> {number(idx.max_staleness_seconds)}",
            idx.for_seconds,
            "critical",
            "Vector index replica {{ $labels.replica }} of {{ $labels.collection }} is stale",
            f"A canary written on the primary took {{{{ $value | humanize }}}}s to reach the "
            f"replica (consistency window {number(idx.max_staleness_seconds)} s).",
            idx.playbook,
            red_line="index_consistency",
        ),
    )
    return [RuleGroup("redline-red-lines", spec.timing.evaluation_interval_seconds, rules)]


def _window_step(window_seconds: int) -> int:
    """The largest whole-second step dividing the window with at least four samples in it (at
    most a minute): the window's increase is then exactly its requests."""
    return max(d for d in range(1, min(60, window_seconds // 4) + 1) if window_seconds % d == 0)


@dataclass(frozen=True)
class _Grid:
    """Where the red line's window cases sample: a step dividing the window, the samples a
    window holds, the evaluation time (a whole number of steps) and the samples written."""

    step: int
    per_window: int
    eval_at: int
    steps: int


def _window_grid(spec: Spec) -> _Grid:
    """The grid of the latency red line's window (see `_window_step`)."""
    window = int(parse_duration(spec.red_lines.latency_p99.window))
    step = _window_step(window)
    eval_at = 900 - 900 % step
    return _Grid(step, window // step, eval_at, eval_at // step + 5)


def _alert_labels(spec: Spec, labels: dict[str, str], region: str) -> dict[str, str]:
    """What the latency red line's alerts carry for a request with `labels` in `region`."""
    return {"region": region, **group_of(spec, spec.red_lines.latency_p99.group_by, labels)}


def _evidence_cases(
    spec: Spec,
    alerts: AlertIndex,
    labels: dict[str, str],
    at: float,
    above: float,
    p99: float,
) -> list[Case]:
    """The P99 acts only on min_requests: one slow request in a quiet window fires nothing;
    too few requests but many slow pages a human, never the reroute; a window one request
    short of min_requests pages, one holding min_requests fires the red line."""
    lat = spec.red_lines.latency_p99
    if not lat.min_requests:
        return []
    grid = _window_grid(spec)
    step, eval_at = grid.step, grid.eval_at
    primary, secondary = spec.regions[0], spec.regions[-1]

    def traffic(region: str, fast: float, slow: float) -> dict[str, str]:
        per_step = {at: fast / grid.per_window, above: slow / grid.per_window}
        return histogram(spec, {**labels, "region": region}, per_step, grid.steps)

    red_line = alerts.get(Alert.RED_LINE_LATENCY_P99)

    def red_labels(region: str) -> dict[str, str]:
        return _alert_labels(spec, labels, region)

    cases = [
        Case(
            f"latency red line: one slow request among 30 in {lat.window} (night-time traffic) "
            "fires nothing and reroutes nothing",
            traffic(primary, 29, 1),
            eval_at,
            [(Alert.RED_LINE_LATENCY_P99, []), (Alert.RED_LINE_LATENCY_SLOW_REQUESTS, [])],
            interval_seconds=step,
        )
    ]
    if not lat.slow_requests_page:
        return cases
    short, enough = lat.min_requests - 1, lat.min_requests
    slow_rule = alerts.get(Alert.RED_LINE_LATENCY_SLOW_REQUESTS)
    cases.append(
        Case(
            f"latency red line: {short} requests in {lat.window}, all slow, page a human "
            f"without the P99's playbook; {enough} fire the red line",
            {**traffic(primary, 0, short), **traffic(secondary, 0, enough)},
            eval_at,
            [
                (Alert.RED_LINE_LATENCY_P99, [expected(red_line, red_labels(secondary), p99)]),
                (
                    Alert.RED_LINE_LATENCY_SLOW_REQUESTS,
                    [expected(slow_rule, red_labels(primary), short)],
                ),
            ],
            interval_seconds=step,
        )
    )
    if lat.slow_requests_page > 1:
        few = lat.slow_requests_page - 1
        cases.append(
            Case(
                f"latency red line: {few} slow requests of 30 in {lat.window} stay silent, "
                f"{lat.slow_requests_page} page",
                {
                    **traffic(primary, 30 - few, few),
                    **traffic(secondary, 30 - few - 1, few + 1),
                },
                eval_at,
                [
                    (
                        Alert.RED_LINE_LATENCY_SLOW_REQUESTS,
                        [expected(slow_rule, red_labels(secondary), few + 1)],
                    ),
                    (Alert.RED_LINE_LATENCY_P99, []),
                ],
                interval_seconds=step,
            )
        )
    return cases


def _group_case(
    spec: Spec, alerts: AlertIndex, labels: dict[str, str], at: float, above: float, p99: float
) -> list[Case]:
    """Grouped: an adapter over the line at 0.5 % of its region's traffic fires for itself alone,
    while the region's P99 over every model stays under the line."""
    lat = spec.red_lines.latency_p99
    adapter = {**labels, "model": "chat-adapter", "model_version": "v2"}
    if group_of(spec, lat.group_by, adapter) == group_of(spec, lat.group_by, labels):
        return []  # a constant model grouped by model alone: one group, nothing to case
    grid = _window_grid(spec)
    slow = 2 * max(lat.min_requests, 50)  # enough evidence in the adapter's own window
    red_line = alerts.get(Alert.RED_LINE_LATENCY_P99)
    return [
        Case(
            f"latency red line by {', '.join(lat.group_by)}: an adapter over the line at 0.5 % "
            "of the region's traffic fires for itself alone",
            {
                **histogram(spec, labels, {at: 200 * slow / grid.per_window}, grid.steps),
                **histogram(spec, adapter, {above: slow / grid.per_window}, grid.steps),
            },
            grid.eval_at,
            [
                (
                    Alert.RED_LINE_LATENCY_P99,
                    [expected(red_line, _alert_labels(spec, adapter, labels["region"]), p99)],
                ),
                (Alert.RED_LINE_LATENCY_SLOW_REQUESTS, []),
            ],
            interval_seconds=grid.step,
        )
    ]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Latency P99 (through the raw histogram), keep-alive and index staleness."""
    red = spec.red_lines
    at, above = bucket_around(spec, red.latency_p99.threshold_seconds)
    p99 = at + (above - at) * red.latency_p99.quantile
    primary, secondary = spec.regions[0], spec.regions[-1]
    labels_slow = {
        "region": primary, "served_region": secondary, "rerouted": "true", "model": "chat",
        "model_version": "v1", "status": "200",
    }  # fmt: skip
    labels_fast = {**labels_slow, "region": secondary, "rerouted": "false"}
    # At least four samples in the quantile's rate window (the local profile's is 30 s).
    step = min(SERIES_INTERVAL, int(parse_duration(red.latency_p99.window) // 4))
    steps = 900 // step + 5
    latency = Case(
        "latency red line: slow rerouted traffic in one region fires, fast traffic does not",
        {
            **histogram(spec, labels_slow, {above: 100}, steps),
            **histogram(spec, labels_fast, {at: 100}, steps),
        },
        900,
        [
            (
                Alert.RED_LINE_LATENCY_P99,
                [
                    expected(
                        alerts.get(Alert.RED_LINE_LATENCY_P99),
                        _alert_labels(spec, labels_slow, primary),
                        p99,
                    )
                ],
            )
        ],
        interval_seconds=step,
    )
    quiet = _evidence_cases(spec, alerts, labels_slow, at, above, p99)
    if red.latency_p99.group_by:
        quiet += _group_case(spec, alerts, labels_slow, at, above, p99)
    keep = red.context_keepalive
    keep_rule = alerts.get(Alert.RED_LINE_CONTEXT_KEEPALIVE)
    keep_cases = [
        Case(
            "keep-alive red line: a dead canary session fires",
            {
                series(catalog.SESSION_KEEPALIVE_PROBE_SUCCESS): constant(0, 20),
                series(catalog.SESSION_CONTEXT_TTL_SECONDS): constant(keep.min_seconds * 2, 20),
                series(catalog.SESSION_CONTEXT_EVICTED_TOTAL): constant(0, 20),
            },
            600,
            [(Alert.RED_LINE_CONTEXT_KEEPALIVE, [expected(keep_rule, {}, 0)])],
        ),
        Case(
            "keep-alive red line: a TTL under the minimum fires",
            {
                series(catalog.SESSION_KEEPALIVE_PROBE_SUCCESS): constant(1, 20),
                series(catalog.SESSION_CONTEXT_TTL_SECONDS): constant(keep.min_seconds - 1, 20),
                series(catalog.SESSION_CONTEXT_EVICTED_TOTAL): constant(0, 20),
            },
            600,
            [(Alert.RED_LINE_CONTEXT_KEEPALIVE, [expected(keep_rule, {}, keep.min_seconds - 1)])],
        ),
        Case(
            "keep-alive red line: evictions before the minimum fire",
            {
                series(catalog.SESSION_KEEPALIVE_PROBE_SUCCESS): constant(1, 80),
                series(catalog.SESSION_CONTEXT_TTL_SECONDS): constant(keep.min_seconds * 2, 80),
                series(
                    catalog.SESSION_CONTEXT_EVICTED_TOTAL
                ): "0x20 1+1x60",  # one eviction every 15 s
            },
            600,
            [(Alert.RED_LINE_CONTEXT_KEEPALIVE, [expected(keep_rule, {}, 4)])],
            interval_seconds=15,
        ),
        Case(
            "keep-alive red line: healthy sessions stay silent",
            {
                series(catalog.SESSION_KEEPALIVE_PROBE_SUCCESS): constant(1, 20),
                series(catalog.SESSION_CONTEXT_TTL_SECONDS): constant(keep.min_seconds, 20),
                series(catalog.SESSION_CONTEXT_EVICTED_TOTAL): constant(3, 20),
            },
            600,
            [(Alert.RED_LINE_CONTEXT_KEEPALIVE, [])],
        ),
    ]
    limit = red.index_consistency.max_staleness_seconds
    stale_labels = {"collection": "documents", "replica": spec.regions[-1]}
    index = Case(
        "index staleness red line: over the window fires, at the window stays silent",
        {
            series(catalog.VECTORDB_INDEX_STALENESS_SECONDS, stale_labels): constant(limit + 1, 20),
            series(
                catalog.VECTORDB_INDEX_STALENESS_SECONDS, {**stale_labels, "collection": "faq"}
            ): constant(limit, 20),
        },
        600,
        [
            (
                Alert.RED_LINE_INDEX_STALENESS,
                [expected(alerts.get(Alert.RED_LINE_INDEX_STALENESS), stale_labels, limit + 1)],
            )
        ],
    )
    return [latency, *quiet, *keep_cases, index]
