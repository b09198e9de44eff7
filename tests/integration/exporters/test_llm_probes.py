"""Endpoint and golden-set probes against real simulators and a real gateway."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.processes import find_binary, free_port
from redline.exporters.app import build_exporter_app
from redline.exporters.llm_probes import (
    EndpointProbe,
    EndpointProbeSettings,
    GoldenSetProbe,
    GoldenSetSettings,
    LlmProbeError,
    build_llm_probes,
)
from redline.exporters.probe import ProbeCache, Sample
from redline.exporters.settings import ExporterSettings
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.golden import GOLDEN_SET, GoldenPrompt, golden_lines
from redline.platform.snapshots import ActiveVersions, SnapshotRegistry
from redline.slo import catalog
from redline.slo.load import load_spec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, ServerThread]]:
    servers = {
        region: serve_in_thread(build_simulator_app(SimulatorSettings(region=region, seed=i)))
        for i, region in enumerate(("primary", "secondary"))
    }
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture()
def upstreams(sims: dict[str, ServerThread]) -> Iterator[dict[str, str]]:
    urls = {region: server.url for region, server in sims.items()}
    for url in urls.values():
        httpx.post(f"{url}/admin/faults", json={}).raise_for_status()
    yield urls
    for url in urls.values():
        models = httpx.get(f"{url}/v1/models").json()["data"]
        for model in models[1:]:
            httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": model["id"]})


@pytest.fixture()
def gateway(upstreams: dict[str, str], redis_url: str) -> Iterator[ServerThread]:
    settings = GatewaySettings(upstreams=upstreams, redis_url=redis_url)
    server = serve_in_thread(build_gateway_app(settings, load_spec(None).spec, CollectorRegistry()))
    yield server
    server.stop()


def values(samples: list[Sample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}


SUCCESS = catalog.LLM_PROBE_SUCCESS.family
DURATION = catalog.LLM_PROBE_DURATION_SECONDS.family


def endpoint_values(probe: EndpointProbe) -> dict[tuple[str, str], float]:
    """Each sample's value by (family, `probe` label)."""
    return {(s.name, s.labels["probe"]): s.value for s in probe.run() if s.labels["region"]}


def test_endpoint_probe_reports_each_check(upstreams: dict[str, str]) -> None:
    probe = EndpointProbe("primary", upstreams["primary"], interval_seconds=1)
    try:
        assert probe.name == "llm_endpoint_primary"
        got = endpoint_values(probe)
        assert got[SUCCESS, "healthz"] == 1
        assert got[SUCCESS, "chat_dry_run"] == 1
        assert 0 < got[DURATION, "healthz"] < 1
        # A region that is down reads 0; the run itself does not fail.
        httpx.post(f"{upstreams['primary']}/admin/faults", json={"outage": "unavailable"})
        got = endpoint_values(probe)
        assert got[SUCCESS, "healthz"] == 0
        assert got[SUCCESS, "chat_dry_run"] == 0
        # Errors on generation only: health is fine, the dry run is not.
        httpx.post(f"{upstreams['primary']}/admin/faults", json={"error_rate": 1.0})
        got = endpoint_values(probe)
        assert (got[SUCCESS, "healthz"], got[SUCCESS, "chat_dry_run"]) == (1, 0)
    finally:
        probe.close()


def test_endpoint_probe_on_a_dead_or_hanging_region(upstreams: dict[str, str]) -> None:
    dead = EndpointProbe("gone", f"http://127.0.0.1:{free_port()}")
    slow = EndpointProbe("slow", upstreams["secondary"], timeout_seconds=0.2)
    wrong_model = EndpointProbe("primary", upstreams["primary"], model="no-such-model")
    try:
        got = endpoint_values(dead)
        assert got[SUCCESS, "healthz"] == got[SUCCESS, "chat_dry_run"] == 0
        httpx.post(f"{upstreams['secondary']}/admin/faults", json={"outage": "hang"})
        got = endpoint_values(slow)
        assert got[SUCCESS, "healthz"] == 0
        assert 0.2 <= got[DURATION, "healthz"] < 1.0
        got = endpoint_values(wrong_model)
        assert (got[SUCCESS, "healthz"], got[SUCCESS, "chat_dry_run"]) == (1, 0)
    finally:
        httpx.post(f"{upstreams['secondary']}/admin/faults", json={})
        for probe in (dead, slow, wrong_model):
            probe.close()


