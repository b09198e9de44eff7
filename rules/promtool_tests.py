"""promtool unit tests built from the spec: every alert fires on crafted series and stays silent
otherwise. Values come from the spec's thresholds, so a changed spec keeps the proof honest.

Each case is evaluated by the real `promtool test rules` against the generated rule files.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redline.rules.build import (
    BURN_WINDOWS,
    SLI_GUARDS,
    burn_factor,
    rollback_records,
)
from redline.rules.model import AlertRule, RuleGroup, format_duration, number
from redline.slo.spec import Slo, Spec, parse_duration

SERIES_INTERVAL = 60
"""Input series step (seconds): one sample a minute, as `0+100x30` reads."""


@dataclass
class Case:
    """One promtool test: input series, then alerts expected at one evaluation time."""

    name: str
    series: dict[str, str]
    eval_seconds: int
    checks: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    interval_seconds: int = SERIES_INTERVAL

    def to_dict(self) -> dict[str, Any]:
        """The promtool test-group YAML shape."""
        return {
            "name": self.name,
            "interval": format_duration(self.interval_seconds),
            "input_series": [{"series": s, "values": v} for s, v in self.series.items()],
            "alert_rule_test": [
                {"eval_time": format_duration(self.eval_seconds), "alertname": a, "exp_alerts": e}
                for a, e in self.checks
            ],
        }


def humanize(value: float) -> str:
    """Prometheus' `humanize` template function."""
    if value == 0 or math.isnan(value) or math.isinf(value):
        return _g(value)
    prefix = ""
    if abs(value) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(value) < 1000:
                break
            prefix, value = p, value / 1000
        return _g(value) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix, value = p, value * 1000
    return _g(value) + prefix


