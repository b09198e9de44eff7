"""The engine's saturation, read as a leading indicator of a latency breach (engine profiles).

A serving engine saturates before its latency breaks: requests start to wait. The profile names
the engine's own saturation series (`SourceProfile.saturation`, from the engine's code); this
family records them by region — requests waiting and running, the P99 wait, the fullest KV
cache, preemptions per second — and raises `EngineSaturationRising` (a ticket, no playbook)
when one of three conditions holds:

- the queue held requests at every sample of `saturation.window` and still grows: arrivals
  outpace the engine, so every request waits longer than the one before (a queue that empties
  now and then, or holds steady, is the engine at work, not a trend);
- the P99 wait alone takes more than `queue_time_share` of the latency red line;
- the KV cache is at least `kv_cache_usage` full while the engine preempts requests (it evicts
  and recomputes them: their latency grows by their prefill).

redline's gateway sees no engine queue, so with it (the default spec) the family writes nothing.
Each condition is left out where the profile lacks its series (TGI has no KV-cache gauge, NIM 1.x
no queue-time histogram), and `redline validate` lists what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping

from redline.rules.common import alert_rule
from redline.rules.model import AlertRule, RecordingRule, RuleGroup, number
from redline.rules.promtool_cases import (
    AlertIndex,
    Case,
    case_eval_step,
    constant,
    counter,
    engine_labels,
    expected,
    series,
)
from redline.rules.signals import indent, saturation
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

GROUP = "redline-saturation"
BY = (catalog.LABEL_REGION,)


def _window(spec: Spec) -> str:
    return spec.red_lines.latency_p99.window


def saturation_records(spec: Spec) -> dict[str, str]:
    """Record name -> expression, for the saturation signals the spec's source has."""
    window = _window(spec)
    exprs = {
        catalog.ENGINE_QUEUE_RECORD: saturation(spec, "queue", BY, window),
        catalog.ENGINE_RUNNING_RECORD: saturation(spec, "running", BY, window),
        catalog.ENGINE_KV_CACHE_RECORD: saturation(spec, "kv_cache", BY, window, op="max"),
        catalog.engine_preemptions_record(window): saturation(spec, "preemptions", BY, window),
    }
    buckets = saturation(spec, "queue_time", BY, window)
    if buckets is not None:
        exprs[catalog.engine_queue_time_record(window)] = (
            f"histogram_quantile(\n  0.99,\n{indent(buckets)}\n)"
        )
    return {name: expr for name, expr in exprs.items() if expr is not None}


