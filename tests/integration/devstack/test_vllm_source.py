"""The `--source vllm` stack's serving path with real parts: simulators publishing vLLM's
exposition for what they serve, and a real Prometheus scraping them with the stack's engine job
and the rules generated from the stack's spec, until the latency red line fires for the slow
region, under the same alert name and labels as behind the gateway."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.config import build_engine_job, build_source_spec
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.layout import build_endpoints, build_ported_parts, simulator_part
from redline.devstack.processes import start_prometheus
from redline.generate.outputs import RULE_FILE, RULES_DIR, build_outputs
from redline.platform.prometheus import PrometheusClient
from redline.rules.records import p99_record, rollback_records
from redline.slo.load import apply_profile, load_spec
from redline.slo.sources import PROFILES
from tests.support.stack import redline

pytestmark = pytest.mark.integration

BASE = "redline-base"
ADAPTER = "chat-lora"
E2E = "vllm:e2e_request_latency_seconds"
HTTP = "http_requests_total"


def _adapter(tmp_path: Path, version: str = "v1") -> str:
    path = tmp_path / ADAPTER / version
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _simulator(tmp_path: Path, region: str, seed: int = 3) -> ServerThread:
    settings = SimulatorSettings(
        region=region, seed=seed, adapters={ADAPTER: _adapter(tmp_path)}, metrics_profile="vllm"
    )
    return serve_in_thread(build_simulator_app(settings))


def _chat(model: str, prompt: str = "Explain error budgets.", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], **extra}


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
           **labels: str) -> float:  # fmt: skip
    return sum(v for (n, got), v in samples.items() if n == name and set(labels.items()) <= got)


@pytest.fixture()
def sim(tmp_path: Path) -> Iterator[ServerThread]:
    server = _simulator(tmp_path, "primary")
    yield server
    server.stop()


def test_the_simulator_publishes_vllms_series_for_what_it_served(sim: ServerThread) -> None:
    with httpx.Client(base_url=sim.url, timeout=10.0) as client:
        before = _samples(client.get("/metrics").text)
        # Both served models have their series before any request, at zero.
        for model in (BASE, ADAPTER):
            assert _value(before, f"{E2E}_count", model_name=model) == 0
        usage = 0
        for _ in range(3):
            body = client.post("/v1/chat/completions", json=_chat(ADAPTER, max_tokens=8)).json()
            usage += body["usage"]["prompt_tokens"]
        for _ in range(2):
            with client.stream("POST", "/v1/chat/completions",
                               json=_chat(BASE, stream=True, max_tokens=4)) as stream:  # fmt: skip
                assert stream.status_code == 200
                for _ in stream.iter_lines():
                    pass
        dry = client.post("/v1/chat/completions?dry-run=true", json=_chat(BASE))
        assert dry.status_code == 200
        assert client.post("/v1/chat/completions", json=_chat("nope")).status_code == 404
        client.post("/admin/faults", json={"latency": {"base_seconds": 0.35}})
        assert client.post("/v1/chat/completions", json=_chat(ADAPTER)).status_code == 200
        client.post("/admin/faults", json={"error_rate": 1.0, "error_status": 503})
        assert client.post("/v1/chat/completions", json=_chat(ADAPTER)).status_code == 503
        client.post("/admin/faults", json={"error_rate": 1.0, "error_status": 500})
        assert client.post("/v1/chat/completions", json=_chat(ADAPTER)).status_code == 500
        client.post("/admin/faults", json={})
        response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    # vLLM 0.33: the 503 was refused at admission (no engine stats), the 500 finished in error.
    assert _value(samples, f"{E2E}_count", model_name=ADAPTER) == 5  # 3 + slow + the 500
    assert _value(samples, f"{E2E}_count", model_name=BASE) == 2  # streams; no dry-run
    # The slow request (0.35 s) sits above vLLM's 0.3 s bucket, under 0.8 s however busy the
    # machine; the others (the 500 too) under 0.3 s.
    below = _value(samples, f"{E2E}_bucket", model_name=ADAPTER, le="0.3")
    assert (below, _value(samples, f"{E2E}_bucket", model_name=ADAPTER, le="0.8")) == (4, 5)
    assert _value(samples, "vllm:admission_rejections_total", model_name=ADAPTER,
                  reason="max_num_queued_reqs") == 1  # fmt: skip
    assert _value(samples, "vllm:prompt_tokens_total", model_name=ADAPTER) == (usage + usage // 3)
    assert _value(samples, "vllm:time_to_first_token_seconds_count", model_name=BASE) == 2
    assert _value(samples, "vllm:request_success_total", model_name=ADAPTER,
                  finished_reason="error") == 1  # fmt: skip
    # The API server's counter has no model label: one series per status group, both models.
    handler = {"handler": "/v1/chat/completions", "method": "POST"}
    assert _value(samples, HTTP, **handler, status="2xx") == 6
    assert _value(samples, HTTP, **handler, status="4xx") == 1
    assert _value(samples, HTTP, **handler, status="5xx") == 2


def test_a_stream_the_client_abandons_is_no_finished_request(sim: ServerThread) -> None:
    """vLLM 0.33's OutputProcessor.abort_requests records no finished stats for a client that
    hangs up: neither a request nor an error of the profile; the API server counts it 2xx."""
    with httpx.Client(base_url=sim.url, timeout=10.0) as client:
        before = _samples(client.get("/metrics").text)
        client.post("/admin/faults", json={"tokens_per_second": 20})
        body = _chat(ADAPTER, stream=True, max_tokens=200)
        with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            next(stream.iter_lines())
        client.post("/admin/faults", json={})
        handler = {"handler": "/v1/chat/completions", "method": "POST"}

        def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
            samples = _samples(client.get("/metrics").text)
            streams = _value(samples, HTTP, **handler, status="2xx")
            # The 200 went out with the first chunk: the API server counts the stream 2xx.
            return samples if streams > _value(before, HTTP, **handler, status="2xx") else {}

        deadline = time.monotonic() + 10
        while not (after := counted()):
            assert time.monotonic() < deadline, "the abandoned stream was never counted"
            time.sleep(0.1)
    for reason in ("abort", "error", "stop"):
        labels = {"model_name": ADAPTER, "finished_reason": reason}
        assert _value(after, "vllm:request_success_total", **labels) == _value(
            before, "vllm:request_success_total", **labels
        )


def test_without_a_metrics_profile_there_is_no_metrics_page(tmp_path: Path) -> None:
    with serve_in_thread(build_simulator_app(SimulatorSettings(region="primary"))) as server:
        assert httpx.get(f"{server.url}/metrics").status_code == 404
    with pytest.raises(ValueError, match="'redline-gateway' is not an engine profile"):
        SimulatorSettings(metrics_profile="redline-gateway")


PODS = 2


def test_prometheus_scrapes_each_region_and_the_generated_rules_fire_on_its_p99(
    tmp_path: Path,
) -> None:
    """Two pods per region, each scraped with its `region` and `pod`: the rules read each pod's
    own series, the recorded P99 is one per region over both pods."""
    spec = build_source_spec(apply_profile(load_spec().spec, "local"), "vllm")
    regions = spec.regions
    sims = {
        (region, pod): _simulator(tmp_path, region, seed=3 + pod)
        for region in regions
        for pod in range(PODS)
    }
    try:
        parts = build_ported_parts(regions, source="vllm", pods=PODS)
        ports = {p: 26000 + i for i, p in enumerate(parts)}
        ports.update({simulator_part(r, i): server.port for (r, i), server in sims.items()})
        endpoints = build_endpoints(ports, regions, source="vllm", pods=PODS)
        rules = build_outputs(spec, "spec.yaml")[RULES_DIR / RULE_FILE]
        (tmp_path / "rules.yml").write_text(rules)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules.yml")],
            "scrape_configs": [build_engine_job(endpoints)],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prometheus = start_prometheus(tmp_path / "prom", tmp_path / "prometheus.yml")
        try:
            threshold = spec.red_lines.latency_p99.threshold_seconds
            by_version = rollback_records(spec)["requests"]
            _drive_until_the_red_line_fires(
                threshold, sims, regions, prometheus.url, p99_record(spec), by_version
            )
        finally:
            prometheus.stop()
    finally:
        for server in sims.values():
            server.stop()


def _drive_until_the_red_line_fires(
    threshold: float,
    sims: dict[tuple[str, int], ServerThread],
    regions: tuple[str, ...],
    prometheus_url: str,
    record: str,
    by_version: str,
) -> None:
    primary, secondary = regions[0], regions[1]
    slow = {"latency": {"base_seconds": threshold + 0.1}}
    with (
        httpx.Client(timeout=10.0) as client,
        PrometheusClient(prometheus_url, timeout=5.0, retries=0, trust_env=False) as prom,
        ThreadPoolExecutor(max_workers=8) as pool,
    ):
        # One slow pod of two, half the region's traffic: the region's one P99 (both pods'
        # requests in one distribution) is over the line, the other region's under it.
        client.post(f"{sims[(primary, 0)].url}/admin/faults", json=slow)

        def send(target: tuple[str, int]) -> int:
            url = f"{sims[target].url}/v1/chat/completions"
            return client.post(url, json=_chat(ADAPTER, max_tokens=4)).status_code

        def firing() -> bool:
            list(pool.map(send, [(r, i) for r in (primary, secondary) for i in range(PODS)] * 4))
            alerts = [a for a in prom.alerts() if a["labels"]["alertname"] == "RedLineLatencyP99"]
            return any(a["state"] == "firing" for a in alerts)

        deadline = time.monotonic() + 60
        while not firing():
            assert time.monotonic() < deadline, "RedLineLatencyP99 never fired"
        alerts = [a for a in prom.alerts() if a["labels"]["alertname"] == "RedLineLatencyP99"]
        assert {a["labels"]["region"] for a in alerts} == {primary}
        assert "playbook" not in alerts[0]["labels"]  # nothing to reroute: it pages a human
        series = prom.instant(record)
        p99 = {s["region"]: v for s, v in series}
        assert len(series) == len(p99) == 2, series  # one per region, not one per pod
        assert not any("pod" in s for s, _ in series), series
        assert p99[primary] > threshold and p99[secondary] < threshold, p99
        # The engine's series are read where they are: each pod's stays its own (a counter reset
        # on one pod must not touch another), and no rule copies them.
        raw = f"{PROFILES['vllm'].series['request_duration'].names[0]}_count"
        labels = [s for s, _ in prom.instant(raw)]
        assert {s["pod"] for s in labels} == {f"{r}-{i}" for r in regions for i in range(PODS)}
        copied = prom.instant('count({__name__=~"redline:source:.+"})')
        assert not copied, copied
        # Mapped onto the catalog's labels inside the sums; no model_active_info here (no
        # exporter): the registry's version is unknown.
        versions = {(s["model"], s["model_version"]) for s, _ in prom.instant(by_version)}
        assert (ADAPTER, "unknown") in versions, versions
        assert {version for _, version in versions} == {"unknown"}, versions


def test_up_refuses_a_source_it_cannot_simulate_before_anything_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = redline("up", "--run-dir", str(run_dir), "--source", "tgi")
    assert result.returncode == 1
    assert "--source tgi: the local stack runs redline-gateway, vllm" in result.stderr
    assert not run_dir.exists()