def humanize_duration(value: float) -> str:
    """Prometheus' `humanizeDuration` template function."""
    if math.isnan(value) or math.isinf(value):
        return _g(value)
    if value == 0:
        return _g(value) + "s"
    if abs(value) >= 1:
        sign = "-" if value < 0 else ""
        value = abs(value)
        whole = int(value)
        seconds, minutes = whole % 60, (whole // 60) % 60
        hours, days = (whole // 3600) % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_g(value)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix, value = p, value * 1000
    return f"{_g(value)}{prefix}s"


def _g(value: float) -> str:
    text = f"{value:.4g}"
    return {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}.get(text, text)


_TEMPLATE = re.compile(r"\{\{\s*(\$labels\.(\w+)|\$value(?:\s*\|\s*(\w+))?)\s*\}\}")


def humanize_percentage(value: float) -> str:
    """Prometheus' `humanizePercentage` template function."""
    return f"{value * 100:.4g}%"


_FUNCTIONS: dict[str | None, Callable[[float], str]] = {
    None: _g,
    "humanize": humanize,
    "humanizeDuration": humanize_duration,
    "humanizePercentage": humanize_percentage,
}


def expand(template: str, labels: dict[str, str], value: float) -> str:
    """Expand the subset of Prometheus alert templating that redline's annotations use."""

    def one(match: re.Match[str]) -> str:
        if match.group(2):
            return labels.get(match.group(2), "")
        return _FUNCTIONS[match.group(3)](value)

    return _TEMPLATE.sub(one, template)


def expected(rule: AlertRule, expr_labels: dict[str, str], value: float) -> dict[str, Any]:
    """What promtool must see for `rule` firing with these series labels and value."""
    labels = {**expr_labels, **rule.labels}
    return {
        "exp_labels": dict(sorted(labels.items())),
        "exp_annotations": {k: expand(v, labels, value) for k, v in rule.annotations.items()},
    }


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name


def constant(value: float, steps: int) -> str:
    """A series holding `value` for `steps` samples."""
    return f"{number(value)}+0x{steps}"


def counter(per_step: float, steps: int) -> str:
    """A counter growing by `per_step` each sample, for `steps` samples."""
    return f"0+{number(per_step)}x{steps}"


def histogram(
    spec: Spec, labels: dict[str, str], per_bucket: dict[float, int], steps: int
) -> dict[str, str]:
    """Bucket, count and sum series of the latency histogram over `steps` samples; `per_bucket`
    maps a bucket's upper bound to the requests falling in it each step."""
    base = spec.sources.request_duration
    out: dict[str, str] = {}
    cumulative = 0
    for bound in spec.sources.histogram_buckets:
        cumulative += per_bucket.get(bound, 0)
        out[_series(f"{base}_bucket", {**labels, "le": number(bound)})] = counter(cumulative, steps)
    cumulative += per_bucket.get(math.inf, 0)
    out[_series(f"{base}_bucket", {**labels, "le": "+Inf"})] = counter(cumulative, steps)
    out[_series(f"{base}_count", labels)] = counter(cumulative, steps)
    total = sum(bound * n for bound, n in per_bucket.items() if bound != math.inf)
    out[_series(f"{base}_sum", labels)] = counter(total, steps)
    return out


def _bucket_around(spec: Spec, threshold: float) -> tuple[float, float]:
    """The bucket bound at the threshold and the next one above it."""
    buckets = sorted(spec.sources.histogram_buckets)
    above = [b for b in buckets if b > threshold]
    return threshold, (above[0] if above else math.inf)


class _Rules:
    def __init__(self, groups: list[RuleGroup]) -> None:
        self.alerts = [a for g in groups for a in g.alerts]

    def get(self, name: str, **labels: str) -> AlertRule:
        for rule in self.alerts:
            if rule.alert == name and all(rule.labels.get(k) == v for k, v in labels.items()):
                return rule
        raise KeyError(f"no alert {name} {labels}")


def build_red_line_cases(spec: Spec, rules: _Rules) -> list[Case]:
    """Latency P99 (through the raw histogram), keep-alive and index staleness."""
    red = spec.red_lines
    at, above = _bucket_around(spec, red.latency_p99.threshold_seconds)
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
                "RedLineLatencyP99",
                [expected(rules.get("RedLineLatencyP99"), {"region": primary}, p99)],
            )
        ],
        interval_seconds=step,
    )
    keep = red.context_keepalive
    keep_rule = rules.get("RedLineContextKeepalive")
    keep_cases = [
        Case(
            "keep-alive red line: a dead canary session fires",
            {
                "session_keepalive_probe_success": constant(0, 20),
                "session_context_ttl_seconds": constant(keep.min_seconds * 2, 20),
                "session_context_evicted_total": constant(0, 20),
            },
            600,
            [("RedLineContextKeepalive", [expected(keep_rule, {}, 0)])],
        ),
        Case(
            "keep-alive red line: a TTL under the minimum fires",
            {
                "session_keepalive_probe_success": constant(1, 20),
                "session_context_ttl_seconds": constant(keep.min_seconds - 1, 20),
                "session_context_evicted_total": constant(0, 20),
            },
            600,
            [("RedLineContextKeepalive", [expected(keep_rule, {}, keep.min_seconds - 1)])],
        ),
        Case(
            "keep-alive red line: evictions before the minimum fire",
            {
                "session_keepalive_probe_success": constant(1, 80),
                "session_context_ttl_seconds": constant(keep.min_seconds * 2, 80),
                "session_context_evicted_total": "0x20 1+1x60",  # one eviction every 15 s
            },
            600,
            [("RedLineContextKeepalive", [expected(keep_rule, {}, 4)])],
            interval_seconds=15,
        ),
        Case(
            "keep-alive red line: healthy sessions stay silent",
            {
                "session_keepalive_probe_success": constant(1, 20),
                "session_context_ttl_seconds": constant(keep.min_seconds, 20),
                "session_context_evicted_total": constant(3, 20),
            },
            600,
            [("RedLineContextKeepalive", [])],
        ),
    ]
    limit = red.index_consistency.max_staleness_seconds
    stale_labels = {"collection": "documents", "replica": spec.regions[-1]}
    index = Case(
        "index staleness red line: over the window fires, at the window stays silent",
        {
            _series("vectordb_index_staleness_seconds", stale_labels): constant(limit + 1, 20),
            _series(
                "vectordb_index_staleness_seconds", {**stale_labels, "collection": "faq"}
            ): constant(limit, 20),
        },
        600,
        [
            (
                "RedLineIndexStaleness",
                [expected(rules.get("RedLineIndexStaleness"), stale_labels, limit + 1)],
            )
        ],
    )
    return [latency, *keep_cases, index]


