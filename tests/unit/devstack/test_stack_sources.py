"""`redline up --source vllm`: the stack's pure builders without a gateway in the path.

The simulators publish the engine's exposition, Prometheus scrapes them with a `region` target
label, clients talk to the first region's simulator, the rules come from the spec with its
`sources` replaced by the engine's profile, and the latency red line pages a human (nothing can
reroute without the gateway). Without `--source` everything is as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.core.settings import load_settings
from redline.devstack.config import (
    build_part_commands,
    build_prometheus_config,
    build_prometheus_configs,
    build_source_spec,
    build_stack_spec,
    engine_series_match,
    pipeline_budget_seconds,
    render_settings,
)
from redline.devstack.drills.regression import regression_latency
from redline.devstack.errors import StackError
from redline.devstack.fakes.simulator import SimulatorSettings
from redline.devstack.layout import (
    GATEWAY_SOURCE,
    SERVICE_PARTS,
    StackConfigError,
    StackLayout,
    build_endpoints,
    build_part_names,
    build_ported_parts,
)
from redline.devstack.loadgen import LoadgenSettings
from redline.devstack.models import build_histogram_quantile
from redline.devstack.runtime import resolve_source
from redline.devstack.state import StackState, describe_urls
from redline.exporters.settings import load_exporter_settings
from redline.generate.outputs import RULE_FILE, RULES_DIR, build_outputs
from redline.remediation.settings import RemediationSettings
from redline.rules.records import p99_record, rollback_records
from redline.slo.load import apply_profile, load_spec, parse_spec
from redline.slo.sources import PROFILES
from redline.slo.spec import Spec

REGIONS = ("primary", "secondary")
VLLM = "vllm"


@pytest.fixture()
def local_spec() -> Spec:
    return apply_profile(load_spec().spec, "local")


@pytest.fixture()
def ports() -> dict[str, int]:
    parts = build_ported_parts(REGIONS, source=VLLM)
    return {part: 23000 + i for i, part in enumerate(parts)}


@pytest.fixture()
def layout(tmp_path: Path) -> StackLayout:
    return StackLayout(tmp_path / "run")


def sim_url(ports: dict[str, int], region: str) -> str:
    """A region's URL: its service front over its simulator pods."""
    return f"http://127.0.0.1:{ports[f'service-{region}']}"


def test_the_vllm_stack_starts_no_gateway_and_the_default_one_still_does() -> None:
    default = build_part_names(REGIONS)
    assert "gateway" in default and default == build_part_names(REGIONS, source=GATEWAY_SOURCE)
    names = build_part_names(REGIONS, source=VLLM)
    assert "gateway" not in names and "gateway" not in build_ported_parts(REGIONS, source=VLLM)
    assert [n for n in default if n != "gateway"] == list(names)
    assert names[: len(SERVICE_PARTS)] == SERVICE_PARTS and names[-1] == "loadgen"


def test_endpoints_without_a_gateway_send_clients_to_the_first_region(
    ports: dict[str, int],
) -> None:
    endpoints = build_endpoints(ports, REGIONS, source=VLLM)
    assert not endpoints.has_gateway
    assert endpoints.client_url == sim_url(ports, "primary")
    with pytest.raises(StackConfigError, match="the vllm stack runs no gateway"):
        _ = endpoints.gateway_url
    with pytest.raises(StackConfigError, match="no port chosen for: gateway"):
        build_endpoints(ports, REGIONS)  # the gateway stack still needs its port
    with pytest.raises(StackConfigError, match="--source tgi: the local stack runs"):
        build_endpoints(ports, REGIONS, source="tgi")
    gateway_ports = {**ports, "gateway": 24999}
    assert build_endpoints(gateway_ports, REGIONS).client_url == "http://127.0.0.1:24999"


def test_the_source_spec_replaces_sources_and_pages_on_latency(local_spec: Spec) -> None:
    assert build_source_spec(local_spec, GATEWAY_SOURCE) is local_spec
    spec = build_source_spec(local_spec, VLLM)
    assert spec.sources.profile == VLLM
    assert spec.sources.resolve().buckets == PROFILES[VLLM].buckets
    red = spec.red_lines.latency_p99
    assert red.playbook is None and red.includes_reroute is False
    assert red.threshold_seconds == local_spec.red_lines.latency_p99.threshold_seconds
    assert red.window == local_spec.red_lines.latency_p99.window == "30s"
    # Everything else is the user's spec as the local profile sees it.
    for field in ("service", "regions", "rollback", "slos", "timing", "rpo", "drift", "spot"):
        assert getattr(spec, field) == getattr(local_spec, field), field
    assert spec.red_lines.index_consistency == local_spec.red_lines.index_consistency
    # Recorded names downstream are the gateway stack's: drills and dashboards read the same.
    assert p99_record(spec) == p99_record(local_spec)
    assert rollback_records(spec) == rollback_records(local_spec)


