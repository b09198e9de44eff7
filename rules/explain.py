"""`redline explain`: for each alert the rules raise, its exact condition, how long it takes to
fire on a total outage, and the slowest failure that still fires it.

The figures come from the numbers the rules are built from (the burn windows and their budget
fractions, the red lines' windows and thresholds, the spec's `for`s, the scrape and evaluation
intervals), so the table is the rules' own account of themselves:

- a burn-rate condition holds when both of its windows burn faster than `factor x budget`; with
  good traffic before a total outage, a window of length `W` burns that fast once the outage has
  lasted `factor x budget x W`, so a condition fires then (its long window decides) plus one
  scrape and one evaluation, and the alert fires at its fastest condition;
- a steady burn `r` times the budget's rate fires a condition when `r > factor`, after
  `factor / r x W`: the slowest burn that still fires is just over the smallest factor, and takes
  that condition's whole long window;
- the P99 red line fires once more than 1 - quantile of its window's requests are slow (with
  `min_requests` of them), held for its `for`;
- a threshold alert (an RPO, a staleness, a gauge) fires when its series passes the threshold,
  held for its `for`.
"""

from __future__ import annotations

from dataclasses import dataclass

from redline.rules.build import build_rule_groups
from redline.rules.families.slo import BURN_WINDOWS, burn_factor
from redline.rules.model import AlertRule, format_duration, number
from redline.slo.alerts import Alert
from redline.slo.spec import Slo, Spec, parse_duration


@dataclass(frozen=True)
class Explanation:
    """One alert rule: its name and severity, its condition, and when it fires."""

    alert: str
    severity: str
    condition: str
    outage_seconds: float | None
    """From the start of a total outage to the alert firing; None where no outage applies."""
    slowest: str
    """The slowest failure that still fires it, in words."""


def _pipeline(spec: Spec) -> float:
    """One scrape and one evaluation: the series must be scraped and the rule evaluated."""
    return spec.timing.scrape_interval_seconds + spec.timing.evaluation_interval_seconds


def _burn(spec: Spec, slo: Slo, rule: AlertRule) -> Explanation:
    period = parse_duration(slo.period)
    budget = 1 - slo.objective
    windows = [w for w in BURN_WINDOWS if w.severity == rule.labels["severity"]]
    pairs = [
        f"{number(burn_factor(w, period))}x over "
        f"{format_duration(w.long_seconds)}/{format_duration(w.short_seconds)}"
        for w in windows
    ]
    outage = min(burn_factor(w, period) * budget * w.long_seconds for w in windows)
    slowest = min(windows, key=lambda w: burn_factor(w, period))
    factor = burn_factor(slowest, period)
    guard = f", with >= {slo.min_events} events in the long window" if slo.min_events else ""
    return Explanation(
        rule.alert,
        rule.labels["severity"],
        f"bad share of {slo.name} over both windows above factor x {number(budget)}: "
        f"{' or '.join(pairs)}{guard}",
        outage + _pipeline(spec) + rule.for_seconds,
        f"a burn just over {number(factor)}x the budget's rate ({number(factor * budget * 100)} % "
        f"bad), after {format_duration(slowest.long_seconds)}",
    )


def _latency(spec: Spec, rule: AlertRule) -> Explanation:
    lat = spec.red_lines.latency_p99
    window = parse_duration(lat.window)
    share = 1 - lat.quantile
    evidence = f" over >= {lat.min_requests} requests" if lat.min_requests else ""
    return Explanation(
        rule.alert,
        rule.labels["severity"],
        f"P{number(lat.quantile * 100)} over {lat.window} above {number(lat.threshold_seconds)} s"
        f"{evidence}, for {format_duration(rule.for_seconds)}",
        share * window + _pipeline(spec) + rule.for_seconds,
        f"just over {number(share * 100)} % of the requests in {lat.window} slower than "
        f"{number(lat.threshold_seconds)} s, for {format_duration(rule.for_seconds)}",
    )