def build_rpo_cases(spec: Spec, rules: _Rules) -> list[Case]:
    """LoRA checkpoint age, session CDC lag and delta-log age, each over and at its RPO."""
    rpo = spec.rpo
    session = {"stream": "sessions:cdc", "group": "replica"}
    lagging = {**session, "stream": "sessions:cdc:eu"}
    lora_age = 600.0  # the checkpoint stamped at t=0, evaluated at 10m
    return [
        Case(
            "LoRA checkpoint RPO: an old checkpoint fires, a fresh one does not",
            {
                _series("model_checkpoint_last_success_timestamp_seconds", {"adapter": "old"}): (
                    constant(0, 20)
                ),
                _series("model_checkpoint_last_success_timestamp_seconds", {"adapter": "fresh"}): (
                    f"0+{SERIES_INTERVAL}x20"
                ),
            },
            600,
            [
                (
                    "LoRACheckpointRPOBreach",
                    [expected(rules.get("LoRACheckpointRPOBreach"), {"adapter": "old"}, lora_age)],
                )
            ],
        ),
        Case(
            "session RPO: CDC lag over the RPO fires, at the RPO stays silent",
            {
                _series("session_cdc_rpo_seconds", lagging): constant(
                    rpo.session_state.max_seconds + 1, 20
                ),
                _series("session_cdc_rpo_seconds", session): constant(
                    rpo.session_state.max_seconds, 20
                ),
            },
            600,
            [
                (
                    "SessionRPOBreach",
                    [
                        expected(
                            rules.get("SessionRPOBreach"),
                            lagging,
                            rpo.session_state.max_seconds + 1,
                        )
                    ],
                )
            ],
        ),
        Case(
            "delta-log RPO: pending entries older than the RPO fire",
            {
                _series("vectordb_delta_log_oldest_pending_age_seconds", {"collection": "a"}): (
                    constant(rpo.embedding_index.max_seconds + 3, 20)
                ),
                _series("vectordb_delta_log_oldest_pending_age_seconds", {"collection": "b"}): (
                    constant(rpo.embedding_index.max_seconds, 20)
                ),
            },
            600,
            [
                (
                    "IndexDeltaLogRPOBreach",
                    [
                        expected(
                            rules.get("IndexDeltaLogRPOBreach"),
                            {"collection": "a"},
                            rpo.embedding_index.max_seconds + 3,
                        )
                    ],
                )
            ],
        ),
    ]


def _gate_series(
    spec: Spec, p99: float, baseline_p99: float, accuracy: float, baseline_acc: float, reqs: float
) -> dict[str, str]:
    records = rollback_records(spec)
    version = {"model": "chat", "model_version": "v2"}
    return {
        _series(records["p99"], version): constant(p99, 20),
        _series("model_baseline_p99_seconds", version): constant(baseline_p99, 20),
        _series(records["accuracy"], version): constant(accuracy, 20),
        _series("model_baseline_accuracy_ratio", version): constant(baseline_acc, 20),
        _series(records["requests"], version): constant(reqs, 20),
    }