def test_an_engine_source_adds_no_rule_evaluation_to_the_pipeline_budget(
    local_spec: Spec,
) -> None:
    """The rules read the engine's series where they are (no copy to wait an evaluation for)."""
    spec = build_source_spec(local_spec, VLLM)
    assert pipeline_budget_seconds(spec, 2) == pipeline_budget_seconds(local_spec, 2) == 5.0


def test_a_playbook_other_than_reroute_is_kept_and_an_engine_spec_behind_the_gateway_is_not(
    local_spec: Spec,
) -> None:
    red = local_spec.red_lines
    latency = red.latency_p99.model_copy(update={"playbook": "freeze_writes"})
    custom = local_spec.model_copy(
        update={"red_lines": red.model_copy(update={"latency_p99": latency})}
    )
    assert build_source_spec(custom, VLLM).red_lines.latency_p99.playbook == "freeze_writes"
    engine_spec = build_source_spec(local_spec, VLLM)
    behind_gateway = build_source_spec(engine_spec, GATEWAY_SOURCE)
    assert behind_gateway.sources.profile == GATEWAY_SOURCE


def test_the_stack_spec_of_the_vllm_stack_generates_engine_rules(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout
) -> None:
    endpoints = build_endpoints(ports, REGIONS, source=VLLM)
    spec = build_stack_spec(local_spec, endpoints, layout.token_file)
    assert spec.sources.profile == VLLM
    assert spec.receiver.url == f"http://127.0.0.1:{ports['remediation']}/alerts"
    rules = build_outputs(spec, "slo/specs/default.yaml")[RULES_DIR / RULE_FILE]
    groups = yaml.safe_load(rules)["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    latency = alerts["RedLineLatencyP99"]
    assert "playbook" not in latency["labels"]
    assert f"{p99_record(spec)} > 0.8" in latency["expr"]
    assert alerts["SemanticRollbackTwoSignal"]["labels"]["playbook"] == "semantic_rollback"
    assert "vllm:e2e_request_latency_seconds_bucket" in rules
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    assert "vllm:e2e_request_latency_seconds_bucket" not in recorded  # never shadowed


def test_prometheus_scrapes_every_simulator_with_its_region_and_no_gateway(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout
) -> None:
    endpoints = build_endpoints(ports, REGIONS, source=VLLM)
    config = build_prometheus_config(local_spec, endpoints, layout.rule_file)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert "gateway" not in jobs
    assert set(jobs) == {VLLM, "exporters", "remediation", "prometheus", "alertmanager"}
    targets = jobs[VLLM]["static_configs"]
    # Every pod, never the service fronts: each pod's counters stay its own series.
    assert targets == [
        {
            "targets": [f"127.0.0.1:{ports[f'simulator-{region}-{pod}']}"],
            "labels": {"region": region, "pod": f"{region}-{pod}"},
        }
        for region in REGIONS
        for pod in (0, 1)
    ]
    gateway_ports = {**ports, "gateway": 24999}
    default = build_prometheus_config(
        local_spec, build_endpoints(gateway_ports, REGIONS), layout.rule_file
    )
    assert [j["job_name"] for j in default["scrape_configs"]][0] == "gateway"
    assert VLLM not in {j["job_name"] for j in default["scrape_configs"]}


def test_federation_carries_the_engines_own_series(local_spec: Spec, layout: StackLayout) -> None:
    parts = build_ported_parts(REGIONS, REGIONS, source=VLLM)
    ports = {part: 25000 + i for i, part in enumerate(parts)}
    endpoints = build_endpoints(ports, REGIONS, prometheus_regions=REGIONS, source=VLLM)
    configs = build_prometheus_configs(local_spec, endpoints, layout.rule_file)
    first = {j["job_name"] for j in configs["prometheus-primary"]["scrape_configs"]}
    assert first == {VLLM, "exporters", "prometheus"}
    federate = configs["prometheus"]["scrape_configs"][0]
    match = federate["params"]["match[]"]
    assert match[-1] == engine_series_match(VLLM)[0]
    for name in ("vllm:e2e_request_latency_seconds_bucket", "vllm:request_success_total",
                 "vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds_count"):  # fmt: skip
        assert name in match[-1], name


def _read(tmp_path: Path, cls: type[Any], settings: dict[str, Any]) -> Any:
    path = tmp_path / f"{cls.__name__}.yaml"
    path.write_text(render_settings(settings))
    return load_settings(cls, path)


def test_every_part_of_the_vllm_stack_talks_to_the_simulators(
    local_spec: Spec,
    ports: dict[str, int],
    layout: StackLayout,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("REDLINE_"):
            monkeypatch.delenv(name)
    endpoints = build_endpoints(ports, REGIONS, source=VLLM)
    commands = {
        c.part: c
        for c in build_part_commands(local_spec, endpoints, layout, None, 30.0, 7, python="py")
    }
    assert set(commands) == set(build_part_names(REGIONS, source=VLLM)) - set(SERVICE_PARTS)
    primary = sim_url(ports, "primary")
    for region in REGIONS:
        for pod in (0, 1):
            settings = commands[f"simulator-{region}-{pod}"].settings
            simulator = _read(tmp_path, SimulatorSettings, settings)
            assert simulator.metrics_profile == VLLM and simulator.region == region
    loadgen = _read(tmp_path, LoadgenSettings, commands["loadgen"].settings)
    assert loadgen.gateway_url == primary
    receiver = _read(tmp_path, RemediationSettings, commands["remediation"].settings)
    assert receiver.serving.gateway_url == primary
    assert receiver.serving.upstreams == {r: sim_url(ports, r) for r in REGIONS}
    # The reroute's restore period is the drills' (5 s), not the spec's 120 s.
    assert receiver.reroute.restore_for_seconds == 5.0
    path = tmp_path / "exporters.yaml"
    path.write_text(render_settings(commands["exporters"].settings))
    exporter = load_exporter_settings(path)
    assert exporter.golden_set.gateway_url == primary
    gateway_ports = {**ports, "gateway": 24999}
    default = build_part_commands(
        local_spec, build_endpoints(gateway_ports, REGIONS), layout, None, 30.0, 7, python="py"
    )
    simulator = next(c for c in default if c.part == "simulator-primary-0")
    assert "metrics_profile" not in simulator.settings


def test_the_state_remembers_the_source(ports: dict[str, int], tmp_path: Path) -> None:
    state = StackState(run_dir=str(tmp_path), spec=None, spec_source="<embedded>",
                       host="127.0.0.1", regions=list(REGIONS), source=VLLM, ports=ports,
                       rate=50.0, seed=7, started_at=0.0)  # fmt: skip
    assert not state.endpoints().has_gateway
    spec = state.load_spec()
    assert spec.sources.profile == VLLM and spec.red_lines.latency_p99.playbook is None
    rows = dict(describe_urls(state))
    assert not any(what.startswith("Gateway") for what in rows)
    assert rows["Clients send to (OpenAI API)"].startswith(sim_url(ports, "primary"))
    # A state file written before `--source` existed is a gateway stack.
    data = state.model_dump(mode="json")
    del data["source"]
    data["ports"] = {**ports, "gateway": 24999}
    old = StackState.model_validate(data)
    assert old.source == GATEWAY_SOURCE and old.endpoints().has_gateway
    assert old.load_spec().red_lines.latency_p99.playbook == "reroute"


def test_the_source_follows_the_option_then_the_spec(local_spec: Spec) -> None:
    assert resolve_source(local_spec, None) == GATEWAY_SOURCE
    assert resolve_source(local_spec, VLLM) == VLLM
    with pytest.raises(StackError, match="--source sglang: the local stack runs"):
        resolve_source(local_spec, "sglang")
    text = "version: v1\nservice: chat\nregions: [a, b]\nsources: {profile: %s}\n"
    assert resolve_source(parse_spec(text % "vllm", "v.yaml").spec, None) == VLLM
    sglang = parse_spec(text % "sglang", "s.yaml").spec
    with pytest.raises(StackError, match="sources.profile: sglang: .* --source"):
        resolve_source(sglang, None)
    assert resolve_source(sglang, VLLM) == VLLM


def _estimate(spec: Spec, latencies: list[float]) -> float:
    return build_histogram_quantile(latencies, spec.sources.buckets, 0.99)


def test_the_regression_moves_requests_into_a_bucket_whose_p99_clears_the_gate(
    local_spec: Spec,
) -> None:
    healthy = [0.02 + 0.001 * i for i in range(150)]  # 20 to 170 ms, as the simulators serve
    gate_ratio = 1 + local_spec.rollback.p99_increase_ratio
    threshold = local_spec.red_lines.latency_p99.threshold_seconds
    for spec in (local_spec, build_source_spec(local_spec, VLLM)):
        baseline = _estimate(spec, healthy)
        added = regression_latency(spec, baseline)
        slowed = _estimate(spec, [seconds + added for seconds in healthy])
        assert slowed >= gate_ratio * baseline, (spec.sources.profile, baseline, added)
        assert slowed <= threshold and max(healthy) + added < threshold
    # The gateway's fine buckets: as before, 0.15 s clears the gate.
    assert regression_latency(local_spec, _estimate(local_spec, healthy)) == 0.15
    # vLLM's coarse ones: the baseline's estimate is 0.297 s (inside 0-0.3 s); +0.15 s would
    # leave most requests in that bucket, so every request is moved past 0.3 s.
    vllm = build_source_spec(local_spec, VLLM)
    assert _estimate(vllm, healthy) == pytest.approx(0.297)
    assert regression_latency(vllm, 0.297) == pytest.approx(0.32)
