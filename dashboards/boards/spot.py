"""The *Spot preemption* dashboard: notice -> DRAINING time against its p95 target, in-flight
triage (aborted share, interrupted requests, wasted decode tokens), node states and the
replacement readiness latency against each provider's notice window, and the recovery of GPU
nodes drained on an XID (`gpu_node_failure`: the same drain), cold against warm.

The spot agent publishes the node series (`llm_node_state`, the notice histogram, replacement
latency, pending notices), the gateways the triage series, the remediation receiver the GPU
recovery histogram; targets come from the spec's `spot:`.
"""

from __future__ import annotations

from typing import Any

from grafanalib.core import Dashboard

from redline.dashboards.panels import (
    ANY_EVENT,
    DashboardDef,
    PanelDef,
    Query,
    Section,
    alert_and_remediation_annotations,
    alert_runbook,
    assemble,
    bad_above,
    two_state_mapping,
)
from redline.rules.model import number
from redline.rules.records import spot_p95_record
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

SLUG = "spot"
SPOT_ALERTS = (
    Alert.SPOT_PREEMPTION_NOTICE,
    Alert.SPOT_NOTICE_TO_DRAINING_SLOW,
    Alert.SPOT_REPLACEMENT_SLOW,
)
NODE_STATES = ("ready", "draining", "terminating", "recovered")
"""`llm_node_state`'s `state` values in state-machine order (the panel's value is the index);
the dashboards layer sits below `redline.platform.spot`, so they are listed, not imported."""
NODE_STATE_COLORS = ("green", "orange", "red", "blue")
PENDING = two_state_mapping(("handled", "green"), ("pending", "red"))

ZERO = 'or label_replace(vector(0), "reason", "none", "", "")'
"""Fallback of the wasted-token queries: one series `reason="none"` at 0."""


def _state_mapping() -> tuple[dict[str, Any], ...]:
    options = {
        str(index): {"text": state, "color": color, "index": index}
        for index, (state, color) in enumerate(zip(NODE_STATES, NODE_STATE_COLORS, strict=True))
    }
    return ({"type": "value", "options": options},)


def _state_index_expr() -> str:
    """One value per node: the index of its current state in `NODE_STATES`."""
    return "\n+ ".join(
        f'{index} * max by (node) ({catalog.LLM_NODE_STATE}{{state="{state}"}})'
        for index, state in enumerate(NODE_STATES)
    )


def _notice(spec: Spec) -> Section:
    book = alert_runbook(spec, Alert.SPOT_NOTICE_TO_DRAINING_SLOW)
    notice_book = alert_runbook(spec, Alert.SPOT_PREEMPTION_NOTICE)
    target = spec.spot.notice_to_draining_p95_seconds
    window = spec.spot.alert_window
    bucket = catalog.LLM_SPOT_NOTICE_TO_DRAINING_SECONDS.bucket
    per_provider = Query(
        f"histogram_quantile(0.95, sum by (le, provider) (rate({bucket}[$__rate_interval])))",
        "p95 {{provider}}",
    )
    steps = bad_above(target)
    return Section(
        "Notice → DRAINING",
        (
            PanelDef(
                "stat",
                f"Notice → DRAINING p95 over {window} (target {number(target)} s)",
                (Query(f"max({spot_p95_record(spec)})", "p95"),),
                book,
                "s",
                steps,
            ),
            PanelDef(
                "timeseries",
                f"Notice → DRAINING p95 by provider (target {number(target)} s)",
                (per_provider,),
                book,
                "s",
                steps,
                width=12,
            ),
            PanelDef(
                "state",
                "Notice not yet handled",
                (
                    Query(
                        f"max by (node, provider) ({catalog.LLM_SPOT_NOTICE_PENDING})", "{{node}}"
                    ),
                ),
                notice_book,
                mappings=PENDING,
            ),
        ),
    )


