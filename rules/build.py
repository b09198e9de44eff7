"""Pure `build_*` functions: the spec in, Prometheus rule groups out.

Recording rules follow `level:metric:operations`. Every alert carries `severity`, `summary`,
`description`, `runbook_url`, and `playbook` where one applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from redline.rules.model import (
    AlertRule,
    RecordingRule,
    RuleGroup,
    format_duration,
    le_matcher,
    number,
    selector,
)
from redline.slo.spec import Slo, Spec, parse_duration

FLOAT_GUARD = 1e-9
"""Slack on the gate's comparisons: 0.9 - 0.892 is 0.008000000000000007 in binary floating point,
so without it an accuracy drop of exactly 0.8 points would fire and +15 % exactly might not."""


@dataclass(frozen=True)
class BurnWindow:
    """One multiwindow burn-rate condition: both windows must burn faster than `factor`."""

    long_seconds: int
    short_seconds: int
    budget_fraction: float  # share of the period's budget this burn consumes in `long`
    severity: str


BURN_WINDOWS = (
    BurnWindow(3600, 300, 0.02, "page"),  # 14.4x over 30d
    BurnWindow(6 * 3600, 1800, 0.05, "page"),  # 6x
    BurnWindow(86400, 7200, 0.10, "ticket"),  # 3x
    BurnWindow(3 * 86400, 6 * 3600, 0.10, "ticket"),  # 1x
)

SLI_GUARDS = (
    ("request_latency", "{request_duration}_count"),
    ("index_staleness", "vectordb_index_staleness_seconds"),
    ("delta_log", "vectordb_delta_log_oldest_pending_age_seconds"),
    ("session_rpo", "session_cdc_rpo_seconds"),
    # The TTL series appears on the probe's first run; the canary verdict only after
    # `min_seconds` (300 s), which would page for five minutes after every start.
    ("context_keepalive", "session_context_ttl_seconds"),
    ("lora_checkpoint", "model_checkpoint_last_success_timestamp_seconds"),
    ("model_versions", "model_active_info"),
    ("accuracy", "llm_eval_requests_total"),
    ("endpoint_probes", "llm_probe_success"),
    ("embedding_drift", "embedding_drift_score"),
)
"""Every SLI series the alerts read; an absent one means a dead exporter, which must page."""


def burn_factor(window: BurnWindow, period_seconds: float) -> float:
    """How many times faster than sustainable the budget burns in this condition."""
    return window.budget_fraction * period_seconds / window.long_seconds


def burn_rate_windows() -> list[int]:
    """Every rate window (seconds) the burn-rate alerts read, shortest first."""
    seconds = {w.long_seconds for w in BURN_WINDOWS} | {w.short_seconds for w in BURN_WINDOWS}
    return sorted(seconds)


def runbook(spec: Spec, alert: str) -> str:
    """The runbook URL of an alert."""
    return f"{spec.runbook_base_url.rstrip('/')}/{alert}"


def _alert(
    spec: Spec,
    name: str,
    expr: str,
    for_seconds: float,
    severity: str,
    summary: str,
    description: str,
    playbook: str | None = None,
    **labels: str,
) -> AlertRule:
    all_labels = {"severity": severity, **labels}
    if playbook:
        all_labels["playbook"] = playbook
    annotations = {
        "summary": summary,
        "description": description,
        "runbook_url": runbook(spec, name),
    }
    return AlertRule(name, expr, for_seconds, dict(sorted(all_labels.items())), annotations)


def p99_record(spec: Spec) -> str:
    """Name of the recorded per-region latency quantile (e.g. `...:p99_5m`)."""
    red = spec.red_lines.latency_p99
    quantile = number(red.quantile * 100).replace(".", "_")
    return f"redline:{spec.sources.request_duration}:p{quantile}_{red.window}"


def rollback_window(spec: Spec) -> str:
    """The rollback gate's window as a Prometheus duration."""
    return format_duration(spec.rollback.window_seconds)


def rollback_records(spec: Spec) -> dict[str, str]:
    """Names of the recorded series the two-signal gate compares."""
    window = rollback_window(spec)
    base = spec.sources.request_duration
    return {
        "p99": f"redline:{base}:p99_by_version_{window}",
        "accuracy": f"redline:llm_eval_accuracy:ratio_{window}",
        "requests": f"redline:{base}_count:increase_by_version_{window}",
    }


def build_sli_recordings(spec: Spec) -> RuleGroup:
    """Recording rules for the latency quantiles the red line and the rollback gate read."""
    red = spec.red_lines.latency_p99
    bucket = f"{spec.sources.request_duration}_bucket"
    count = f"{spec.sources.request_duration}_count"
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
            f"sum by ({by_version}) (increase(llm_eval_correct_total[{window}]))\n"
            f"/\nsum by ({by_version}) (increase(llm_eval_requests_total[{window}]))",
        ),
    )
    return RuleGroup("redline-sli-recordings", spec.timing.evaluation_interval_seconds, rules)