def build_rollback_cases(spec: Spec, rules: _Rules) -> list[Case]:
    """The two-signal gate: both fire; either alone, too few requests, boundaries."""
    gate = spec.rollback
    rule = rules.get("SemanticRollbackTwoSignal")
    version = {"model": "chat", "model_version": "v2"}
    base_p99, base_acc = 0.5, 0.9
    up = base_p99 * (1 + gate.p99_increase_ratio)  # exactly +ratio: fires
    slow = up * 1.2
    not_up = up - 0.001
    down = base_acc - gate.accuracy_drop * 2
    exactly_down = round(base_acc - gate.accuracy_drop, 9)  # exactly the drop: silent
    enough, too_few = gate.min_samples * 2, gate.min_samples - 1
    name = "SemanticRollbackTwoSignal"
    cases = [
        (
            "two signals with enough requests fire",
            slow,
            down,
            enough,
            [expected(rule, version, slow)],
        ),
        ("latency up alone stays silent", slow, base_acc, enough, []),
        ("accuracy down alone stays silent", not_up, down, enough, []),
        ("both signals under min_samples stay silent", slow, down, too_few, []),
        ("exactly +p99_increase_ratio fires", up, down, enough, [expected(rule, version, up)]),
        ("accuracy down exactly accuracy_drop stays silent", slow, exactly_down, enough, []),
    ]
    out = [
        Case(
            f"rollback gate: {title}",
            _gate_series(spec, p99, base_p99, acc, base_acc, reqs),
            600,
            [(name, alerts)],
        )
        for title, p99, acc, reqs, alerts in cases
    ]
    out.append(_rollback_from_raw(spec, rule))
    return out


def _rollback_from_raw(spec: Spec, rule: AlertRule) -> Case:
    """The gate end to end from raw histogram, eval counters and baselines (recordings too)."""
    gate = spec.rollback
    at, above = _bucket_around(spec, spec.red_lines.latency_p99.threshold_seconds)
    p99 = at + (above - at) * 0.99
    window_minutes = gate.window_seconds / 60
    per_minute = math.ceil(gate.min_samples * 2 / window_minutes)
    version = {"model": "chat", "model_version": "v2"}
    labels = {**version, "region": spec.regions[0], "served_region": spec.regions[0]}
    quiet = {**version, "model_version": "v3"}
    quiet_labels = {**labels, **quiet}
    per_minute_quiet = math.floor(gate.min_samples / 2 / window_minutes)
    series = {
        **histogram(spec, labels, {above: per_minute}, 30),
        **histogram(spec, quiet_labels, {above: per_minute_quiet}, 30),
    }
    for labelset in (version, quiet):
        series[_series("model_baseline_p99_seconds", labelset)] = constant(at / 2, 30)
        series[_series("model_baseline_accuracy_ratio", labelset)] = constant(0.9, 30)
        series[_series("llm_eval_requests_total", labelset)] = counter(100, 30)
        series[_series("llm_eval_correct_total", labelset)] = counter(80, 30)
    return Case(
        "rollback gate: raw series of a regressed version fire; the same regression under "
        "min_samples stays silent",
        series,
        1200,
        [("SemanticRollbackTwoSignal", [expected(rule, version, p99)])],
    )


def build_slo_cases(spec: Spec, rules: _Rules, slo: Slo) -> list[Case]:
    """Burn-rate alerts: all-bad traffic pages and tickets; traffic within budget is silent."""
    budget = 1 - slo.objective
    labels = {"region": spec.regions[0], "model": "chat", "model_version": "v1", "status": "200"}
    labels.update(slo.sli.selector)
    match slo.sli.kind:
        case "slow_requests":
            at, above = _bucket_around(spec, slo.sli.threshold_seconds)
            bad = histogram(spec, labels, {above: 100}, 60)
            # Half the budget: 1000 requests a minute, budget/2 of them slow.
            bad_per_min = 1000 * budget / 2
            good = histogram(
                spec, labels, {at: int(1000 - bad_per_min), above: int(bad_per_min)}, 60
            )
        case "errors":
            sel = dict(labels)
            bad = {
                _series(spec.sources.requests_total, sel): counter(100, 60),
                _series(spec.sources.errors_total, sel): counter(100, 60),
            }
            good = {
                _series(spec.sources.requests_total, sel): counter(10000, 60),
                _series(spec.sources.errors_total, sel): counter(10000 * budget / 2, 60),
            }
    name = slo.burn_alert_name
    page, ticket = rules.get(name, severity="page"), rules.get(name, severity="ticket")
    period = parse_duration(slo.period)
    fastest = max(burn_factor(w, period) for w in BURN_WINDOWS) * budget
    assert fastest < 1, "an all-bad SLI must burn faster than the fastest alert"
    return [
        Case(
            f"{slo.name} SLO: every request bad pages and tickets",
            bad,
            1800,
            [
                (
                    name,
                    [
                        expected(page, {"slo": slo.name}, 1.0),
                        expected(ticket, {"slo": slo.name}, 1.0),
                    ],
                ),
            ],
        ),
        Case(f"{slo.name} SLO: half the budget's error rate is silent", good, 1800, [(name, [])]),
    ]


