"""The fake engines' expositions carry every series, label and bucket their source profile maps."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.devstack.fakes.engines import (
    ENGINE_PROFILES,
    EngineMetrics,
    EngineProfileError,
)
from redline.devstack.fakes.metrics_server import EngineMetricsServer
from redline.slo.sources import PROFILES, SATURATION_KINDS, SIGNAL_KINDS

Labels = dict[str, str]
Sample = tuple[str, Labels, float]

MATCHER = re.compile(r'^\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$')

OK, SERVER_ERRORS, CLIENT_ERRORS = 50, 5, 2
PROMPT, COMPLETION = 120, 60
# Requests each engine counts, and failures the profile's error series counts, for the traffic
# `_traffic` sends: a 4xx never reaches SGLang's or NIM's counters; vLLM's API server, TGI's
# router and an OpenTelemetry client see every call; OpenTelemetry records the 422 as an error.
EXPECTED_REQUESTS = {
    # vLLM 0.33: what the engine finished and what its admission refused; a 422 never got there.
    "vllm": OK + SERVER_ERRORS,
    # SGLang's middleware answers the 422 too (the client's own: not an error).
    "sglang": OK + SERVER_ERRORS + CLIENT_ERRORS,
    "tgi": OK + SERVER_ERRORS + CLIENT_ERRORS,
    "nim": OK + SERVER_ERRORS,
    "otel-genai": OK + SERVER_ERRORS + CLIENT_ERRORS,
}
# A 422 is the client's own everywhere (OpenTelemetry: UnprocessableEntityError, left out).
EXPECTED_ERRORS = dict.fromkeys(ENGINE_PROFILES, SERVER_ERRORS)


def _traffic(profile: str) -> EngineMetrics:
    metrics = EngineMetrics(profile, model="chat", extra_labels={"region": "east"})
    metrics.observe(0.45, count=OK, prompt_tokens=PROMPT, completion_tokens=COMPLETION)
    metrics.observe(1.2, status=500, count=SERVER_ERRORS)
    metrics.observe(0.01, status=422, count=CLIENT_ERRORS)
    return metrics


def _samples(text: str) -> list[Sample]:
    """Every sample, parsed by prometheus-client; names as written (the parser renames bare
    counters `x` to `x_total`, so names are taken from the lines themselves)."""
    written = [
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    ]
    parsed = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
    assert len(written) == len(parsed)
    return [(name, labels, value) for name, (labels, value) in zip(written, parsed, strict=True)]


def _matches(labels: Labels, matcher: str) -> bool:
    """One PromQL label matcher against a sample's labels (an empty label is an absent one)."""
    found = MATCHER.match(matcher)
    assert found, f"not a label matcher: {matcher}"
    name, op, value = found.groups()
    actual = labels.get(name, "")
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    hit = re.fullmatch(value, actual) is not None
    return hit if op == "=~" else not hit


def _select(samples: list[Sample], name: str, matchers: tuple[str, ...]) -> Iterator[Sample]:
    return (s for s in samples if s[0] == name and all(_matches(s[1], m) for m in matchers))


def _total(samples: list[Sample], signal: str, profile: str) -> float:
    """The sum a rule would read for `signal`: every name, with the matchers."""
    series = PROFILES[profile].series[signal]
    suffix = "_count" if SIGNAL_KINDS[signal] == "histogram" else ""
    return sum(
        value
        for name in series.names
        for _, _, value in _select(samples, name + suffix, series.matchers_of(name))
    )


