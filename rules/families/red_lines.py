"""The three SLA red lines (latency P99, context keep-alive, index consistency): instant
critical alerts, and the promtool cases that prove them."""

from __future__ import annotations

from redline.rules.common import alert_rule
from redline.rules.model import RuleGroup, format_duration, number
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
from redline.rules.records import p99_record
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
    rules = (
        alert_rule(
            spec,
            Alert.RED_LINE_LATENCY_P99,
            f"{p99_record(spec)} > {number(lat.threshold_seconds)}",
            lat.for_seconds,
            "critical",
            f"{quantile} latency of region {{{{ $labels.region }}}} is over the "
            f"{number(lat.threshold_seconds)} s red line",
            f"End-to-end {quantile} {reroute}over {lat.window} is "
            f"{{{{ $value | humanize }}}}s (red line {number(lat.threshold_seconds)} s).",
            lat.playbook,
            red_line="latency_p99",
        ),
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
                [expected(alerts.get(Alert.RED_LINE_LATENCY_P99), {"region": primary}, p99)],
            )
        ],
        interval_seconds=step,
    )
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
    return [latency, *keep_cases, index]