def build_drift_cases(spec: Spec, rules: _Rules) -> list[Case]:
    """Drift over the calibrated threshold fires; under it does not."""
    drifted = {"collection": "documents", "method": spec.drift.method}
    steady = {**drifted, "collection": "faq"}
    for_minutes = math.ceil(spec.drift.for_seconds / 60) + 5
    return [
        Case(
            "embedding drift: score over the threshold fires, under it does not",
            {
                _series("embedding_drift_score", drifted): constant(0.05, for_minutes + 5),
                _series("embedding_drift_threshold", drifted): constant(0.01, for_minutes + 5),
                _series("embedding_drift_score", steady): constant(0.005, for_minutes + 5),
                _series("embedding_drift_threshold", steady): constant(0.01, for_minutes + 5),
            },
            for_minutes * 60,
            [("EmbeddingDrift", [expected(rules.get("EmbeddingDrift"), drifted, 0.05)])],
        )
    ]


def _spot_histogram(
    labels: dict[str, str], per_bucket: dict[float, int], minutes: int
) -> dict[str, str]:
    """Bucket series of notice -> DRAINING; `per_bucket` maps an upper bound to observations a
    minute (the last bound gets +Inf too)."""
    out: dict[str, str] = {}
    cumulative = 0
    for bound in sorted(per_bucket):
        cumulative += per_bucket[bound]
        out[
            _series("llm_spot_notice_to_draining_seconds_bucket", {**labels, "le": number(bound)})
        ] = counter(cumulative, minutes)
    out[_series("llm_spot_notice_to_draining_seconds_bucket", {**labels, "le": "+Inf"})] = counter(
        cumulative, minutes
    )
    return out


def build_spot_cases(spec: Spec, rules: _Rules) -> list[Case]:
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
    slow = _spot_histogram(slow_labels, {target: 0, target * 2: 10}, minutes)
    fast = _spot_histogram(slow_labels, {target / 2: 10, target: 0}, minutes)
    aws, gcp = spot.notice_for("aws"), spot.notice_for("gcp")
    states: dict[str, str] = {}
    for node, state in (("a", "terminating"), ("b", "terminating"), ("c", "recovered")):
        for value in ("ready", "draining", "terminating", "recovered"):
            states[_series("llm_node_state", {"node": node, "state": value})] = constant(
                1 if value == state else 0, 20
            )
    latency = {
        _series("llm_spot_replacement_ready_latency_seconds", {"node": "a", "provider": "aws"}): (
            constant(aws + 30, 20)
        ),
        _series("llm_spot_replacement_ready_latency_seconds", {"node": "b", "provider": "gcp"}): (
            constant(gcp - 1, 20)
        ),
        _series("llm_spot_replacement_ready_latency_seconds", {"node": "c", "provider": "gcp"}): (
            constant(gcp * 10, 20)
        ),
    }
    pending = {
        _series("llm_spot_notice_pending", {"node": "spot-a", "provider": "gcp"}): constant(1, 20),
        _series("llm_spot_notice_pending", {"node": "spot-b", "provider": "aws"}): constant(0, 20),
    }
    notice_rule = rules.get("SpotPreemptionNotice")
    return [
        Case(
            "spot: a pending notice fires spot_drain, a handled one stays silent",
            pending,
            600,
            [
                (
                    "SpotPreemptionNotice",
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
                    "SpotNoticeToDrainingSlow",
                    [expected(rules.get("SpotNoticeToDrainingSlow"), {}, target * 1.95)],
                )
            ],
        ),
        Case(
            "spot: notice -> DRAINING p95 under its target stays silent",
            fast,
            eval_at,
            [("SpotNoticeToDrainingSlow", [])],
        ),
        Case(
            "spot: a replacement slower than the notice window fires; within it or recovered "
            "stays silent",
            {**states, **latency},
            600,
            [
                (
                    "SpotReplacementSlow",
                    [
                        expected(
                            rules.get("SpotReplacementSlow"),
                            {"node": "a", "provider": "aws"},
                            aws + 30,
                        )
                    ],
                )
            ],
        ),
    ]