@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_every_mapped_series_is_exposed_with_its_labels(profile: str) -> None:
    source = PROFILES[profile]
    samples = _samples(_traffic(profile).render().decode())
    names = {name for name, _, _ in samples}
    mapped_labels = set(source.labels.values())
    for signal, series in source.series.items():
        suffixes = ("_bucket", "_count", "_sum") if SIGNAL_KINDS[signal] == "histogram" else ("",)
        for name in series.names:
            for suffix in suffixes:
                assert name + suffix in names, f"{profile}: {signal} needs {name + suffix}"
            matchers = series.matchers_of(name)
            found = list(_select(samples, name + suffixes[0], matchers))
            assert found, f"{profile}: no {name} sample matches {matchers}"
            expected = set(mapped_labels)
            if signal in ("requests", "errors") and "errors_by_model" in source.missing:
                # An HTTP counter without a model label (SGLang's middleware): the profile says.
                expected.discard(source.labels["model"])
                assert not any(source.labels["model"] in labels for _, labels, _ in found)
            for _, labels, _ in found:
                assert expected <= set(labels), f"{profile}: {name} lacks {expected - set(labels)}"
    if "model" in source.labels:
        latency = source.series["request_duration"].names[0] + "_count"
        models = {labels[source.labels["model"]] for name, labels, _ in samples if name == latency}
        assert models == {"chat"}


@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_latency_buckets_are_the_profiles(profile: str) -> None:
    source = PROFILES[profile]
    bucket = source.series["request_duration"].names[0] + "_bucket"
    bounds = [
        labels["le"]
        for name, labels, _ in _samples(_traffic(profile).render().decode())
        if name == bucket and not labels.get("error_type")
    ]
    finite = sorted({float(le) for le in bounds if le != "+Inf"})
    assert tuple(finite) == source.buckets
    assert "+Inf" in bounds


@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_the_profiles_series_count_what_the_engine_saw(profile: str) -> None:
    samples = _samples(_traffic(profile).render().decode())
    assert _total(samples, "requests", profile) == EXPECTED_REQUESTS[profile]
    assert _total(samples, "errors", profile) == EXPECTED_ERRORS[profile]
    assert _total(samples, "prompt_tokens", profile) == OK * PROMPT
    assert _total(samples, "generated_tokens", profile) == OK * COMPLETION
    latency = _total(samples, "request_duration", profile)
    assert latency >= OK  # every engine times its successes; some time failures too
    if "time_to_first_token" in PROFILES[profile].series:
        assert _total(samples, "time_to_first_token", profile) == OK


def test_slow_requests_land_above_the_threshold_bucket() -> None:
    metrics = EngineMetrics("vllm")
    metrics.observe(0.5, count=90)
    metrics.observe(3.0, count=10)
    samples = _samples(metrics.render().decode())
    buckets = {
        labels["le"]: value
        for name, labels, value in samples
        if name == "vllm:e2e_request_latency_seconds_bucket"
    }
    assert buckets["0.8"] == 90 and buckets["2.5"] == 90 and buckets["5.0"] == 100
    assert buckets["+Inf"] == 100


def test_tgi_writes_counters_without_total_and_failures_by_kind() -> None:
    metrics = _traffic("tgi")
    metrics.observe(0.2, status=429, count=3)
    metrics.observe(0.2, status=499, count=4)
    text = metrics.render().decode()
    # TGI 3.3 counts a chat request twice in tgi_request_count (chat_completions, then
    # generate_internal): 64 requests read 128; the profile adds successes and failures instead.
    assert '# TYPE tgi_request_count counter\ntgi_request_count{region="east"} 128.0\n' in text
    assert "_total" not in text
    assert _total(_samples(text), "requests", "tgi") == 64
    failures = {
        labels["err"]: value
        for name, labels, value in _samples(text)
        if name == "tgi_request_failure"
    }
    assert failures == {"incomplete": 5, "validation": 2, "overloaded": 3, "dropped": 4}
    # A 422 and a hang-up before the batch are the client's: the matcher leaves them out.
    assert _total(_samples(text), "errors", "tgi") == 5 + 3