def slo_error_ratio_expr(spec: Spec, slo: Slo, window: str) -> str:
    """PromQL for an SLO's share of bad events over `window`."""
    match slo.sli.kind:
        case "slow_requests":
            base = spec.sources.request_duration
            good = selector(slo.sli.selector, le_matcher(slo.sli.threshold_seconds))
            total = selector(slo.sli.selector)
            return (
                f"1 - (\n  sum(rate({base}_bucket{good}[{window}]))\n  /\n"
                f"  sum(rate({base}_count{total}[{window}]))\n)"
            )
        case "errors":
            sel = selector(slo.sli.selector)
            return (
                f"sum(rate({spec.sources.errors_total}{sel}[{window}]))\n/\n"
                f"sum(rate({spec.sources.requests_total}{sel}[{window}]))"
            )


def error_ratio_record(window: str) -> str:
    """Name of the recorded share of bad events of every SLO over `window`."""
    return f"redline:slo_errors:ratio_rate{window}"


def build_slo_group(spec: Spec, slo: Slo) -> RuleGroup:
    """Error ratios over every burn window, budget bookkeeping and the burn-rate alerts."""
    period = parse_duration(slo.period)
    budget = 1 - slo.objective
    labels = {"slo": slo.name}
    rules: list[RecordingRule | AlertRule] = []
    for seconds in [*burn_rate_windows(), int(period)]:
        window = format_duration(seconds)
        expr = slo_error_ratio_expr(spec, slo, window)
        rules.append(RecordingRule(error_ratio_record(window), expr, labels))
    sel = selector(labels)
    rules.append(
        RecordingRule("redline:slo_objective:ratio", f"vector({number(slo.objective)})", labels)
    )
    rules.append(
        RecordingRule(
            "redline:slo_error_budget:remaining_ratio",
            f"1 - ({error_ratio_record(format_duration(period))}{sel} / {number(budget)})",
            labels,
        )
    )
    for severity in ("page", "ticket"):
        windows = [w for w in BURN_WINDOWS if w.severity == severity]
        conditions = []
        for w in windows:
            threshold = number(burn_factor(w, period) * budget)
            long_w, short_w = format_duration(w.long_seconds), format_duration(w.short_seconds)
            conditions.append(
                f"(\n  {error_ratio_record(long_w)}{sel} > {threshold}\n"
                f"  and\n  {error_ratio_record(short_w)}{sel} > {threshold}\n)"
            )
        pairs = ", ".join(
            f"{number(burn_factor(w, period))}x over "
            f"{format_duration(w.long_seconds)}/{format_duration(w.short_seconds)}"
            for w in windows
        )
        rules.append(
            _alert(
                spec,
                slo.burn_alert_name,
                "\nor\n".join(conditions),
                120 if severity == "page" else 900,
                severity,
                f"{slo.name} SLO is burning its {slo.period} error budget ({severity})",
                f"The {slo.name} SLO (objective {number(slo.objective * 100)} %) has "
                f"{{{{ $value | humanizePercentage }}}} bad events, burning its error budget "
                f"faster than {pairs}.",
                slo.playbook if severity == "page" else None,
                slo=slo.name,
            )
        )
    return RuleGroup(
        f"redline-slo-{slo.name}", spec.timing.evaluation_interval_seconds, tuple(rules)
    )