def _slow_requests(spec: Spec, rule: AlertRule) -> Explanation:
    lat = spec.red_lines.latency_p99
    return Explanation(
        rule.alert,
        rule.labels["severity"],
        f">= {lat.slow_requests_page} requests slower than {number(lat.threshold_seconds)} s in "
        f"{lat.window} while it holds fewer than {lat.min_requests}, "
        f"for {format_duration(rule.for_seconds)}",
        None,
        f"{lat.slow_requests_page} slow requests in {lat.window} at night-time traffic",
    )


def _gate(spec: Spec, rule: AlertRule) -> Explanation:
    gate = spec.rollback
    window = format_duration(gate.window_seconds)
    return Explanation(
        rule.alert,
        rule.labels["severity"],
        f"a version's P99 over {window} >= {number(1 + gate.p99_increase_ratio)} x its baseline "
        f"and its accuracy's Wilson upper bound more than {number(gate.accuracy_drop * 100)} "
        f"points under its baseline, over >= {gate.min_samples} requests and >= "
        f"{gate.min_eval_samples} verdicts, for {format_duration(rule.for_seconds)}",
        None,
        f"P99 just at +{number(gate.p99_increase_ratio * 100)} % and accuracy just over "
        f"{number(gate.accuracy_drop * 100)} points down, once {gate.min_samples} requests of the "
        "version are in the window",
    )


def _waits(spec: Spec) -> dict[str, float]:
    """Alerts on an age or a lag: how old it must get before the condition can hold."""
    rpo, red = spec.rpo, spec.red_lines
    return {
        Alert.RED_LINE_INDEX_STALENESS: red.index_consistency.max_staleness_seconds,
        Alert.LORA_CHECKPOINT_RPO_BREACH: rpo.lora_adapter.max_seconds,
        Alert.SESSION_RPO_BREACH: rpo.session_state.max_seconds,
        Alert.INDEX_DELTA_LOG_RPO_BREACH: rpo.embedding_index.max_seconds,
    }


def _threshold(spec: Spec, rule: AlertRule) -> Explanation:
    """Any other alert: its PromQL, held for its `for` (after the age it waits for, if any)."""
    expr = " ".join(rule.expr.split())
    wait = _waits(spec).get(rule.alert, 0.0)
    return Explanation(
        rule.alert,
        rule.labels["severity"],
        f"{expr}, for {format_duration(rule.for_seconds)}",
        wait + _pipeline(spec) + rule.for_seconds,
        f"the condition holding for {format_duration(rule.for_seconds)}",
    )


def build_explanations(spec: Spec) -> list[Explanation]:
    """Every alert rule of the spec, in rule-file order, explained."""
    burn = {slo.burn_alert_name: slo for slo in spec.slos}
    out = []
    for group in build_rule_groups(spec):
        for rule in group.alerts:
            if rule.alert in burn:
                out.append(_burn(spec, burn[rule.alert], rule))
            elif rule.alert == Alert.RED_LINE_LATENCY_P99:
                out.append(_latency(spec, rule))
            elif rule.alert == Alert.RED_LINE_LATENCY_SLOW_REQUESTS:
                out.append(_slow_requests(spec, rule))
            elif rule.alert == Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL:
                out.append(_gate(spec, rule))
            else:
                out.append(_threshold(spec, rule))
    return out


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


def render_explanations_markdown(explanations: list[Explanation]) -> str:
    """The explanations as a Markdown table (alert, severity, condition, outage, slowest)."""
    lines = [
        "| alert | severity | fires when | on a total outage | slowest failure that fires |",
        "|---|---|---|---|---|",
    ]
    for item in explanations:
        condition = item.condition.replace("|", "\\|")
        lines.append(
            f"| `{item.alert}` | {item.severity} | {condition} | "
            f"{_seconds(item.outage_seconds)} | {item.slowest} |"
        )
    return "\n".join(lines) + "\n"


__all__ = ["Explanation", "build_explanations", "render_explanations_markdown"]