def test_golden_set_probe_counts_by_model_version(
    upstreams: dict[str, str], gateway: ServerThread, tmp_path: Path
) -> None:
    base = GoldenSetProbe(gateway.url, "redline-base", interval_seconds=1)
    adapter = GoldenSetProbe(gateway.url, "chat", items=GOLDEN_SET[:6])
    try:
        n = len(GOLDEN_SET)
        got = values(base.run())
        key = (("model", "redline-base"), ("model_version", "base"))
        assert got == {
            (catalog.LLM_EVAL_REQUESTS_TOTAL.family, key): n,
            (catalog.LLM_EVAL_CORRECT_TOTAL.family, key): n,
        }
        got = values(base.run())  # cumulative
        assert got[(catalog.LLM_EVAL_REQUESTS_TOTAL.family, key)] == 2 * n

        # A regressed adapter version behind the gateway: every golden answer goes wrong.
        path = tmp_path / "chat" / "v2"
        path.mkdir(parents=True)
        for url in upstreams.values():
            body = {"lora_name": "chat", "lora_path": str(path)}
            assert httpx.post(f"{url}/v1/load_lora_adapter", json=body).status_code == 200
            faults = {"versions": {"v2": {"wrong_answer_probability": 1.0}}}
            httpx.post(f"{url}/admin/faults", json=faults).raise_for_status()
        got = values(adapter.run())
        key = (("model", "chat"), ("model_version", "v2"))
        assert got == {
            (catalog.LLM_EVAL_REQUESTS_TOTAL.family, key): 6,
            (catalog.LLM_EVAL_CORRECT_TOTAL.family, key): 0,
        }
        assert [a.correct for a in adapter.last_answers] == [False] * 6
        assert all(a.model_version == "v2" for a in adapter.last_answers)
    finally:
        base.close()
        adapter.close()


def test_golden_set_probe_fails_when_the_gateway_does_not_answer(
    upstreams: dict[str, str], gateway: ServerThread
) -> None:
    probe = GoldenSetProbe(gateway.url, "redline-base", timeout_seconds=1)
    cache = ProbeCache([probe])
    try:
        cache.run(probe.name)
        # Every region errors now: the gateway answers 5xx, the run fails, totals stay.
        for url in upstreams.values():
            httpx.post(f"{url}/admin/faults", json={"error_rate": 1.0}).raise_for_status()
        with pytest.raises(LlmProbeError, match="HTTP 500"):
            probe.run()
        cache.run(probe.name)
        registry = CollectorRegistry()
        registry.register(cache)
        assert (
            registry.get_sample_value(catalog.REDLINE_PROBE_SUCCESS.name, {"probe": probe.name})
            == 0
        )
        labels = {"model": "redline-base", "model_version": "base"}
        assert registry.get_sample_value(catalog.LLM_EVAL_REQUESTS_TOTAL.name, labels) == len(
            GOLDEN_SET
        )
        assert registry.get_sample_value(catalog.LLM_EVAL_CORRECT_TOTAL.name, labels) == len(
            GOLDEN_SET
        )
        for url in upstreams.values():
            httpx.post(f"{url}/admin/faults", json={}).raise_for_status()
        cache.run(probe.name)
        assert (
            registry.get_sample_value(catalog.REDLINE_PROBE_SUCCESS.name, {"probe": probe.name})
            == 1
        )
        assert registry.get_sample_value(catalog.LLM_EVAL_REQUESTS_TOTAL.name, labels) == 2 * len(
            GOLDEN_SET
        )
    finally:
        probe.close()