def _triage(spec: Spec) -> Section:
    book = alert_runbook(spec, Alert.SPOT_PREEMPTION_NOTICE)
    interrupted = catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL
    wasted = catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL
    aborted = catalog.LLM_SPOT_INFLIGHT_ABORTED_RATIO
    triaged = catalog.LLM_SPOT_TRIAGED_REQUESTS_TOTAL
    # A gateway that never wasted a token has no series (the counter is labelled by reason, and
    # reasons appear when they happen): the target is 0, so show 0 rather than "No data".
    return Section(
        "In-flight triage",
        (
            PanelDef(
                "stat",
                "Non-recoverable interruptions (target 0)",
                (Query(f'sum(increase({interrupted}{{recoverable="false"}}[$__range]))', ""),),
                book,
                "short",
                bad_above(ANY_EVENT),
            ),
            PanelDef(
                "timeseries",
                "Interrupted requests by recoverability",
                (
                    Query(
                        f"sum by (recoverable) (increase({interrupted}[$__rate_interval]))",
                        "recoverable={{recoverable}}",
                    ),
                ),
                book,
                "short",
                bars=True,
            ),
            PanelDef(
                "timeseries",
                "In-flight share aborted by the last drain",
                (Query(f"max by (node) ({aborted})", "{{node}}"),),
                book,
                "percentunit",
            ),
            PanelDef(
                "stat",
                "Wasted decode tokens",
                (Query(f"sum by (reason) (increase({wasted}[$__range]))\n{ZERO}", "{{reason}}"),),
                book,
                "short",
                stat_text="value_and_name",
            ),
            PanelDef(
                "timeseries",
                "Wasted decode tokens by reason",
                (
                    Query(
                        f"sum by (reason) (increase({wasted}[$__rate_interval]))\n{ZERO}",
                        "{{reason}}",
                    ),
                ),
                book,
                "short",
                bars=True,
                width=12,
            ),
            PanelDef(
                "timeseries",
                "Triage decisions",
                (
                    Query(
                        f"sum by (decision) (increase({triaged}[$__rate_interval]))",
                        "{{decision}}",
                    ),
                ),
                book,
                "short",
                bars=True,
                width=12,
            ),
        ),
    )


def _replacement(spec: Spec) -> Section:
    book = alert_runbook(spec, Alert.SPOT_REPLACEMENT_SLOW)
    panels: list[PanelDef] = [
        PanelDef(
            "state",
            "Node state",
            (Query(_state_index_expr(), "{{node}}"),),
            book,
            mappings=_state_mapping(),
            width=24,
        )
    ]
    latency = catalog.LLM_SPOT_REPLACEMENT_READY_LATENCY_SECONDS
    for provider in spec.spot.notice_seconds.model_dump():
        notice = spec.spot.notice_for(provider)
        title = f"Replacement ready latency, {provider} (notice {number(notice)} s)"
        selector = f'{latency}{{provider="{provider}"}}'
        steps = bad_above(notice)
        panels += [
            PanelDef("stat", title, (Query(f"max({selector})", "slowest"),), book, "s", steps),
            PanelDef(
                "timeseries",
                title,
                (Query(f"max by (node) ({selector})", "{{node}}"),),
                book,
                "s",
                steps,
                width=18,
            ),
        ]
    return Section("Node state and replacement readiness", tuple(panels))


def _gpu_recovery(spec: Spec) -> Section:
    # Recoveries are rare: counted over the dashboard's range, not per rate interval.
    book = alert_runbook(spec, Alert.GPU_XID_CRITICAL)
    recovery = catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS
    mode = catalog.LABEL_RECOVERY_MODE
    legend = f"{{{{{mode}}}}}"
    quantile = (
        f"histogram_quantile(0.95, sum by (le, {mode}) (increase({recovery.bucket}[$__range])))"
    )
    return Section(
        "GPU node failure recovery (cold: pod rebuilt; warm: replacement already loaded)",
        (
            PanelDef(
                "stat",
                "GPU node recoveries by mode",
                (Query(f"sum by ({mode}) (increase({recovery.count}[$__range]))", legend),),
                book,
                "short",
                stat_text="value_and_name",
            ),
            PanelDef(
                "stat",
                "GPU node recovery p95 by mode (drain start → readiness gate)",
                (Query(quantile, legend),),
                book,
                "s",
                stat_text="value_and_name",
                width=12,
            ),
        ),
    )


def build_spot_definition(spec: Spec) -> DashboardDef:
    """The spot preemption dashboard as data."""
    alerts = "|".join(SPOT_ALERTS)
    return DashboardDef(
        slug=SLUG,
        title="Spot preemption",
        description=(
            "Spot GPU preemption: how fast a notice closes admission, what the drain aborts and "
            "wastes, and how long a replacement takes against the provider's notice window."
        ),
        sections=(_notice(spec), _triage(spec), _replacement(spec), _gpu_recovery(spec)),
        annotations=alert_and_remediation_annotations(
            "Spot alerts", f'alertname=~"{alerts}"', "orange"
        ),
        variables=(),
    )


def build_spot_dashboard(spec: Spec) -> Dashboard:
    """The spot preemption dashboard."""
    return assemble(spec, build_spot_definition(spec))
