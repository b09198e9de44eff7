"""The reroute's restore decision: healthy by the red line (with hysteresis), and its settings."""

from __future__ import annotations

import math

from redline.platform.serving import HealthCheck
from redline.remediation.playbooks.reroute import (
    Reroute,
    build_health_queries,
    build_region_health,
)
from redline.remediation.settings import RerouteSettings, ServingSettings
from redline.rules.records import p99_record
from redline.slo import catalog
from redline.slo.load import load_spec

LIMIT = 0.64


def _probe(seconds: float, healthy: bool = True) -> HealthCheck:
    detail = "dry run answered 200" if healthy else "HTTP 503: region a is unavailable"
    return HealthCheck("http://a", healthy, detail, seconds, {})


def test_fast_probes_and_fast_figures_are_healthy() -> None:
    health = build_region_health(
        LIMIT, [_probe(0.1), _probe(0.2)], {"exporter_probe": 0.3, "recorded_p99": None}
    )
    assert health.healthy and health.latency_seconds == 0.3
    assert health.detail.startswith("all under 0.64 s")
    assert health.data["figures"] == {"probe_1": 0.1, "probe_2": 0.2, "exporter_probe": 0.3}


def test_a_region_under_the_red_line_but_over_the_restore_limit_is_not_healthy() -> None:
    # 0.7 s keeps the alert quiet (threshold 0.8 s) and must still keep the traffic away.
    health = build_region_health(LIMIT, [_probe(0.7)], {})
    assert not health.healthy and health.detail == "probe 1 took 0.700 s > 0.64 s"


def test_any_slow_or_failed_measurement_or_unreadable_prometheus_keeps_the_override() -> None:
    failed = build_region_health(LIMIT, [_probe(0.01, healthy=False)], {})
    assert not failed.healthy and "unavailable" in failed.detail
    slow_p99 = build_region_health(LIMIT, [_probe(0.1)], {"recorded_p99": 0.9})
    assert not slow_p99.healthy and slow_p99.detail == "recorded p99 0.900 s > 0.64 s"
    blind = build_region_health(LIMIT, [_probe(0.1)], {}, "Prometheus at http://p is down")
    assert not blind.healthy and "Prometheus unreadable" in blind.detail
    # No traffic, no quantile: NaN and absent figures are not measurements.
    nan = build_region_health(LIMIT, [_probe(0.1)], {"recorded_p99": math.nan})
    assert nan.healthy
    assert not build_region_health(LIMIT, [], {}, None).data["figures"]


def test_health_queries_read_catalog_series_for_the_region() -> None:
    spec = load_spec(None).spec
    queries = build_health_queries(spec, "eu-west")
    assert queries["exporter_probe"] == (
        f'max({catalog.LLM_PROBE_DURATION_SECONDS}{{region="eu-west", probe="chat_dry_run"}})'
    )
    assert queries["recorded_p99"] == f'max({p99_record(spec)}{{region="eu-west"}})'


def test_limits_come_from_the_spec_and_settings_may_shorten_the_sustained_period() -> None:
    spec = load_spec(None).spec
    serving = ServingSettings(gateway_url="http://gw", upstreams={"a": "http://a", "b": "http://b"})
    reroute = Reroute(RerouteSettings(), serving, "redis://x", spec)
    red = spec.red_lines.latency_p99
    assert reroute.limit_seconds == red.threshold_seconds * red.restore.below_ratio
    assert reroute.restore_for_seconds == red.restore.for_seconds == 120
    assert (
        Reroute(RerouteSettings(restore_for_seconds=5), serving, "r", spec).restore_for_seconds == 5
    )
    assert reroute.settings_problems() == []


def test_missing_settings_are_named() -> None:
    bare = Reroute(RerouteSettings(), ServingSettings(), "redis://x")
    assert bare.settings_problems() == [
        "serving.upstreams is not set (the regions to move traffic between, in failover order)",
        "serving.gateway_url is not set (the gateway the reroute verifies)",
    ]
    one = Reroute(RerouteSettings(), ServingSettings(upstreams={"a": "http://a"}), "redis://x")
    assert "serving.upstreams names one region" in one.settings_problems()[0]