def saturation_expr(spec: Spec, records: Mapping[str, str]) -> str | None:
    """The EngineSaturationRising condition over the recorded signals (`saturation_records`);
    None when the profile has none of them."""
    red = spec.red_lines.latency_p99
    warn = red.saturation
    window = _window(spec)
    terms = []
    queue = catalog.ENGINE_QUEUE_RECORD
    if queue in records:
        terms.append(
            f"min_over_time({queue}[{warn.window}]) > 0\nand\nderiv({queue}[{warn.window}]) > 0"
        )
    wait = catalog.engine_queue_time_record(window)
    if wait in records:
        terms.append(f"{wait} > {number(warn.queue_time_share * red.threshold_seconds)}")
    kv, preempted = catalog.ENGINE_KV_CACHE_RECORD, catalog.engine_preemptions_record(window)
    if kv in records and preempted in records:
        terms.append(f"{kv} >= {number(warn.kv_cache_usage)}\nand on (region)\n{preempted} > 0")
    if not terms:
        return None
    return "\nor\n".join(f"(\n{indent(term)}\n)" for term in terms)


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The `redline-saturation` group: the recorded signals and EngineSaturationRising; none
    for a source without saturation series (redline's gateway)."""
    exprs = saturation_records(spec)
    expr = saturation_expr(spec, exprs)
    if expr is None:
        return []
    red = spec.red_lines.latency_p99
    warn = red.saturation
    records = [RecordingRule(name, record) for name, record in exprs.items()]
    alert = alert_rule(
        spec,
        Alert.ENGINE_SATURATION_RISING,
        expr,
        0,
        Alert.ENGINE_SATURATION_RISING.severity,
        "The engines of {{ $labels.region }} are saturating",
        "The engines of {{ $labels.region }} are saturating before their P99 breaches "
        f"{red.threshold_seconds:g} s: their queue held requests for {warn.window} and still "
        f"grows, their P99 wait exceeds {warn.queue_time_share:.0%} of the red line, or a KV "
        f"cache at least {warn.kv_cache_usage:.0%} full preempts requests. Add capacity or shed "
        "load now: the latency red line follows.",
    )
    rules: tuple[RecordingRule | AlertRule, ...] = (*records, alert)
    return [RuleGroup(GROUP, spec.timing.evaluation_interval_seconds, rules)]


def _gauge(spec: Spec, signal: str, region: str, values: str) -> dict[str, str]:
    found = spec.sources.resolve().profile.saturation.get(signal)
    if found is None:
        return {}
    labels = engine_labels(spec, {catalog.LABEL_REGION: region})
    return {series(found.names[0], labels): values}


def _waits(spec: Spec, region: str, slow: bool, steps: int) -> dict[str, str]:
    """The queue-time histogram: every request waiting about 1 s (slow) or under 0.1 s."""
    found = spec.sources.resolve().profile.saturation.get("queue_time")
    if found is None:
        return {}
    labels = engine_labels(spec, {catalog.LABEL_REGION: region})
    base = f"{found.names[0]}_bucket"
    per_step = {"0.1": 0 if slow else 10, "1": 10, "+Inf": 10}
    return {series(base, {**labels, "le": le}): counter(n, steps) for le, n in per_step.items()}


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """A queue growing for the window fires at the first evaluation its samples are all
    non-empty, and not one before; a steady queue, one that empties, short waits and a full KV
    cache that preempts nothing stay silent; long waits, and a full cache preempting, fire."""
    records = saturation_records(spec)
    if saturation_expr(spec, records) is None:
        return []
    rule = alerts.get(Alert.ENGINE_SATURATION_RISING)
    red = spec.red_lines.latency_p99
    window = int(parse_duration(red.saturation.window) // 60)  # samples are a minute apart
    steps = window + 12
    cases: list[Case] = []
    if catalog.ENGINE_QUEUE_RECORD in records:
        # empty until minute 5, then 1, 2, 3 ... waiting from minute 6: the window's samples
        # are all non-empty from minute 6 + window on (Prometheus 2's ranges include both ends)
        growing = f"0x5 1+1x{steps - 6}"
        # the same queue, but empty once inside the window the alert is first evaluated over
        dipped = [0] * 6 + list(range(1, steps - 4))
        dipped[6 + window // 2] = 0
        quiet = {
            **_gauge(spec, "queue", "steady", constant(4, steps)),
            **_gauge(spec, "queue", "emptying", " ".join(map(str, dipped))),
            **_waits(spec, "steady", False, steps),
            **_waits(spec, "emptying", False, steps),
        }
        first = (6 + window) * 60
        before = first - int(case_eval_step(spec))
        cases.append(
            Case(
                f"{Alert.ENGINE_SATURATION_RISING}: a queue that never empties and keeps growing "
                "fires at the first evaluation its window holds only waiting requests",
                {
                    **_gauge(spec, "queue", "primary", growing),
                    **_waits(spec, "primary", False, steps),
                    **quiet,
                },
                first,
                [(Alert.ENGINE_SATURATION_RISING, [expected(rule, {"region": "primary"}, 1)])],
                earlier=[(before, Alert.ENGINE_SATURATION_RISING, [])],
            )
        )
    if catalog.engine_queue_time_record(red.window) in records:
        cases.append(
            Case(
                f"{Alert.ENGINE_SATURATION_RISING}: waits over the red line's share fire, short "
                "ones do not",
                {
                    **_gauge(spec, "queue", "primary", constant(0, steps)),
                    **_waits(spec, "primary", True, steps),
                    **_gauge(spec, "queue", "secondary", constant(0, steps)),
                    **_waits(spec, "secondary", False, steps),
                },
                steps * 60,
                [(Alert.ENGINE_SATURATION_RISING, [expected(rule, {"region": "primary"}, 0)])],
            )
        )
    kv, preempted = catalog.ENGINE_KV_CACHE_RECORD, catalog.engine_preemptions_record(red.window)
    if kv in records and preempted in records:
        full = constant(red.saturation.kv_cache_usage, steps)
        cases.append(
            Case(
                f"{Alert.ENGINE_SATURATION_RISING}: a full KV cache fires only while the engine "
                "preempts",
                {
                    **_gauge(spec, "kv_cache", "primary", full),
                    **_gauge(spec, "preemptions", "primary", counter(3, steps)),
                    **_gauge(spec, "kv_cache", "secondary", full),
                    **_gauge(spec, "preemptions", "secondary", constant(0, steps)),
                },
                steps * 60,
                [(Alert.ENGINE_SATURATION_RISING, [expected(rule, {"region": "primary"}, 0)])],
            )
        )
    return cases
