"""The probe cache's gate: a probe that may not run (another replica holds the canary lease) is
skipped and publishes none of its series, not even stale ones; once allowed it runs again."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from redline.exporters.probe import MetricDef, ProbeCache, Sample, writes_canaries
from redline.slo import catalog

STALENESS = MetricDef.of(catalog.VECTORDB_INDEX_STALENESS_SECONDS)
SUCCESS = f'{catalog.REDLINE_PROBE_SUCCESS.name}{{probe="canary"}} 1.0'


class CanaryProbe:
    name = "canary"
    interval_seconds = 1.0
    metrics = (STALENESS,)
    writes_canaries = True

    def __init__(self) -> None:
        self.runs = 0

    def run(self) -> list[Sample]:
        self.runs += 1
        return [Sample(STALENESS.name, float(self.runs))]


class ReadingProbe(CanaryProbe):
    name = "reading"
    writes_canaries = False


def exposition(cache: ProbeCache) -> str:
    """The sample lines of the cache's exposition (no HELP/TYPE comments)."""
    registry = CollectorRegistry()
    registry.register(cache)
    lines = generate_latest(registry).decode().splitlines()
    return "\n".join(line for line in lines if not line.startswith("#"))


def test_a_gated_probe_is_skipped_and_publishes_nothing_until_allowed() -> None:
    allowed = {"canary": True}
    canary, reading = CanaryProbe(), ReadingProbe()
    assert writes_canaries(canary) and not writes_canaries(reading)
    cache = ProbeCache([canary], may_run=lambda name: allowed.get(name, True))
    cache.run("canary")
    assert SUCCESS in exposition(cache)
    allowed["canary"] = False
    # Lost the lease: the cached value is hidden at once, before the next scheduled run.
    assert exposition(cache) == ""
    cache.run("canary")
    assert canary.runs == 1
    status = cache.status()["canary"]
    assert (status["skipped"], status["runs"], status["skipped_runs"]) == (True, 1, 1)
    allowed["canary"] = True
    # Allowed again, but nothing is published until a fresh run (the old value is gone).
    assert exposition(cache) == ""
    cache.run("canary")
    text = exposition(cache)
    assert f'{STALENESS.name}{{collection="",replica=""}} 2.0' in text
    assert SUCCESS in text
    assert cache.status()["canary"]["skipped"] is False
