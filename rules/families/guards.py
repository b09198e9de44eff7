"""Guards that turn silence into a page: an absent SLI series (dead exporter), a stale probe,
the CRDT session series gone while their probe runs, and a remediation audit trail that no
longer verifies; and the promtool cases that prove them."""

from __future__ import annotations

import math

from redline.rules.common import alert_rule
from redline.rules.model import AlertRule, RuleGroup, format_duration, number
from redline.rules.promtool_cases import (
    SERIES_INTERVAL,
    AlertIndex,
    Case,
    constant,
    expected,
    series,
)
from redline.rules.records import request_duration
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec


def guarded_series(spec: Spec) -> tuple[tuple[str, str], ...]:
    """(SLI, series) for every SLI series the alerts read: an absent one means a dead exporter,
    which must page."""
    return (
        ("request_latency", f"{request_duration(spec)}_count"),
        ("index_staleness", catalog.VECTORDB_INDEX_STALENESS_SECONDS.name),
        ("delta_log", catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.name),
        ("session_rpo", catalog.SESSION_CDC_RPO_SECONDS.name),
        # The TTL series appears on the probe's first run; the canary verdict only after
        # `min_seconds` (300 s), which would page for five minutes after every start.
        ("context_keepalive", catalog.SESSION_CONTEXT_TTL_SECONDS.name),
        ("lora_checkpoint", catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS.name),
        ("model_versions", catalog.MODEL_ACTIVE_INFO.name),
        ("accuracy", catalog.LLM_EVAL_REQUESTS_TOTAL.name),
        ("endpoint_probes", catalog.LLM_PROBE_SUCCESS.name),
        ("embedding_drift", catalog.EMBEDDING_DRIFT_SCORE.name),
    )


CRDT_SERIES = (
    catalog.SESSION_CRDT_SYNC_LAG_SECONDS,
    catalog.SESSION_CRDT_DIVERGENT_SESSIONS,
    catalog.SESSION_CRDT_CONVERGENCE_SECONDS,
)
"""The CRDT session probe's series: the sync RPO and divergence alerts read them."""


def crdt_guard_expr() -> str:
    """Some CRDT session series is absent while the CRDT probe is deployed (its probe health
    series exists). A failed or hung run drops its gauges, so stale values show up as absent
    ones; a deployment without CRDT sync (no such probe) stays silent, unlike `SLIAbsent`."""
    absent = " or ".join(f"absent({metric})" for metric in CRDT_SERIES)
    probe = series(catalog.REDLINE_PROBE_SUCCESS, {catalog.LABEL_PROBE: catalog.PROBE_SESSION_CRDT})
    return f"({absent}) and on() count({probe})"


