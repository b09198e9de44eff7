"""The gateway's token quotas: a tenant whose requests are throttled for a sustained time, and
the promtool cases that prove it."""

from __future__ import annotations

from redline.rules.common import alert_rule
from redline.rules.model import RuleGroup
from redline.rules.promtool_cases import AlertIndex, Case, counter, expected, series
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

WINDOW = "5m"


def throttled_ratio_expr() -> str:
    """Share of each tenant's requests the quotas rejected over `WINDOW`."""
    requests = catalog.LLM_QUOTA_REQUESTS_TOTAL
    return (
        f'sum by (tenant) (rate({requests}{{outcome="throttled"}}[{WINDOW}])) '
        f"/ sum by (tenant) (rate({requests}[{WINDOW}]))"
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """QuotaThrottlingSustained: a tenant's throttled share above `quotas.throttle_alert_ratio`
    for `quotas.throttle_alert_for`."""
    quotas = spec.quotas
    rule = alert_rule(
        spec,
        Alert.QUOTA_THROTTLING_SUSTAINED,
        f"{throttled_ratio_expr()} > {quotas.throttle_alert_ratio:g}",
        parse_duration(quotas.throttle_alert_for),
        "ticket",
        "Tenant {{ $labels.tenant }} is being throttled by its token quota",
        "{{ $value | humanizePercentage }} of tenant {{ $labels.tenant }}'s requests have been "
        f"rejected (429) by its token quotas for {quotas.throttle_alert_for} (alert above "
        f"{quotas.throttle_alert_ratio:.0%}). Its traffic outgrew its quota: raise the quota, "
        "move its overflow to `downgrade`, or tell the tenant; other tenants are not affected.",
    )
    return [RuleGroup("redline-quotas", spec.timing.evaluation_interval_seconds, (rule,))]


def _traffic(tenant: str, admitted: float, throttled: float, steps: int) -> dict[str, str]:
    name = catalog.LLM_QUOTA_REQUESTS_TOTAL
    return {
        series(name, {"tenant": tenant, "intent": "sql", "outcome": "admitted"}): counter(
            admitted, steps
        ),
        series(name, {"tenant": tenant, "intent": "sql", "outcome": "throttled"}): counter(
            throttled, steps
        ),
    }


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """A tenant throttled at half its requests past `throttle_alert_for` fires; one throttled
    below the ratio, and one throttled for less than the duration, stay silent."""
    after = parse_duration(spec.quotas.throttle_alert_for)
    steps = int(after // 60) + 10  # one sample a minute
    rule = alerts.get(Alert.QUOTA_THROTTLING_SUSTAINED)
    ratio = spec.quotas.throttle_alert_ratio
    low = ratio / 2  # throttled share well under the alert's
    name = catalog.LLM_QUOTA_REQUESTS_TOTAL
    recent_from = steps - int(after // 60) + 3  # throttled only for the last minutes
    recent = {
        series(name, {"tenant": "initech", "intent": "sql", "outcome": "admitted"}): (
            f"0+10x{steps}"
        ),
        series(name, {"tenant": "initech", "intent": "sql", "outcome": "throttled"}): (
            f"0+0x{recent_from} {0}+10x{steps - recent_from}"
        ),
    }
    return [
        Case(
            "quotas: a tenant throttled past throttle_alert_for fires; a lightly throttled one "
            "stays silent",
            {
                **_traffic("acme", 10, 10, steps),
                **_traffic("globex", 100 * (1 - low), 100 * low, steps),
            },
            steps * 60,
            [(Alert.QUOTA_THROTTLING_SUSTAINED, [expected(rule, {"tenant": "acme"}, 0.5)])],
        ),
        Case(
            "quotas: throttling for less than throttle_alert_for stays silent",
            recent,
            steps * 60,
            [(Alert.QUOTA_THROTTLING_SUSTAINED, [])],
        ),
    ]