def build_guard_cases(spec: Spec, rules: _Rules) -> list[Case]:
    """Absent SLIs page; present ones do not; a probe that stopped succeeding is stale."""
    minutes = math.ceil(spec.timing.absent_for_seconds / 60) + 5
    every_sli: dict[str, str] = {}
    for _, template in SLI_GUARDS:
        every_sli[template.format(request_duration=spec.sources.request_duration)] = constant(
            1, minutes
        )
    absent = [expected(rules.get("SLIAbsent", sli=sli), {}, 1) for sli, _ in sorted(SLI_GUARDS)]
    stale_after = spec.timing.probe_stale_after_seconds
    eval_at = minutes * 60
    return [
        Case(
            "absent guard: no SLI series at all pages for each",
            {},
            eval_at,
            [("SLIAbsent", absent)],
        ),
        Case("absent guard: every SLI present is silent", every_sli, eval_at, [("SLIAbsent", [])]),
        Case(
            "stale guard: a probe whose last success is old fires, a fresh one does not",
            {
                _series("redline_probe_last_success_timestamp_seconds", {"probe": "dead"}): (
                    constant(0, minutes)
                ),
                _series("redline_probe_last_success_timestamp_seconds", {"probe": "alive"}): (
                    f"0+{SERIES_INTERVAL}x{minutes}"
                ),
            },
            max(eval_at, math.ceil(stale_after / 60 + 1) * 60),
            [
                (
                    "SLIStale",
                    [
                        expected(
                            rules.get("SLIStale"),
                            {"probe": "dead"},
                            float(max(eval_at, math.ceil(stale_after / 60 + 1) * 60)),
                        )
                    ],
                )
            ],
        ),
        Case(
            "audit guard: a copy of the trail that no longer verifies pages, an intact one not",
            {
                _series("redline_audit_chain_intact", {"copy": "redis"}): constant(1, minutes),
                _series("redline_audit_chain_intact", {"copy": "file"}): constant(0, minutes),
            },
            eval_at,
            [("AuditChainBroken", [expected(rules.get("AuditChainBroken"), {"copy": "file"}, 0)])],
        ),
    ]


def build_rule_tests(spec: Spec, groups: list[RuleGroup], rule_files: list[str]) -> dict[str, Any]:
    """The promtool test file proving `groups` (in `rule_files`, relative to the test file)."""
    rules = _Rules(groups)
    cases = [
        *build_red_line_cases(spec, rules),
        *build_rpo_cases(spec, rules),
        *build_rollback_cases(spec, rules),
        *[case for slo in spec.slos for case in build_slo_cases(spec, rules, slo)],
        *build_drift_cases(spec, rules),
        *build_spot_cases(spec, rules),
        *build_guard_cases(spec, rules),
    ]
    return {
        "rule_files": rule_files,
        # Hour-long cases evaluated every second (the local profile) take minutes in promtool;
        # 15 s steps prove the same logic.
        "evaluation_interval": format_duration(max(spec.timing.evaluation_interval_seconds, 15)),
        "tests": [case.to_dict() for case in cases],
    }