def build_rules(spec: Spec) -> list[RuleGroup]:
    """Absent and stale guards: a dead exporter or a stuck probe pages instead of going silent."""
    timing = spec.timing
    rules: list[AlertRule] = []
    for sli, name in guarded_series(spec):
        rules.append(
            alert_rule(
                spec,
                Alert.SLI_ABSENT,
                f"absent({name})",
                timing.absent_for_seconds,
                "page",
                f"SLI {sli} has no data",
                f"No series {name} for {format_duration(timing.absent_for_seconds)}: its "
                "exporter is down or not scraped, so its red line is not watched.",
                sli=sli,
            )
        )
    rules.append(
        alert_rule(
            spec,
            Alert.SLI_STALE,
            f"time() - max by (probe) ({catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS}) "
            f"> {number(timing.probe_stale_after_seconds)}",
            0,
            "page",
            "Probe {{ $labels.probe }} has not succeeded recently",
            f"The last success is {{{{ $value | humanizeDuration }}}} old (limit "
            f"{number(timing.probe_stale_after_seconds)} s): the values it publishes are stale.",
        )
    )
    rules.append(
        alert_rule(
            spec,
            Alert.SESSION_CRDT_SIGNALS_ABSENT,
            crdt_guard_expr(),
            timing.absent_for_seconds,
            "page",
            "The CRDT session probe runs but publishes no sync lag or divergence",
            f"For {format_duration(timing.absent_for_seconds)} the session_crdt probe has been "
            "failing (a region's session Redis unreachable, a hung run): the CRDT sync RPO and "
            "divergence between the regions are not watched. Check the exporter's /healthz.",
        )
    )
    # No playbook: a trail that no longer verifies is for people (the receiver records only).
    rules.append(
        alert_rule(
            spec,
            Alert.AUDIT_CHAIN_BROKEN,
            f"min by (copy) ({catalog.REDLINE_AUDIT_CHAIN_INTACT}) == 0",
            0,
            "page",
            "The remediation audit trail ({{ $labels.copy }}) no longer verifies",
            "A record was edited, removed, inserted or reordered, or the copies diverge: "
            "run `redline audit verify` to find the first bad record.",
        )
    )
    return [RuleGroup("redline-guards", timing.evaluation_interval_seconds, tuple(rules))]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Absent SLIs page, present ones do not; a probe that stopped succeeding is stale; a copy
    of the audit trail that no longer verifies pages."""
    minutes = math.ceil(spec.timing.absent_for_seconds / 60) + 5
    guarded = guarded_series(spec)
    every_sli = {name: constant(1, minutes) for _, name in guarded}
    absent = [expected(alerts.get(Alert.SLI_ABSENT, sli=sli), {}, 1) for sli, _ in sorted(guarded)]
    stale_after = spec.timing.probe_stale_after_seconds
    eval_at = minutes * 60
    last_success = catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS
    crdt_probe = series(catalog.REDLINE_PROBE_SUCCESS, {"probe": catalog.PROBE_SESSION_CRDT})
    lag = series(
        catalog.SESSION_CRDT_SYNC_LAG_SECONDS, {"source_region": "eu", "target_region": "us"}
    )
    crdt_present = {series(metric): constant(0, minutes) for metric in CRDT_SERIES[1:]}
    crdt_alert = [expected(alerts.get(Alert.SESSION_CRDT_SIGNALS_ABSENT), {}, 1)]
    return [
        Case(
            "CRDT guard: the probe runs and fails (its gauges dropped) pages",
            {crdt_probe: constant(0, minutes)},
            eval_at,
            [(Alert.SESSION_CRDT_SIGNALS_ABSENT, crdt_alert)],
        ),
        Case(
            "CRDT guard: one CRDT series missing while the others are there pages",
            {crdt_probe: constant(1, minutes), **crdt_present},
            eval_at,
            [(Alert.SESSION_CRDT_SIGNALS_ABSENT, crdt_alert)],
        ),
        Case(
            "CRDT guard: every CRDT series present is silent",
            {crdt_probe: constant(1, minutes), lag: constant(0, minutes), **crdt_present},
            eval_at,
            [(Alert.SESSION_CRDT_SIGNALS_ABSENT, [])],
        ),
        Case(
            "CRDT guard: no CRDT probe deployed (one region) is silent",
            every_sli,
            eval_at,
            [(Alert.SESSION_CRDT_SIGNALS_ABSENT, [])],
        ),
        Case(
            "absent guard: no SLI series at all pages for each",
            {},
            eval_at,
            [(Alert.SLI_ABSENT, absent)],
        ),
        Case(
            "absent guard: every SLI present is silent",
            every_sli,
            eval_at,
            [(Alert.SLI_ABSENT, [])],
        ),
        Case(
            "stale guard: a probe whose last success is old fires, a fresh one does not",
            {
                series(last_success, {"probe": "dead"}): (constant(0, minutes)),
                series(last_success, {"probe": "alive"}): (f"0+{SERIES_INTERVAL}x{minutes}"),
            },
            max(eval_at, math.ceil(stale_after / 60 + 1) * 60),
            [
                (
                    Alert.SLI_STALE,
                    [
                        expected(
                            alerts.get(Alert.SLI_STALE),
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
                series(catalog.REDLINE_AUDIT_CHAIN_INTACT, {"copy": "redis"}): constant(1, minutes),
                series(catalog.REDLINE_AUDIT_CHAIN_INTACT, {"copy": "file"}): constant(0, minutes),
            },
            eval_at,
            [
                (
                    Alert.AUDIT_CHAIN_BROKEN,
                    [expected(alerts.get(Alert.AUDIT_CHAIN_BROKEN), {"copy": "file"}, 0)],
                )
            ],
        ),
    ]
