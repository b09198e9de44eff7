"""bench.rules_cost's pure parts: the plain (Sloth-style) rule set, the pods' expositions and
traffic, the Prometheus config (no Prometheus, no server)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import prometheus_client.metrics
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import rules_cost as rc
from redline.slo.sources import PROFILES
from redline.slo.spec import Spec


@pytest.fixture(scope="module")
def spec() -> Spec:
    return rc.redline_spec()


def _samples(page: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page.decode())
        for s in family.samples
    }


def test_plain_rules_read_the_series_redline_s_vllm_profile_maps() -> None:
    vllm = PROFILES["vllm"].series
    assert vllm["request_duration"].names == (rc.VLLM_LATENCY,)
    assert vllm["requests"].names == vllm["errors"].names == (rc.VLLM_FINISHED, rc.VLLM_REJECTED)
    assert not vllm["requests"].matchers_of(rc.VLLM_FINISHED)
    assert vllm["errors"].matchers_of(rc.VLLM_FINISHED) == (rc.VLLM_ERROR_REASON,)
    assert not vllm["errors"].matchers_of(rc.VLLM_REJECTED)
    assert PROFILES["vllm"].labels["model"] == rc.VLLM_MODEL_LABEL


def test_plain_rules_are_sloth_s_groups_per_slo_then_the_p99s(spec: Spec) -> None:
    rules = rc.plain_rule_groups(spec)
    names = [group["name"] for group in rules["groups"]]
    expected = [
        f"sloth-slo-{kind}-{spec.service}-{slo.name}"
        for slo in spec.slos
        for kind in ("sli-recordings", "meta-recordings", "alerts")
    ]
    assert names == [*expected, "vllm-latency"]
    sli = rules["groups"][0]["rules"]
    windows = [rule["labels"]["sloth_window"] for rule in sli]
    assert windows == [*rc.SLOTH_WINDOWS, "30d"]
    # Every window straight from the raw counters; the period from the 5m recordings.
    for rule in sli[:-1]:
        window = rule["labels"]["sloth_window"]
        assert rule["record"] == f"slo:sli_error:ratio_rate{window}"
        assert f"{rc.VLLM_LATENCY}_count[{window}]" in rule["expr"]
        assert f'{rc.VLLM_LATENCY}_bucket{{le="0.8"}}[{window}]' in rule["expr"]
        assert "slo:" not in rule["expr"]
    period = sli[-1]["expr"]
    assert period.startswith("sum_over_time(slo:sli_error:ratio_rate5m{")
    assert "[30d])\n/ ignoring (sloth_window)\ncount_over_time(" in period
    assert 'sloth_slo="latency"' in period


def test_plain_availability_and_alerts_follow_the_spec(spec: Spec) -> None:
    rules = rc.plain_rule_groups(spec)
    by_name = {group["name"]: group["rules"] for group in rules["groups"]}
    availability = by_name[f"sloth-slo-sli-recordings-{spec.service}-availability"][0]["expr"]
    rejected = f"sum(rate({rc.VLLM_REJECTED}[5m]))"
    assert availability == (
        f"(sum(rate({rc.VLLM_FINISHED}{{{rc.VLLM_ERROR_REASON}}}[5m])) + {rejected})\n/\n"
        f"(sum(rate({rc.VLLM_FINISHED}[5m])) + {rejected})\n"
    )
    page, ticket = by_name[f"sloth-slo-alerts-{spec.service}-availability"]
    assert page["labels"] == {"sloth_severity": "page"}
    assert ticket["labels"] == {"sloth_severity": "ticket"}
    for window, factor in (("5m", "14.4"), ("1h", "14.4"), ("30m", "6"), ("6h", "6")):
        assert f'ratio_rate{window}{{sloth_id="{spec.service}-availability"' in page["expr"]
        assert f"> ({factor} * 0.001))" in page["expr"]
    meta = {
        rule["record"]: rule["expr"]
        for rule in by_name[f"sloth-slo-meta-recordings-{spec.service}-availability"]
    }
    assert meta["slo:objective:ratio"] == "vector(0.999)"
    assert meta["slo:time_period:days"] == "vector(30)"
    latency = by_name["vllm-latency"]
    exprs = {rule.get("record", rule.get("alert")): rule["expr"] for rule in latency}
    assert exprs[rc.P99_BY_REGION] == (
        f"histogram_quantile(0.99, sum by (le, region) (rate({rc.VLLM_LATENCY}_bucket[5m])))"
    )
    assert "sum by (le, model_name)" in exprs[rc.P99_BY_MODEL]
    assert exprs["LatencyP99OverRedLine"].startswith(f"{rc.P99_BY_REGION} > 0.8\n")


def test_recorded_names_and_their_regex(spec: Spec) -> None:
    rules = yaml.safe_load(rc.dump_rules(rc.plain_rule_groups(spec)))
    names = rc.recorded_names(rules)
    assert len(names) == len(set(names))
    assert names[:8] == [f"slo:sli_error:ratio_rate{w}" for w in (*rc.SLOTH_WINDOWS, "30d")]
    assert {rc.P99_BY_REGION, rc.P99_BY_MODEL, "sloth_slo_info"} <= set(names)
    assert rc.names_regex(["b:x", "a.y", "b:x"]) == r"a\.y|b:x"


def test_a_pod_page_holds_every_vllm_series_per_model_and_one_api_server() -> None:
    models = rc.model_names(2)
    engines = rc.pod_engines(models)
    engines[0].observe(0.5, status=200)
    engines[0].observe(0.9, status=500)
    engines[1].observe(1.2, status=200, count=2)
    samples = _samples(rc.render_pod(engines))
    names = {name for name, _ in samples}
    for family in (
        "vllm:e2e_request_latency_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ):
        assert {f"{family}_bucket", f"{family}_count", f"{family}_sum"} <= names
    for name in (
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "http_requests_total",
        "http_request_duration_seconds_count",
    ):
        assert name in names
    # Each model has its own latency series (vLLM's buckets, +Inf included)...
    for model in models:
        buckets = [
            labels
            for name, labels in samples
            if name == "vllm:e2e_request_latency_seconds_bucket" and ("model_name", model) in labels
        ]
        assert len(buckets) == len(PROFILES["vllm"].buckets) + 1
    reasons = {
        dict(labels)["finished_reason"]
        for name, labels in samples
        if name == "vllm:request_success_total"
    }
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    # ... and the API server, with no model label, counts both models' requests once.
    http = {
        dict(labels)["status"]: value
        for (name, labels), value in samples.items()
        if name == "http_requests_total"
    }
    assert http == {"2xx": 3.0, "5xx": 1.0}
    assert (
        samples[
            (
                "http_request_duration_seconds_count",
                (
                    ("handler", "/v1/chat/completions"),
                    ("method", "POST"),
                ),
            )
        ]
        == 4.0
    )


def test_merge_adds_counters_and_keeps_the_largest_gauge_and_earliest_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # prometheus-client's `_created` switch is process-wide: an app built by an earlier test in
    # this worker (gateway, exporter: created_series off by default) leaves it off.
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", True)
    a, b = rc.pod_engines(["m"]), rc.pod_engines(["m"])
    a[0].observe(0.4)
    b[0].observe(0.4, count=3)
    merged = _samples(rc.render_pod([a[0], b[0]]))
    key = ("vllm:e2e_request_latency_seconds_count", (("engine", "0"), ("model_name", "m")))
    assert merged[key] == 4.0
    created = ("vllm:e2e_request_latency_seconds_created", key[1])
    alone = _samples(rc.render_pod(a))
    assert merged[created] == alone[created]
    gauge = ("vllm:kv_cache_usage_perc", key[1])
    assert merged[gauge] == alone[gauge]


def test_drawn_traffic_is_seeded_and_mixes_outcomes() -> None:
    traffic = rc.Traffic(rate=50.0, server_errors=0.1, client_errors=0.1, aborts=0.1)
    first = rc.draw_requests(np.random.default_rng(7), traffic, 60.0)
    again = rc.draw_requests(np.random.default_rng(7), traffic, 60.0)
    assert first == again
    assert 2500 < len(first) < 3500
    assert {r.status for r in first} == {200, 400, 499, 500}
    assert all(0 < r.ttft <= r.latency for r in first)
    slow = sum(r.latency > 0.8 for r in first) / len(first)
    assert 0.01 < slow < 0.2
    assert rc.draw_requests(np.random.default_rng(7), traffic, 0.0) == []


def test_a_pod_advances_its_counters_between_pages() -> None:
    target = rc.PodTarget("primary-0", "primary", 0, 0)
    pod = rc.Pod(target, rc.model_names(1), rc.Traffic(rate=1.0), refresh=0.0)
    assert pod.advance(100.0) > 0
    before = _samples(pod.page())
    pod.advance(100.0)
    after = _samples(pod.page())
    key = ("vllm:e2e_request_latency_seconds_count", (("engine", "0"), ("model_name", "model-0")))
    assert after[key] > before[key] > 0


def test_fleet_targets_spread_pods_over_regions() -> None:
    targets = rc.fleet_targets(5, ["primary", "secondary"])
    assert [(t.name, t.region, t.region_index) for t in targets] == [
        ("primary-0", "primary", 0),
        ("secondary-0", "secondary", 1),
        ("primary-1", "primary", 0),
        ("secondary-1", "secondary", 1),
        ("primary-2", "primary", 0),
    ]


def test_prometheus_config_scrapes_every_pod_on_one_port(tmp_path: Path) -> None:
    targets = rc.fleet_targets(3, ["primary", "secondary"])
    config = rc.prometheus_config("127.0.0.1:9", targets, 15, 15, tmp_path / "rules.yml")
    assert config["global"]["scrape_interval"] == "15s"
    assert config["global"]["scrape_timeout"] == "10s"
    assert config["rule_files"] == [str(tmp_path / "rules.yml")]
    engines, registry = config["scrape_configs"]
    assert engines["job_name"] == "vllm"
    assert engines["static_configs"][1] == {
        "targets": ["127.0.0.1:9"],
        "labels": {"region": "secondary", "pod": "secondary-0"},
    }
    path, instance = engines["relabel_configs"]
    assert path == {
        "source_labels": ["pod"],
        "target_label": "__metrics_path__",
        "replacement": "/pods/$1/metrics",
    }
    assert instance["target_label"] == "instance"
    assert registry["metrics_path"] == rc.REGISTRY_PATH
    assert b'model_active_info{config_hash="sha256:model-0-config",model="model-0"' in (
        rc.registry_page(rc.model_names(1))
    )


def test_rfc3339_times_as_prometheus_writes_them() -> None:
    assert rc.rfc3339_seconds("1970-01-01T00:00:01.5Z") == 1.5
    assert rc.rfc3339_seconds("1970-01-01T00:00:02Z") == 2.0
    assert rc.rfc3339_seconds("1970-01-01T01:00:03.25+01:00") == 3.25


def test_the_targets_apply_at_1000_pods_only() -> None:
    def result(series: int, seconds: float) -> rc.SideResult:
        return rc.SideResult(series, {}, seconds, {}, 4, {}, 1e5, 1e9, 0.1, 0.0, 0.0)

    def phase(pods: int) -> rc.Phase:
        results = {rc.REDLINE: result(60, 0.3), rc.PLAIN: result(40, 0.1)}
        slis: dict[str, dict[str, float]] = {rc.REDLINE: {}, rc.PLAIN: {}}
        return rc.Phase(pods, 1, results, True, {}, slis, 1.0, 0, {})

    small = {f.label: f for f in rc.phase_figures(phase(100))}
    assert all(f.met is None for label, f in small.items() if "redline/plain" in label)
    large = {f.label: f for f in rc.phase_figures(phase(1000))}
    assert large["N=1000: series added by the rules, redline/plain"].met is True
    assert large["N=1000: series added by the rules, redline/plain"].target == "<= 1.5 x"
    assert large["N=1000: rule evaluation, ms, redline/plain"].met is False
    assert large["N=1000: rule evaluation, ms, redline/plain"].value == pytest.approx(3.0)
    assert large["N=1000: TSDB head series, redline/plain"].met is None
    sound = "N=1000: both sides computed every SLI and P99; no rule failed, no scrape timed out"
    assert large[sound].met is True
