"""`redline up --replicas N`: N gateways, receivers and exporters, each with its port and
settings; Prometheus scrapes every replica, Alertmanager notifies every receiver, the load
generator spreads over the gateways, and the exporters elect a canary runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.devstack.config import (
    add_receiver_replicas,
    build_part_commands,
    build_prometheus_config,
    build_stack_spec,
)
from redline.devstack.layout import (
    SERVICE_PARTS,
    StackConfigError,
    StackLayout,
    build_endpoints,
    build_part_names,
    build_ported_parts,
    replica_base,
    replica_part,
)
from redline.devstack.loadgen import LoadgenSettings
from redline.devstack.state import StackState, describe_urls
from redline.exporters.settings import ExporterSettings, load_exporter_settings
from redline.generate.outputs import ALERTMANAGER_FILE, RULES_DIR, build_outputs
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import REMEDIATION_RECEIVER

REGIONS = ("primary", "secondary")
REPLICATED = ("gateway", "remediation", "exporters")


def _ports(replicas: int) -> dict[str, int]:
    parts = build_ported_parts(REGIONS, replicas=replicas)
    return {part: 21000 + i for i, part in enumerate(parts)}


def test_replica_names_round_trip() -> None:
    assert [replica_part("gateway", i) for i in range(3)] == ["gateway", "gateway-2", "gateway-3"]
    assert replica_base("exporters-2") == "exporters"
    assert replica_base("remediation") == "remediation"
    # Only replicated parts: a simulator pod or the worker keeps its name.
    assert replica_base("simulator-primary-1") == "simulator-primary-1"
    assert replica_base("remediation-worker") == "remediation-worker"


def test_two_replicas_add_a_second_of_each_part_after_the_first() -> None:
    one = build_part_names(REGIONS)
    two = build_part_names(REGIONS, replicas=2)
    assert set(two) - set(one) == {"gateway-2", "remediation-2", "exporters-2"}
    for part in REPLICATED:
        assert two.index(f"{part}-2") == two.index(part) + 1
    assert two[-1] == "loadgen"
    assert set(build_ported_parts(REGIONS, replicas=2)) >= {f"{p}-2" for p in REPLICATED}
    with pytest.raises(StackConfigError, match="--replicas 4"):
        build_endpoints(_ports(2), REGIONS, replicas=4)
    with pytest.raises(StackConfigError, match="no port chosen for: .*gateway-2"):
        build_endpoints(_ports(1), REGIONS, replicas=2)


def test_each_replica_gets_its_port_and_the_shared_stores(tmp_path: Path) -> None:
    spec = apply_profile(load_spec().spec, "local")
    ports = _ports(2)
    endpoints = build_endpoints(ports, REGIONS, replicas=2)
    layout = StackLayout(tmp_path / "run")
    commands = {
        c.part: c for c in build_part_commands(spec, endpoints, layout, None, 30.0, 7, "py")
    }
    assert set(commands) == set(build_part_names(REGIONS, replicas=2)) - set(SERVICE_PARTS)
    for part in REPLICATED:
        first, second = commands[part].settings, commands[f"{part}-2"].settings
        assert (first["port"], second["port"]) == (ports[part], ports[f"{part}-2"])
        assert first["redis_url"] == second["redis_url"] == endpoints.redis_url
        assert commands[f"{part}-2"].argv[-1] == str(layout.settings_file(f"{part}-2"))
    assert commands["remediation-2"].settings["audit_file"] == str(layout.audit_file)
    loadgen = LoadgenSettings.model_validate(commands["loadgen"].settings)
    assert loadgen.gateway_url == f"http://127.0.0.1:{ports['gateway']}"
    assert loadgen.more_gateway_urls == (f"http://127.0.0.1:{ports['gateway-2']}",)
    for part in ("exporters", "exporters-2"):
        path = tmp_path / f"{part}.yaml"
        path.write_text(yaml.safe_dump(commands[part].settings))
        exporter = load_exporter_settings(path)
        assert exporter.canary_lease_enabled
        assert exporter.canary_lease.ttl_seconds < spec.timing.probe_stale_after_seconds


def test_prometheus_scrapes_every_replica_in_one_job() -> None:
    spec = apply_profile(load_spec().spec, "local")
    ports = _ports(2)
    endpoints = build_endpoints(ports, REGIONS, replicas=2)
    config = build_prometheus_config(spec, endpoints, Path("/rules.yml"))
    jobs: dict[str, Any] = {job["job_name"]: job for job in config["scrape_configs"]}
    for part in REPLICATED:
        [targets] = [c["targets"] for c in jobs[part]["static_configs"]]
        assert targets == [f"127.0.0.1:{ports[part]}", f"127.0.0.1:{ports[f'{part}-2']}"]


def test_alertmanager_notifies_every_receiver(tmp_path: Path) -> None:
    spec = apply_profile(load_spec().spec, "local")
    endpoints = build_endpoints(_ports(2), REGIONS, replicas=2)
    stack_spec = build_stack_spec(spec, endpoints, tmp_path / "token")
    config = yaml.safe_load(build_outputs(stack_spec, "x")[RULES_DIR / ALERTMANAGER_FILE])
    urls = [f"{url}/alerts" for url in endpoints.receiver_urls]
    changed = add_receiver_replicas(config, urls)
    [receiver] = [r for r in changed["receivers"] if r["name"] == REMEDIATION_RECEIVER]
    hooks = receiver["webhook_configs"]
    assert [hook["url"] for hook in hooks] == urls
    # The same token and options on each: only the URL differs.
    [first] = [r for r in config["receivers"] if r["name"] == REMEDIATION_RECEIVER]
    [original] = first["webhook_configs"]
    assert all({**hook, "url": original["url"]} == original for hook in hooks)
    assert changed["route"] == config["route"]


def test_status_lists_every_replica(tmp_path: Path) -> None:
    ports = _ports(2)
    state = StackState(run_dir=str(tmp_path), spec=None, spec_source="embedded",
                       host="127.0.0.1", regions=list(REGIONS), ports=ports, rate=30.0, seed=7,
                       started_at=0.0, replicas=2)  # fmt: skip
    rows = dict(describe_urls(state))
    assert rows["Gateway 2 (OpenAI API)"].startswith(f"http://127.0.0.1:{ports['gateway-2']}/")
    assert rows["Exporters 2"] == f"http://127.0.0.1:{ports['exporters-2']}/metrics"
    assert rows["Remediation receiver 2"].startswith(f"http://127.0.0.1:{ports['remediation-2']}")
    assert state.endpoints().replicas == 2


def test_the_canary_lease_is_on_when_a_redis_url_is_given(tmp_path: Path) -> None:
    assert not ExporterSettings.model_validate({}).canary_lease_enabled
    assert ExporterSettings.model_validate({"redis_url": "redis://x:1/0"}).canary_lease_enabled
    off = {"redis_url": "redis://x:1/0", "canary_lease": {"enabled": False}}
    assert not ExporterSettings.model_validate(off).canary_lease_enabled
    path = tmp_path / "exporters.yaml"
    path.write_text("redis_url: redis://x:1/0\n")
    assert load_exporter_settings(path).canary_lease_enabled
