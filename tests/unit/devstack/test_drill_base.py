"""The drills' reading of a /metrics exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from redline.devstack.drills.base import exposition_total
from redline.slo import catalog


def test_exposition_total_sums_the_samples_whose_labels_include_the_wanted_ones() -> None:
    registry = CollectorRegistry()
    metric = catalog.LLM_REROUTES_TOTAL
    reroutes = Counter(metric.name, metric.help, metric.labels, registry=registry)
    reroutes.labels("primary", "secondary", "upstream_error").inc(3)
    reroutes.labels("primary", "secondary", "timeout").inc(2)
    reroutes.labels("secondary", "primary", "timeout").inc(7)
    text = generate_latest(registry).decode()
    assert exposition_total(text, metric.name, {"from_region": "primary"}) == 5
    assert exposition_total(text, metric.name) == 12
    assert exposition_total(text, metric.name, {"from_region": "elsewhere"}) == 0