def build_red_line_alerts(spec: Spec) -> RuleGroup:
    """Instant alerts on the three SLA red lines (severity critical)."""
    red = spec.red_lines
    lat, keep, idx = red.latency_p99, red.context_keepalive, red.index_consistency
    quantile = f"P{number(lat.quantile * 100)}"
    short = format_duration(max(60.0, 4 * spec.timing.scrape_interval_seconds))
    reroute = "including cross-region reroutes " if lat.includes_reroute else ""
    rules = (
        _alert(
            spec,
            "RedLineLatencyP99",
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
        _alert(
            spec,
            "RedLineContextKeepalive",
            f"min(session_keepalive_probe_success) == 0\n"
            f"or\nmin(session_context_ttl_seconds) < {number(keep.min_seconds)}\n"
            f"or\nsum(increase(session_context_evicted_total[{short}])) > 0",
            keep.for_seconds,
            "critical",
            f"Conversation context is not kept alive for {number(keep.min_seconds)} s",
            f"A canary session died, session TTLs fell under {number(keep.min_seconds)} s, or "
            f"sessions were evicted before {number(keep.min_seconds)} s "
            f"(value {{{{ $value | humanize }}}}).",
            keep.playbook,
            red_line="context_keepalive",
        ),
        _alert(
            spec,
            "RedLineIndexStaleness",
            f"max by (collection, replica) (vectordb_index_staleness_seconds) "
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
    return RuleGroup("redline-red-lines", spec.timing.evaluation_interval_seconds, rules)


def build_rpo_alerts(spec: Spec) -> RuleGroup:
    """Alerts on the recovery-point objectives of adapters, sessions and the index delta log."""
    rpo = spec.rpo
    rules = (
        _alert(
            spec,
            "LoRACheckpointRPOBreach",
            f"time() - max by (adapter) (model_checkpoint_last_success_timestamp_seconds) "
            f"> {number(rpo.lora_adapter.max_seconds)}",
            rpo.lora_adapter.for_seconds,
            "critical",
            "LoRA adapter {{ $labels.adapter }} has no checkpoint within its RPO",
            f"The last successful checkpoint is {{{{ $value | humanizeDuration }}}} old "
            f"(RPO {number(rpo.lora_adapter.max_seconds)} s).",
            rpo.lora_adapter.playbook,
            rpo="lora_adapter",
        ),
        _alert(
            spec,
            "SessionRPOBreach",
            f"max by (stream, group) (session_cdc_rpo_seconds) "
            f"> {number(rpo.session_state.max_seconds)}",
            rpo.session_state.for_seconds,
            "critical",
            "Session CDC stream {{ $labels.stream }} lags its replica beyond the RPO",
            f"The oldest entry not ACKed by group {{{{ $labels.group }}}} is "
            f"{{{{ $value | humanize }}}}s old (RPO {number(rpo.session_state.max_seconds)} s).",
            rpo.session_state.playbook,
            rpo="session_state",
        ),
        _alert(
            spec,
            "IndexDeltaLogRPOBreach",
            f"max by (collection) (vectordb_delta_log_oldest_pending_age_seconds) "
            f"> {number(rpo.embedding_index.max_seconds)}",
            rpo.embedding_index.for_seconds,
            "critical",
            "Index delta log has entries older than the RPO not yet on the replica",
            f"The oldest pending delta-log entry is {{{{ $value | humanize }}}}s old "
            f"(RPO {number(rpo.embedding_index.max_seconds)} s).",
            rpo.embedding_index.playbook,
            rpo="embedding_index",
        ),
    )
    return RuleGroup("redline-rpo", spec.timing.evaluation_interval_seconds, rules)


def rollback_gate_expr(spec: Spec) -> str:
    """The two-signal gate: P99 up on baseline AND accuracy down, with enough requests."""
    gate = spec.rollback
    records = rollback_records(spec)
    on = "on (model, model_version)"
    by = "max by (model, model_version)"
    ratio = number(1 + gate.p99_increase_ratio)
    return (
        f"(\n  {records['p99']}\n  >= {on}\n"
        f"  ({ratio} * {by} (model_baseline_p99_seconds) - {FLOAT_GUARD})\n)\n"
        f"and {on}\n"
        f"(\n  {by} (model_baseline_accuracy_ratio) - {on} {records['accuracy']}\n"
        f"  > {number(gate.accuracy_drop)} + {FLOAT_GUARD}\n)\n"
        f"and {on}\n"
        f"(\n  {records['requests']} >= {gate.min_samples}\n)"
    )


def build_rollback_alerts(spec: Spec) -> RuleGroup:
    """The two-signal semantic-rollback gate."""
    gate = spec.rollback
    rule = _alert(
        spec,
        "SemanticRollbackTwoSignal",
        rollback_gate_expr(spec),
        gate.for_seconds,
        "critical",
        "Model {{ $labels.model }} version {{ $labels.model_version }} regressed on latency "
        "and accuracy",
        f"Over {rollback_window(spec)} with at least {gate.min_samples} requests, P99 is "
        f"{{{{ $value | humanize }}}}s, at least {number(gate.p99_increase_ratio * 100)} % over "
        f"the version's baseline, and accuracy fell more than "
        f"{number(gate.accuracy_drop * 100)} points: roll back to the last verified snapshot.",
        gate.playbook,
    )
    return RuleGroup("redline-rollback", spec.timing.evaluation_interval_seconds, (rule,))


def build_drift_alerts(spec: Spec) -> RuleGroup:
    """Embedding drift above the exporter's calibrated threshold."""
    on = "on (collection, method)"
    rule = _alert(
        spec,
        "EmbeddingDrift",
        f"max by (collection, method) (embedding_drift_score)\n> {on}\n"
        f"max by (collection, method) (embedding_drift_threshold)",
        spec.drift.for_seconds,
        "warning",
        "Embeddings of {{ $labels.collection }} drifted from the reference",
        "The {{ $labels.method }} drift score is {{ $value | humanize }}, above the calibrated "
        "threshold: retrieval quality may be degrading.",
    )
    return RuleGroup("redline-drift", spec.timing.evaluation_interval_seconds, (rule,))


def build_guard_alerts(spec: Spec) -> RuleGroup:
    """Absent and stale guards: a dead exporter or a stuck probe pages instead of going silent."""
    timing = spec.timing
    rules: list[AlertRule] = []
    for sli, template in SLI_GUARDS:
        series = template.format(request_duration=spec.sources.request_duration)
        rules.append(
            _alert(
                spec,
                "SLIAbsent",
                f"absent({series})",
                timing.absent_for_seconds,
                "page",
                f"SLI {sli} has no data",
                f"No series {series} for {format_duration(timing.absent_for_seconds)}: its "
                "exporter is down or not scraped, so its red line is not watched.",
                sli=sli,
            )
        )
    rules.append(
        _alert(
            spec,
            "SLIStale",
            f"time() - max by (probe) (redline_probe_last_success_timestamp_seconds) "
            f"> {number(timing.probe_stale_after_seconds)}",
            0,
            "page",
            "Probe {{ $labels.probe }} has not succeeded recently",
            f"The last success is {{{{ $value | humanizeDuration }}}} old (limit "
            f"{number(timing.probe_stale_after_seconds)} s): the values it publishes are stale.",
        )
    )
    # No playbook: a trail that no longer verifies is for people (the receiver records only).
    rules.append(
        _alert(
            spec,
            "AuditChainBroken",
            "min by (copy) (redline_audit_chain_intact) == 0",
            0,
            "page",
            "The remediation audit trail ({{ $labels.copy }}) no longer verifies",
            "A record was edited, removed, inserted or reordered, or the copies diverge: "
            "run `redline audit verify` to find the first bad record.",
        )
    )
    return RuleGroup("redline-guards", timing.evaluation_interval_seconds, tuple(rules))


def spot_p95_record(spec: Spec) -> str:
    """Name of the recorded fleet-wide p95 of notice -> DRAINING."""
    return f"redline:llm_spot_notice_to_draining_seconds:p95_{spec.spot.alert_window}"


def build_spot_alerts(spec: Spec) -> RuleGroup:
    """Spot preemption: an unhandled notice (runs spot_drain), notice -> DRAINING p95 over its
    target, and a replacement still not ready after a whole notice window."""
    spot = spec.spot
    window = spot.alert_window
    target = number(spot.notice_to_draining_p95_seconds)
    slow_replacement = "\nor\n".join(
        f'max by (node, provider) (llm_spot_replacement_ready_latency_seconds{{provider="{p}"}}) '
        f"> {number(spot.notice_for(p))}"
        for p in ("aws", "gcp")
    )
    rules = (
        RecordingRule(
            spot_p95_record(spec),
            "histogram_quantile(0.95, sum by (le) "
            f"(rate(llm_spot_notice_to_draining_seconds_bucket[{window}])))",
        ),
        _alert(
            spec,
            "SpotPreemptionNotice",
            "max by (node, provider) (llm_spot_notice_pending) == 1",
            0,
            "warning",
            "Spot node {{ $labels.node }} got an interruption notice that no drain handled yet",
            "The {{ $labels.provider }} node {{ $labels.node }} will be reclaimed: close its "
            "admission, triage what runs on it and wait for its replacement (the spot agent does "
            "this by itself; this alert runs the same flow when it did not).",
            spot.playbook,
        ),
        _alert(
            spec,
            "SpotNoticeToDrainingSlow",
            f"{spot_p95_record(spec)} > {target}",
            0,
            "ticket",
            "Spot nodes take too long from notice to DRAINING",
            f"The p95 from an interruption notice to DRAINING over {window} is "
            f"{{{{ $value | humanizeDuration }}}} (target {target} s): requests run on nodes "
            "that are about to go away.",
        ),
        _alert(
            spec,
            "SpotReplacementSlow",
            f"(\n{slow_replacement}\n)\nand on (node)\n"
            '(max by (node) (llm_node_state{state="terminating"}) == 1)',
            0,
            "page",
            "The replacement of spot node {{ $labels.node }} is not ready after a notice window",
            "The replacement of the {{ $labels.provider }} node {{ $labels.node }} has not passed "
            "the readiness gate (health, model loaded, dummy inference) "
            "{{ $value | humanizeDuration }} after its drain: capacity stays short for longer "
            "than the notice window.",
        ),
    )
    return RuleGroup("redline-spot", spec.timing.evaluation_interval_seconds, rules)


def build_rule_groups(spec: Spec) -> list[RuleGroup]:
    """Every rule group of the spec, in a stable order."""
    return [
        build_sli_recordings(spec),
        build_red_line_alerts(spec),
        build_rpo_alerts(spec),
        build_rollback_alerts(spec),
        *[build_slo_group(spec, slo) for slo in spec.slos],
        build_drift_alerts(spec),
        build_spot_alerts(spec),
        build_guard_alerts(spec),
    ]
