"""The local stack's pure builders: each settings file is read back by its part's settings."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.core.settings import ServiceSettings, load_settings
from redline.devstack.config import (
    build_part_commands,
    build_prometheus_config,
    build_prometheus_configs,
    build_stack_spec,
    pipeline_budget_seconds,
    render_settings,
)
from redline.devstack.fakes.service import ServiceFrontSettings
from redline.devstack.fakes.simulator import SimulatorSettings
from redline.devstack.layout import (
    ADAPTER,
    SERVICE_PARTS,
    StackConfigError,
    StackLayout,
    build_endpoints,
    build_part_names,
    build_ported_parts,
    check_regions,
)
from redline.devstack.loadgen import LoadgenSettings
from redline.devstack.state import StackState, describe_urls, read_state, write_state
from redline.exporters.settings import load_exporter_settings
from redline.gateway import GatewaySettings
from redline.generate.outputs import ALERTMANAGER_FILE, RULE_FILE, RULES_DIR, build_outputs
from redline.platform.index import IndexSettings
from redline.platform.sessions import SessionSettings
from redline.remediation.playbooks.rollback.pods import pod_sources
from redline.remediation.settings import RemediationSettings
from redline.slo.load import SpecError, apply_profile, load_spec, parse_spec
from redline.slo.spec import Spec

REGIONS = ("primary", "secondary")


@pytest.fixture()
def local_spec() -> Spec:
    return apply_profile(load_spec().spec, "local")


@pytest.fixture()
def ports() -> dict[str, int]:
    return {part: 20000 + i for i, part in enumerate(build_ported_parts(REGIONS))}


@pytest.fixture()
def layout(tmp_path: Path) -> StackLayout:
    return StackLayout(tmp_path / "run")


def test_part_names_start_services_first_and_the_load_last() -> None:
    names = build_part_names(REGIONS)
    assert names[: len(SERVICE_PARTS)] == SERVICE_PARTS
    # Two pods per region by default, then each region's service front over them.
    assert names[len(SERVICE_PARTS) : len(SERVICE_PARTS) + 6] == (
        "simulator-primary-0",
        "simulator-primary-1",
        "simulator-secondary-0",
        "simulator-secondary-1",
        "service-primary",
        "service-secondary",
    )
    assert names[-1] == "loadgen"
    assert len(set(names)) == len(names)


def test_endpoints_reject_missing_duplicate_and_invalid_ports(ports: dict[str, int]) -> None:
    endpoints = build_endpoints(ports, REGIONS)
    assert endpoints.redis_url == f"redis://127.0.0.1:{ports['redis']}/0"
    assert endpoints.session_replica_url.endswith("/1")
    assert list(endpoints.upstreams) == list(REGIONS)
    with pytest.raises(StackConfigError, match="no port chosen for: gateway"):
        build_endpoints({k: v for k, v in ports.items() if k != "gateway"}, REGIONS)
    with pytest.raises(StackConfigError, match="same address"):
        build_endpoints({**ports, "gateway": ports["redis"]}, REGIONS)
    with pytest.raises(StackConfigError, match="1..65535"):
        build_endpoints({**ports, "gateway": 70000}, REGIONS)


def test_one_region_is_refused_with_the_reason() -> None:
    text = "version: v1\nservice: chat\nregions: [eu]\n"
    spec = parse_spec(text, "one.yaml").spec
    with pytest.raises(StackConfigError, match="at least two regions"):
        check_regions(spec)


def test_local_profile_windows_and_for_reach_the_rules(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout
) -> None:
    endpoints = build_endpoints(ports, REGIONS)
    stack_spec = build_stack_spec(local_spec, endpoints, layout.token_file)
    outputs = build_outputs(stack_spec, "slo/specs/default.yaml")
    rules, alertmanager = outputs[RULES_DIR / RULE_FILE], outputs[RULES_DIR / ALERTMANAGER_FILE]
    groups = yaml.safe_load(rules)["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert alerts["RedLineLatencyP99"]["for"] == "2s"
    assert (
        "redline:llm_request_duration_seconds:p99_30s > 0.8" in alerts["RedLineLatencyP99"]["expr"]
    )
    assert {g["interval"] for g in groups} == {"1s"}
    config = yaml.safe_load(alertmanager)
    assert config["route"]["group_wait"] == "1s"
    webhook = config["receivers"][0]["webhook_configs"][0]
    assert webhook["url"] == f"http://127.0.0.1:{ports['remediation']}/alerts"
    assert webhook["http_config"]["authorization"]["credentials_file"] == str(layout.token_file)


def test_profile_latency_window_is_checked_against_the_scrape_interval() -> None:
    text = (
        "version: v1\nservice: chat\nregions: [a, b]\n"
        "profiles:\n  fast: {scrape_interval_seconds: 10, latency_window: 5s}\n"
    )
    with pytest.raises(
        SpecError, match=r"latency_p99.window: error: window of 5 s is shorter than profiles.fast"
    ):
        parse_spec(text, "bad.yaml")


def test_prometheus_config_scrapes_every_http_part_at_the_profile_interval(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout
) -> None:
    endpoints = build_endpoints(ports, REGIONS)
    config = build_prometheus_config(local_spec, endpoints, layout.rule_file)
    assert config["global"]["scrape_interval"] == "1s"
    assert config["global"]["evaluation_interval"] == "1s"
    assert config["rule_files"] == [str(layout.rule_file)]
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == [f"127.0.0.1:{ports['alertmanager']}"]
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    assert jobs["gateway"] == [f"127.0.0.1:{ports['gateway']}"]
    assert jobs["exporters"] == [f"127.0.0.1:{ports['exporters']}"]
    assert jobs["remediation"] == [f"127.0.0.1:{ports['remediation']}"]


def test_pipeline_budget_is_scrape_eval_for_and_group_wait(local_spec: Spec) -> None:
    assert pipeline_budget_seconds(local_spec, 2) == 5.0
    assert pipeline_budget_seconds(load_spec().spec, 60) == 15 + 15 + 60 + 10
    # Through federation a sample is scraped twice before the global rules see it.
    assert pipeline_budget_seconds(local_spec, 2, federated=True) == 6.0


def test_regions_add_a_prometheus_per_region_started_before_the_global_one() -> None:
    names = build_part_names(REGIONS, REGIONS)
    services = names[: len(SERVICE_PARTS) + 2]
    assert services.index("prometheus-primary") < services.index("prometheus")
    assert services.index("prometheus-secondary") < services.index("prometheus")
    assert set(services) == {*SERVICE_PARTS, "prometheus-primary", "prometheus-secondary"}
    ported = build_ported_parts(REGIONS, REGIONS)
    assert {"prometheus-primary", "prometheus-secondary"} <= set(ported)
    with pytest.raises(StackConfigError, match="prometheus-secondary"):
        build_endpoints({part: 21000 + i for i, part in enumerate(build_ported_parts(REGIONS))},
                        REGIONS, prometheus_regions=REGIONS)  # fmt: skip


def test_federated_configs_split_the_jobs_and_only_the_global_one_has_rules(
    local_spec: Spec, layout: StackLayout
) -> None:
    ports = {part: 22000 + i for i, part in enumerate(build_ported_parts(REGIONS, REGIONS))}
    endpoints = build_endpoints(ports, REGIONS, prometheus_regions=REGIONS)
    assert endpoints.federated
    assert endpoints.prometheus_url == f"http://127.0.0.1:{ports['prometheus']}"
    assert endpoints.regional_prometheus_url("secondary").endswith(
        str(ports["prometheus-secondary"])
    )
    configs = build_prometheus_configs(local_spec, endpoints, layout.rule_file)
    assert set(configs) == {"prometheus", "prometheus-primary", "prometheus-secondary"}

    def jobs(part: str) -> dict[str, list[str]]:
        scrape = configs[part]["scrape_configs"]
        return {j["job_name"]: j["static_configs"][0]["targets"] for j in scrape}

    assert set(jobs("prometheus-primary")) == {"gateway", "exporters", "prometheus"}
    assert set(jobs("prometheus-secondary")) == {"remediation", "alertmanager", "prometheus"}
    assert jobs("prometheus-secondary")["prometheus"] == [
        f"127.0.0.1:{ports['prometheus-secondary']}"
    ]
    for region in REGIONS:
        regional = configs[f"prometheus-{region}"]
        assert regional["global"]["external_labels"]["region"] == region
        assert "rule_files" not in regional and "alerting" not in regional
    global_ = configs["prometheus"]
    assert global_["rule_files"] == [str(layout.rule_file)]
    assert "region" not in global_["global"]["external_labels"]
    federate = {j["job_name"]: j for j in global_["scrape_configs"]}
    assert set(federate) == {"federate-primary", "federate-secondary", "prometheus"}
    assert federate["federate-secondary"]["static_configs"][0]["targets"] == [
        f"127.0.0.1:{ports['prometheus-secondary']}"
    ]
    assert all(federate[f"federate-{r}"]["honor_labels"] for r in REGIONS)


def test_single_prometheus_config_is_unchanged_without_regions(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout
) -> None:
    endpoints = build_endpoints(ports, REGIONS)
    assert not endpoints.federated
    configs = build_prometheus_configs(local_spec, endpoints, layout.rule_file)
    assert configs == {
        "prometheus": build_prometheus_config(local_spec, endpoints, layout.rule_file)
    }
    assert layout.prometheus_config("prometheus") == layout.config_dir / "prometheus.yml"


def _commands(local_spec: Spec, ports: dict[str, int], layout: StackLayout) -> dict[str, Any]:
    endpoints = build_endpoints(ports, REGIONS)
    commands = build_part_commands(local_spec, endpoints, layout, None, 30.0, 7, python="py")
    return {c.part: c for c in commands}


def _read_back(tmp_path: Path, cls: type[ServiceSettings], settings: dict[str, Any]) -> Any:
    path = tmp_path / f"{cls.__name__}.yaml"
    path.write_text(render_settings(settings))
    return load_settings(cls, path)


def test_every_settings_file_is_valid_for_its_part(
    local_spec: Spec,
    ports: dict[str, int],
    layout: StackLayout,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("REDLINE_"):
            monkeypatch.delenv(name)
    commands = _commands(local_spec, ports, layout)
    assert set(commands) == set(build_part_names(REGIONS)) - set(SERVICE_PARTS)
    simulator = _read_back(tmp_path, SimulatorSettings, commands["simulator-secondary-1"].settings)
    assert simulator.region == "secondary"
    assert simulator.port == ports["simulator-secondary-1"]
    assert simulator.adapters == {ADAPTER: str(layout.adapter_dir("v1"))}
    gateway = _read_back(tmp_path, GatewaySettings, commands["gateway"].settings)
    assert list(gateway.upstreams) == list(REGIONS)
    assert gateway.profile == "local"
    receiver = _read_back(tmp_path, RemediationSettings, commands["remediation"].settings)
    workers = _read_back(tmp_path, RemediationSettings, commands["remediation-worker"].settings)
    assert (receiver.workers, workers.workers) == (1, 2)
    assert receiver.token_file == layout.token_file
    assert receiver.serving.gateway_url == f"http://127.0.0.1:{ports['gateway']}"
    assert set(receiver.vector_index.collections) == {"documents"}
    assert receiver.rollback.snapshot_root == layout.snapshots_dir
    for part in ("replicator", "index-writer"):
        index = _read_back(tmp_path, IndexSettings, commands[part].settings)
        assert index.primary_uri != index.replica_uri
    sessions = _read_back(tmp_path, SessionSettings, commands["session-replica"].settings)
    assert sessions.replica_url.endswith("/1")
    loadgen = _read_back(tmp_path, LoadgenSettings, commands["loadgen"].settings)
    assert loadgen.rate == 30.0
    path = tmp_path / "exporters.yaml"
    path.write_text(render_settings(commands["exporters"].settings))
    exporter = load_exporter_settings(path)
    assert exporter.endpoints.upstreams == dict(zip(REGIONS, [
        f"http://127.0.0.1:{ports['service-primary']}",
        f"http://127.0.0.1:{ports['service-secondary']}",
    ], strict=True))  # fmt: skip
    assert exporter.drift.reference == layout.drift_reference


def test_every_probe_runs_well_inside_the_stale_guard(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout
) -> None:
    settings = _commands(local_spec, ports, layout)["exporters"].settings
    stale = local_spec.timing.probe_stale_after_seconds
    sections = ("models", "endpoints", "golden_set", "index_staleness", "session_rpo",
                "keepalive", "drift")  # fmt: skip
    for section in sections:
        assert settings[section]["interval_seconds"] <= stale / 3, section


def test_each_part_is_started_with_its_own_settings_file(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout
) -> None:
    for part, command in _commands(local_spec, ports, layout).items():
        # The service fronts and the trace store are lean modules, not CLI commands.
        module = "redline.devstack.fakes.service" if part.startswith("service-") else "redline.cli"
        if part == "trace-store":
            module = "redline.devstack.tracestore"
        assert command.argv[:3] == ("py", "-m", module)
        assert command.argv[-2:] == ("--config", str(layout.settings_file(part)))
    commands = _commands(local_spec, ports, layout)
    assert commands["remediation-worker"].argv[3:5] == ("remediation", "worker")
    assert commands["loadgen"].argv[3] == "loadgen"


def _pod_url(ports: dict[str, int], region: str, pod: int) -> str:
    return f"http://127.0.0.1:{ports[f'simulator-{region}-{pod}']}"


def test_pods_each_get_a_port_settings_and_a_seed_behind_their_service_front(
    local_spec: Spec, layout: StackLayout, tmp_path: Path
) -> None:
    ports = {part: 23000 + i for i, part in enumerate(build_ported_parts(REGIONS, pods=3))}
    endpoints = build_endpoints(ports, REGIONS, pods=3)
    assert endpoints.pod_urls("secondary") == [_pod_url(ports, "secondary", i) for i in range(3)]
    commands = {
        c.part: c
        for c in build_part_commands(local_spec, endpoints, layout, None, 30.0, 7, python="py")
    }
    pods = [
        _read_back(tmp_path, SimulatorSettings, commands[f"simulator-primary-{i}"].settings)
        for i in range(3)
    ]
    assert [p.port for p in pods] == [ports[f"simulator-primary-{i}"] for i in range(3)]
    assert {p.region for p in pods} == {"primary"}
    assert len({p.seed for p in pods}) == 3  # each pod its own dice, the same faults
    assert len({p.faults.model_dump_json() for p in pods}) == 1
    front = _read_back(tmp_path, ServiceFrontSettings, commands["service-primary"].settings)
    assert front.port == ports["service-primary"] and front.region == "primary"
    assert front.pods == [_pod_url(ports, "primary", i) for i in range(3)]
    # The gateway, the probes and the clients call the fronts, as they would a Service.
    gateway = _read_back(tmp_path, GatewaySettings, commands["gateway"].settings)
    assert gateway.upstreams == {r: f"http://127.0.0.1:{ports[f'service-{r}']}" for r in REGIONS}


def test_the_rollback_is_given_every_pod_of_every_region(
    local_spec: Spec, ports: dict[str, int], layout: StackLayout, tmp_path: Path
) -> None:
    commands = _commands(local_spec, ports, layout)
    receiver = _read_back(tmp_path, RemediationSettings, commands["remediation"].settings)
    assert receiver.serving.upstreams == {
        r: f"http://127.0.0.1:{ports[f'service-{r}']}" for r in REGIONS
    }
    assert {r: s.urls for r, s in receiver.serving.pods.items()} == {
        r: [_pod_url(ports, r, 0), _pod_url(ports, r, 1)] for r in REGIONS
    }
    fleet = pod_sources(receiver.serving)
    assert sorted(fleet) == sorted(REGIONS) and all(len(s.urls) == 2 for s in fleet.values())


def test_pods_per_region_are_bounded_and_every_pod_needs_a_port(ports: dict[str, int]) -> None:
    with pytest.raises(StackConfigError, match="--pods 0"):
        build_endpoints(ports, REGIONS, pods=0)
    with pytest.raises(StackConfigError, match="no port chosen for: simulator-primary-2"):
        build_endpoints(ports, REGIONS, pods=3)
    one = {p: 24000 + i for i, p in enumerate(build_ported_parts(REGIONS, pods=1))}
    assert "simulator-primary-1" not in one
    assert build_endpoints(one, REGIONS, pods=1).pod_urls("primary") == [
        _pod_url(one, "primary", 0)
    ]


def test_the_state_file_remembers_the_pods(tmp_path: Path) -> None:
    ports = {p: 25000 + i for i, p in enumerate(build_ported_parts(REGIONS, pods=3))}
    state = StackState(run_dir=str(tmp_path), spec=None, spec_source="<embedded>",
                       host="127.0.0.1", regions=list(REGIONS), pods=3, ports=ports, rate=30.0,
                       seed=7, started_at=0.0)  # fmt: skip
    write_state(state.layout(), state)
    again = read_state(state.layout())
    assert again is not None and again.pods == 3
    assert again.endpoints().pod_urls("primary")[2] == _pod_url(ports, "primary", 2)
    rows = dict(describe_urls(again))
    assert (
        rows["Service primary (3 pods, round robin)"]
        == f"http://127.0.0.1:{ports['service-primary']}"
    )