def test_probes_in_one_cache_pass_promtool(
    upstreams: dict[str, str], gateway: ServerThread
) -> None:
    probes = build_llm_probes(
        EndpointProbeSettings(upstreams=upstreams, interval_seconds=1),
        GoldenSetSettings(gateway_url=gateway.url, models=("redline-base",)),
    )
    assert [p.name for p in probes] == [
        "llm_endpoint_primary",
        "llm_endpoint_secondary",
        "llm_golden_redline_base",
    ]
    try:
        cache = ProbeCache(probes)
        for probe in probes:
            cache.run(probe.name)
        registry = CollectorRegistry()
        registry.register(cache)
        for region in upstreams:
            for check in ("healthz", "chat_dry_run"):
                labels = {"region": region, "probe": check}
                assert registry.get_sample_value(catalog.LLM_PROBE_SUCCESS.name, labels) == 1
        text = generate_latest(registry).decode()
        result = subprocess.run(
            [find_binary("promtool"), "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        for probe in probes:
            probe.close()


def test_disabled_probes_are_not_built() -> None:
    probes = build_llm_probes(
        EndpointProbeSettings(enabled=False, upstreams={"primary": "http://127.0.0.1:1"}),
        GoldenSetSettings(gateway_url=None),
    )
    assert probes == []


# ---- versions from the snapshot registry, the user's golden file, one tally ---------------


def _activate(registry: SnapshotRegistry, root: Path, model: str, version: str) -> None:
    weights = root / f"{model}-{version}"
    weights.mkdir(parents=True)
    (weights / "adapter_model.safetensors").write_bytes(version.encode() * 64)
    config = root / f"{model}-{version}.json"
    config.write_text(f'{{"version": "{version}"}}')
    registry.activate(model, registry.create(model, version, weights, config).snapshot_id)


def test_golden_answers_carry_the_registrys_version_not_the_header(
    gateway: ServerThread, tmp_path: Path
) -> None:
    registry = SnapshotRegistry(tmp_path / "snapshots")
    versions = ActiveVersions(registry, ttl_seconds=0.0)
    probe = GoldenSetProbe(gateway.url, "redline-base", items=GOLDEN_SET[:3], versions=versions)
    try:
        # No active snapshot of the model: the simulator's header ("base") is all there is.
        probe.run()
        assert {a.model_version for a in probe.last_answers} == {"base"}
        _activate(registry, tmp_path / "artifacts", "redline-base", "2024-06-01")
        got = values(probe.run())
        key = (("model", "redline-base"), ("model_version", "2024-06-01"))
        assert got[(catalog.LLM_EVAL_REQUESTS_TOTAL.family, key)] == 3
        assert {a.model_version for a in probe.last_answers} == {"2024-06-01"}
    finally:
        probe.close()


def test_golden_file_and_posted_verdicts_share_one_series(
    gateway: ServerThread, tmp_path: Path
) -> None:
    registry = SnapshotRegistry(tmp_path / "snapshots")
    _activate(registry, tmp_path / "artifacts", "redline-base", "r7")
    items = [
        GoldenPrompt(item.id, item.prompt, item.expected, matcher=matcher)
        for item, matcher in zip(
            GOLDEN_SET[:3], ("numeric-tolerance", "regex", "contains"), strict=True
        )
    ]
    items[1] = GoldenPrompt(items[1].id, items[1].prompt, r"\b72\b", matcher="regex")
    golden = tmp_path / "golden.jsonl"
    golden.write_text(golden_lines(items))
    token = tmp_path / "token"
    token.write_text("evaluator-token")
    disabled = ("endpoints", "index_staleness", "session_rpo", "keepalive", "drift")
    settings = ExporterSettings.model_validate(
        {
            **{name: {"enabled": False} for name in disabled},
            "models": {"root": str(registry.root), "interval_seconds": 1},
            "golden_set": {
                "gateway_url": gateway.url,
                "path": str(golden),
                "interval_seconds": 60,
                "models": ["redline-base"],
            },
            "evaluations": {"token_file": str(token)},
        }
    )
    exporter = build_exporter_app(settings, load_spec(None).spec)
    with serve_in_thread(exporter.app) as server:
        deadline = time.monotonic() + 20
        while exporter.cache.status()["llm_golden_redline_base"]["last_success"] is None:
            assert time.monotonic() < deadline, exporter.cache.status()
            time.sleep(0.1)
        answer = httpx.post(
            f"{server.url}/v1/evaluations",
            json=[{"model": "redline-base", "correct": False}] * 2,
            headers={"Authorization": "Bearer evaluator-token"},
        )
        assert answer.status_code == 200, answer.text
        text = httpx.get(f"{server.url}/metrics").text
    found = {
        (s.name, s.labels.get("model_version")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in (catalog.LLM_EVAL_REQUESTS_TOTAL.name, catalog.LLM_EVAL_CORRECT_TOTAL.name)
    }
    # Three golden answers (all right) and two posted verdicts (both wrong), one series each.
    assert found == {
        (catalog.LLM_EVAL_REQUESTS_TOTAL.name, "r7"): 5,
        (catalog.LLM_EVAL_CORRECT_TOTAL.name, "r7"): 3,
    }, text
    result = subprocess.run(
        [find_binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.returncode == 0, result.stdout + result.stderr
