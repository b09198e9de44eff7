"""`build_detection`: an engine recognised from its exposition as the fakes write it (each
engine's own names, labels and buckets), its served buckets and version hints, and bad input."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from redline.devstack.fakes.engines import EngineMetrics
from redline.slo.detect import DetectionError, ExpositionError, build_detection
from redline.slo.sources import PROFILES

ENGINES = ("vllm", "sglang", "tgi", "nim", "otel-genai")


def exposition(profile: str) -> str:
    """A fake engine's page after a few requests, one of them failed."""
    engine = EngineMetrics(profile)
    engine.observe(0.4, count=20)
    engine.observe(1.2, status=500)
    return engine.render().decode()


@pytest.mark.parametrize("profile", ENGINES)
def test_each_engine_is_recognised_with_its_own_buckets(profile: str) -> None:
    detection = build_detection(exposition(profile))
    assert detection.profile.name == profile
    assert detection.buckets == pytest.approx(PROFILES[profile].buckets)
    assert not detection.buckets_differ
    assert all(not signal.missing for signal in detection.signals), detection.signals
    block = detection.sources_block()
    assert block["profile"] == profile
    # TGI's series name no model: the block asks for one.
    assert ("model" in block) == (profile == "tgi")


def _vllm_registry(buckets: tuple[float, ...], *gauges: str) -> CollectorRegistry:
    """vLLM's latency histogram with `buckets` (its --custom-histogram-buckets), and gauges."""
    registry = CollectorRegistry()
    latency = Histogram(
        "vllm:e2e_request_latency_seconds",
        "e2e",
        ["model_name", "engine"],
        buckets=buckets,
        registry=registry,
    )
    latency.labels(model_name="chat", engine="0").observe(0.4)
    for name in gauges:
        Gauge(name, name, ["model_name"], registry=registry).labels(model_name="chat").set(0.5)
    return registry


def _vllm_page(buckets: tuple[float, ...], *gauges: str) -> str:
    return generate_latest(_vllm_registry(buckets, *gauges)).decode()


def test_openmetrics_is_read_too() -> None:
    # TGI's name: prometheus-client's OpenMetrics writer escapes vLLM's colons.
    registry = CollectorRegistry()
    Histogram("tgi_request_duration", "d", buckets=(0.5, 1.0), registry=registry).observe(0.4)
    text = generate_openmetrics(registry).decode()
    assert text.rstrip().endswith("# EOF")
    detection = build_detection(text)
    assert detection.profile.name == "tgi" and detection.buckets == (0.5, 1.0)


def test_custom_buckets_go_into_the_block() -> None:
    detection = build_detection(_vllm_page((0.25, 0.5, 1.0, 4.0)))
    assert detection.buckets == (0.25, 0.5, 1.0, 4.0) and detection.buckets_differ
    assert detection.sources_block() == {
        "profile": "vllm",
        "histogram_buckets": [0.25, 0.5, 1.0, 4.0],
    }
    assert detection.labels == ("engine", "model_name")
    missing = {s.signal: s.missing for s in detection.signals}
    assert missing["requests"] == ("vllm:request_success_total", "vllm:admission_rejections_total")


def test_version_hints_come_from_renamed_series() -> None:
    buckets = PROFILES["vllm"].buckets
    old = build_detection(_vllm_page(buckets, "vllm:gpu_cache_usage_perc"))
    assert old.hints == ("vLLM before 0.9.2 (vllm:gpu_cache_usage_perc, not kv_cache_usage_perc)",)
    # 0.9.2 to 0.10 still showed the old name beside the new one: no claim then.
    both = build_detection(
        _vllm_page(buckets, "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
    )
    assert both.hints == ()
    assert "vLLM 0.11 or later" in build_detection(exposition("vllm")).hints


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("garbage here\n", "not a Prometheus exposition"),
        ("<html><body>login</body></html>\n", "not a Prometheus exposition"),
        ("", "holds no sample"),
        ("# HELP x only help\n", "holds no sample"),
    ],
)
def test_a_body_that_is_no_exposition_is_refused(text: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message):
        build_detection(text)


def test_two_engines_or_none_are_refused() -> None:
    with pytest.raises(DetectionError, match="two engines in one exposition: vllm .* sglang"):
        build_detection(exposition("vllm") + exposition("sglang"))
    registry = CollectorRegistry()
    Gauge("up_and_about", "x", registry=registry).set(1)
    with pytest.raises(DetectionError, match="no known engine"):
        build_detection(generate_latest(registry).decode())
