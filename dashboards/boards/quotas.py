"""The *Token quotas* dashboard: the gateway's semantic rate limiting (design notes 4.2).

Requests and estimated tokens by tenant, intent and outcome (admitted, throttled, downgraded,
unlimited), each tenant's throttled share against the alert's ratio, bucket utilisation, refunds,
the token estimator's error (p50/p95 of `llm_token_estimate_error_ratio`) and quota-store
failures (fail open or closed). Every series comes from the gateways; targets from the spec's
`quotas:`.
"""

from __future__ import annotations

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
)
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

SLUG = "quotas"
QUOTA_ALERTS = (Alert.QUOTA_THROTTLING_SUSTAINED,)


def _traffic(spec: Spec) -> Section:
    book = alert_runbook(spec, Alert.QUOTA_THROTTLING_SUSTAINED)
    requests = catalog.LLM_QUOTA_REQUESTS_TOTAL
    tokens = catalog.LLM_QUOTA_TOKENS_TOTAL
    ratio = spec.quotas.throttle_alert_ratio
    throttled = (
        f'sum by (tenant) (rate({requests}{{outcome="throttled"}}[$__rate_interval]))\n'
        # An idle tenant reads 0 (nothing throttled), not 0/0.
        f"/ clamp_min(sum by (tenant) (rate({requests}[$__rate_interval])), 1e-9)"
    )
    return Section(
        "Requests and tokens by tenant",
        (
            PanelDef(
                "timeseries",
                f"Throttled share by tenant (alert above {ratio:.0%} for "
                f"{spec.quotas.throttle_alert_for})",
                (Query(throttled, "{{tenant}}"),),
                book,
                "percentunit",
                bad_above(ratio),
                width=12,
            ),
            PanelDef(
                "timeseries",
                "Requests by tenant and outcome",
                (
                    Query(
                        f"sum by (tenant, outcome) (rate({requests}[$__rate_interval]))",
                        "{{tenant}} {{outcome}}",
                    ),
                ),
                book,
                "reqps",
                width=12,
            ),
            PanelDef(
                "timeseries",
                "Estimated tokens by intent and outcome",
                (
                    Query(
                        f"sum by (intent, outcome) (rate({tokens}[$__rate_interval]))",
                        "{{intent}} {{outcome}}",
                    ),
                ),
                book,
                "short",
                width=12,
            ),
            PanelDef(
                "timeseries",
                "Bucket utilisation by tenant and intent",
                (
                    Query(
                        f"max by (tenant, intent) ({catalog.LLM_QUOTA_UTILISATION_RATIO})",
                        "{{tenant}} {{intent}}",
                    ),
                ),
                book,
                "percentunit",
                bad_above(1.0),
                width=12,
            ),
        ),
    )


def _estimator(spec: Spec) -> Section:
    book = alert_runbook(spec, Alert.QUOTA_THROTTLING_SUSTAINED)
    bucket = catalog.LLM_TOKEN_ESTIMATE_ERROR_RATIO.bucket
    refunded = catalog.LLM_QUOTA_REFUNDED_TOKENS_TOTAL
    failures = catalog.LLM_QUOTA_STORE_FAILURES_TOTAL
    quantiles = tuple(
        Query(
            f"histogram_quantile({q}, sum by (le, kind) (rate({bucket}[$__rate_interval])))",
            f"p{round(q * 100)} {{{{kind}}}}",
        )
        for q in (0.5, 0.95)
    )
    return Section(
        "Token estimation and the quota store",
        (
            PanelDef(
                "timeseries",
                "Estimate error (estimate - actual) / actual",
                quantiles,
                book,
                "percentunit",
                width=12,
                description="Before generation vs the usage the upstream reported; prompt "
                "tokens alone and prompt + completion (total).",
            ),
            PanelDef(
                "timeseries",
                "Refunded tokens by intent",
                (Query(f"sum by (intent) (rate({refunded}[$__rate_interval]))", "{{intent}}"),),
                book,
                "short",
            ),
            PanelDef(
                "stat",
                f"Quota store failures ({spec.quotas.on_store_error})",
                (Query(f"sum by (action) (increase({failures}[$__range]))", "{{action}}"),),
                book,
                "short",
                bad_above(ANY_EVENT),
                stat_text="value_and_name",
            ),
        ),
    )


def build_quotas_definition(spec: Spec) -> DashboardDef:
    """The token quotas dashboard as data."""
    return DashboardDef(
        slug=SLUG,
        title="Token quotas",
        description=(
            "Semantic rate limiting in the gateway: requests and tokens per tenant and intent, "
            "throttling against the alert, bucket utilisation, refunds, the token estimator's "
            "error and quota-store failures."
        ),
        sections=(_traffic(spec), _estimator(spec)),
        annotations=alert_and_remediation_annotations(
            "Quota alerts", f'alertname=~"{"|".join(QUOTA_ALERTS)}"', "orange"
        ),
        variables=(),
    )


def build_quotas_dashboard(spec: Spec) -> Dashboard:
    """The token quotas dashboard."""
    return assemble(spec, build_quotas_definition(spec))
