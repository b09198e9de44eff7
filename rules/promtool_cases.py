"""The shape of a promtool test case and the builders every family writes its cases with.

Values come from the spec's thresholds, so a changed spec keeps the proof honest; each case is
evaluated by the real `promtool test rules` against the generated rule files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from redline.rules.model import AlertRule, RuleGroup, format_duration, number
from redline.rules.templating import expand
from redline.slo import catalog
from redline.slo.spec import Spec

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


class AlertIndex:
    """The alerting rules of some groups, looked up by name and rule labels."""

    def __init__(self, groups: list[RuleGroup]) -> None:
        self.alerts = [a for g in groups for a in g.alerts]

    def get(self, name: str, **labels: str) -> AlertRule:
        """The first alert called `name` whose labels include `labels`."""
        for rule in self.alerts:
            if rule.alert == name and all(rule.labels.get(k) == v for k, v in labels.items()):
                return rule
        raise KeyError(f"no alert {name} {labels}")


def expected(rule: AlertRule, expr_labels: dict[str, str], value: float) -> dict[str, Any]:
    """What promtool must see for `rule` firing with these series labels and value."""
    labels = {**expr_labels, **rule.labels}
    return {
        "exp_labels": dict(sorted(labels.items())),
        "exp_annotations": {k: expand(v, labels, value) for k, v in rule.annotations.items()},
    }


def series(name: str | catalog.Metric, labels: dict[str, str] | None = None) -> str:
    """A promtool input series name: `name{a="b",...}`, labels sorted."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted((labels or {}).items()))
    return f"{name}{{{inner}}}" if inner else str(name)


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
    base = spec.sources.resolve().required_name("request_duration")
    out: dict[str, str] = {}
    cumulative = 0
    for bound in spec.sources.buckets:
        cumulative += per_bucket.get(bound, 0)
        out[series(f"{base}_bucket", {**labels, "le": number(bound)})] = counter(cumulative, steps)
    cumulative += per_bucket.get(math.inf, 0)
    out[series(f"{base}_bucket", {**labels, "le": "+Inf"})] = counter(cumulative, steps)
    out[series(f"{base}_count", labels)] = counter(cumulative, steps)
    total = sum(bound * n for bound, n in per_bucket.items() if bound != math.inf)
    out[series(f"{base}_sum", labels)] = counter(total, steps)
    return out


def bucket_around(spec: Spec, threshold: float) -> tuple[float, float]:
    """The bucket bound at the threshold and the next one above it."""
    buckets = sorted(spec.sources.buckets)
    above = [b for b in buckets if b > threshold]
    return threshold, (above[0] if above else math.inf)