def test_vllm_shows_finish_reasons_lora_adapters_and_grouped_statuses() -> None:
    metrics = EngineMetrics("vllm", lora_adapters=("chat-v1", "chat-v2"))
    metrics.observe(0.3, count=4)
    metrics.observe(0.3, status=499, count=1)  # the client hung up
    metrics.observe(0.3, status=503, count=2)  # refused at admission
    metrics.observe(0.3, status=500, count=3)  # failed in the engine
    metrics.observe(0.3, status=500, count=5, streamed=True)  # failed inside a 200 stream
    samples = _samples(metrics.render().decode())
    reasons = {
        labels["finished_reason"]: value
        for name, labels, value in samples
        if name == "vllm:request_success_total"
    }
    # vLLM 0.33: a frontend abort records no finished stats; a refusal is no finished request.
    assert reasons == {"stop": 4, "length": 0, "abort": 0, "error": 8, "repetition": 0}
    rejected = {
        labels["reason"]: value
        for name, labels, value in samples
        if name == "vllm:admission_rejections_total"
    }
    assert rejected == {"max_num_queued_reqs": 2, "max_num_queued_tokens": 0}
    statuses = {
        labels["status"]: value for name, labels, value in samples if name == "http_requests_total"
    }
    # The API server counts the failed streams 2xx: why the profile reads the engine's counters.
    assert statuses == {"2xx": 9, "4xx": 1, "5xx": 5}
    assert _total(samples, "requests", "vllm") == 4 + 2 + 8
    assert _total(samples, "errors", "vllm") == 2 + 8
    (lora,) = [labels for name, labels, _ in samples if name == "vllm:lora_requests_info"]
    assert lora["running_lora_adapters"] == "chat-v1,chat-v2" and lora["max_lora"] == "2"
    assert {labels["engine"] for name, labels, _ in samples if name.startswith("vllm:e2e")} == {"0"}


@pytest.mark.parametrize("profile", ["redline-gateway", "triton"])
def test_profiles_without_an_engine_are_refused(profile: str) -> None:
    with pytest.raises(EngineProfileError, match="allowed: vllm, sglang, tgi, nim, otel-genai"):
        EngineMetrics(profile)


def test_negative_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        EngineMetrics("sglang").observe(0.1, count=-1)


def test_server_serves_metrics_and_nims_path() -> None:
    metrics = EngineMetrics("nim", model="meta/llama-3.1-8b-instruct")
    metrics.observe(0.4, count=3)
    with EngineMetricsServer(metrics) as server:
        for path in ("/metrics", "/v1/metrics"):
            answer = httpx.get(f"http://{server.target}{path}")
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert answer.content == metrics.render()
        assert httpx.get(f"http://{server.target}/other").status_code == 404
        assert server.scrapes == 2
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url, timeout=1)


def test_otel_records_a_streamed_call_when_it_hands_the_stream_back() -> None:
    metrics = EngineMetrics("otel-genai")
    metrics.observe(2.0, ttft_seconds=0.1, status=500, count=3, streamed=True)
    samples = _samples(metrics.render().decode())
    duration = PROFILES["otel-genai"].series["request_duration"].names[0]
    buckets = [(labels, value) for name, labels, value in samples if name == f"{duration}_bucket"]
    # Timed to the response headers (0.1 s), not the stream's end (2 s); no error.type.
    assert {labels["le"]: value for labels, value in buckets}["0.16"] == 3
    assert all(labels.get("error_type", "") == "" for labels, _ in buckets)
    assert _total(samples, "errors", "otel-genai") == 0
    assert _total(samples, "requests", "otel-genai") == 3
    assert _total(samples, "generated_tokens", "otel-genai") == 0


@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_every_saturation_series_is_exposed_and_follows_the_scheduler(profile: str) -> None:
    """Each saturation series the profile names is in the fake's exposition, and the
    scheduler's gauges move with what it is told (waiting, running, KV-cache usage)."""
    metrics = _traffic(profile)
    metrics.set_saturation(7, 3, 0.75)
    samples = _samples(metrics.render().decode())
    for signal, series in PROFILES[profile].saturation.items():
        kind = SATURATION_KINDS[signal]
        name = series.names[0] + ("_count" if kind == "histogram" else "")
        values = [value for _, _, value in _select(samples, name, series.matchers)]
        assert values, f"{profile}: {signal} needs {name}"
        expected = {"queue": 7.0, "running": 3.0, "kv_cache": 0.75}.get(signal)
        if expected is not None:
            assert values == [expected], (profile, signal, values)
