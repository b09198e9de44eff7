"""The gateway's circuit breakers: a region whose breaker has not closed for `alert_after`
(open, or half-open probes failing again and again), and the promtool cases that prove it."""

from __future__ import annotations

from redline.rules.common import alert_rule
from redline.rules.model import RuleGroup
from redline.rules.promtool_cases import AlertIndex, Case, constant, expected, series
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

STATES = ("closed", "open", "half_open")


def build_rules(spec: Spec) -> list[RuleGroup]:
    """GatewayBreakerOpen: some gateway has not had the region's breaker closed for
    `breakers.alert_after` (the closed gauge at 0 spans open and half-open flapping)."""
    breakers = spec.breakers
    state = catalog.LLM_GATEWAY_BREAKER_STATE
    rule = alert_rule(
        spec,
        Alert.GATEWAY_BREAKER_OPEN,
        f'min by (region) ({state}{{state="closed"}}) == 0',
        parse_duration(breakers.alert_after),
        "page",
        "The gateway's circuit breaker for region {{ $labels.region }} has stayed open",
        f"The breaker of {{{{ $labels.region }}}} has not closed for {breakers.alert_after}: "
        "its upstream keeps failing (error rate over "
        f"{breakers.error_rate:.0%} or P99 over {breakers.p99_seconds:g} s) and every half-open "
        "probe failed, so the gateway sends its traffic to the other regions (or to it only when "
        "no other is left). Their capacity carries the whole load: fix or drain the region.",
    )
    return [RuleGroup("redline-breakers", spec.timing.evaluation_interval_seconds, (rule,))]


def _states(region: str, current: str, steps: int) -> dict[str, str]:
    return {
        series(catalog.LLM_GATEWAY_BREAKER_STATE, {"region": region, "state": s}): constant(
            1 if s == current else 0, steps
        )
        for s in STATES
    }


def _flapping(region: str, steps: int) -> dict[str, str]:
    """Open and half-open by turns (probes keep failing): never closed."""
    open_values = " ".join("1" if i % 2 == 0 else "0" for i in range(steps + 1))
    half_values = " ".join("0" if i % 2 == 0 else "1" for i in range(steps + 1))
    name = catalog.LLM_GATEWAY_BREAKER_STATE
    return {
        series(name, {"region": region, "state": "closed"}): constant(0, steps),
        series(name, {"region": region, "state": "open"}): open_values,
        series(name, {"region": region, "state": "half_open"}): half_values,
    }


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """A breaker open (or flapping open/half-open) past alert_after fires; a closed one and one
    open for less than alert_after stay silent."""
    after = parse_duration(spec.breakers.alert_after)
    steps = int(after // 60) + 10  # one sample a minute (the cases' interval)
    rule = alerts.get(Alert.GATEWAY_BREAKER_OPEN)
    stuck = {**_states("primary", "open", steps), **_flapping("secondary", steps)}
    # Open only for the last minutes: closed until then.
    recent_steps = steps - int(after // 60) + 2
    name = catalog.LLM_GATEWAY_BREAKER_STATE
    recent = {
        series(name, {"region": "primary", "state": "closed"}): (
            f"1x{recent_steps} " + " ".join("0" for _ in range(steps - recent_steps))
        ),
        series(name, {"region": "primary", "state": "open"}): (
            f"0x{recent_steps} " + " ".join("1" for _ in range(steps - recent_steps))
        ),
        series(name, {"region": "primary", "state": "half_open"}): constant(0, steps),
        **_states("secondary", "closed", steps),
    }
    eval_at = steps * 60
    return [
        Case(
            "breakers: open (or open/half-open by turns) past alert_after fires",
            stuck,
            eval_at,
            [
                (
                    Alert.GATEWAY_BREAKER_OPEN,
                    [
                        expected(rule, {"region": "primary"}, 0),
                        expected(rule, {"region": "secondary"}, 0),
                    ],
                )
            ],
        ),
        Case(
            "breakers: closed, or open for less than alert_after, stays silent",
            recent,
            eval_at,
            [(Alert.GATEWAY_BREAKER_OPEN, [])],
        ),
    ]
