"""Multi-region on one machine: two regional Prometheus servers and a global one federating
them, all real processes; the global one sees both regions' series and evaluates the rules."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from redline.devstack.multiregion import (
    GLOBAL_PART,
    build_multiregion_configs,
    regional_part,
    write_multiregion_configs,
)
from redline.devstack.processes import Service, free_port, start_prometheus
from redline.generate.outputs import RULE_FILE, RULES_DIR, build_outputs, write_outputs
from redline.rules.build import p99_record
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Spec

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
STALENESS = catalog.VECTORDB_INDEX_STALENESS_SECONDS.name


def _exporter(spec: Spec, region: str) -> tuple[CollectorRegistry, Any]:
    """A real /metrics endpoint with a region's gateway histogram and an index gauge."""
    registry = CollectorRegistry()
    duration = Histogram(
        spec.sources.resolve().required_name("request_duration"),
        "End-to-end latency.",
        ("region", "served_region", "rerouted", "model", "model_version", "status"),
        buckets=spec.sources.buckets,
        registry=registry,
    )
    staleness = Gauge(STALENESS, "Staleness.", ("collection", "replica"), registry=registry)
    Gauge("unrelated_series", "Not federated.", registry=registry).set(1)
    for index in range(50):
        duration.labels(region, region, "false", "chat", "v1", "200").observe(0.1 + index / 100)
    staleness.labels("documents", "replica").set(2.0 if region == spec.regions[0] else 3.0)
    return registry, duration


@pytest.fixture()
def topology(
    tmp_path: Path,
) -> Iterator[tuple[Spec, dict[str, Service], dict[str, Any], dict[str, Any]]]:
    spec = apply_profile(load_spec().spec, "local")
    write_outputs(tmp_path, build_outputs(spec, "spec.yaml"))
    servers, histograms, jobs, job_regions, by_region = [], {}, [], {}, {}
    for region in spec.regions:
        registry, histograms[region] = _exporter(spec, region)
        port = free_port()
        server, thread = start_http_server(port, HOST, registry)
        servers.append((server, thread))
        by_region[region] = server
        jobs.append(
            {"job_name": f"gateway-{region}", "static_configs": [{"targets": [f"{HOST}:{port}"]}]}
        )
        job_regions[f"gateway-{region}"] = region
    base = {
        "global": {
            "scrape_interval": "1s",
            "evaluation_interval": "1s",
            "external_labels": {"service": spec.service},
        },
        "rule_files": [str(tmp_path / RULES_DIR / RULE_FILE)],
        "scrape_configs": jobs,
    }
    ports = {regional_part(r): free_port() for r in spec.regions} | {GLOBAL_PART: free_port()}
    addresses = {part: f"{HOST}:{port}" for part, port in ports.items()}
    configs = build_multiregion_configs(spec, base, addresses, job_regions)
    paths = write_multiregion_configs(tmp_path / "configs", configs)
    services: dict[str, Service] = {}
    try:
        for part, path in paths.items():
            services[part] = start_prometheus(tmp_path / part, path, port=ports[part])
        yield spec, services, histograms, by_region
    finally:
        for service in services.values():
            service.stop()
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def _query(client: httpx.Client, service: Service, expr: str) -> list[dict[str, Any]]:
    body = client.get(f"{service.url}/api/v1/query", params={"query": expr}).json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _eventually(client: httpx.Client, service: Service, expr: str, want: int) -> list[Any]:
    deadline = time.monotonic() + 20
    result: list[Any] = []
    while time.monotonic() < deadline:
        result = _query(client, service, expr)
        if len(result) >= want:
            return result
        time.sleep(0.25)
    return result


def test_global_prometheus_sees_both_regions_and_evaluates_the_rules(
    topology: tuple[Spec, dict[str, Service], dict[str, Any], dict[str, Any]],
) -> None:
    spec, services, histograms, _ = topology
    glob = services[GLOBAL_PART]
    with httpx.Client(timeout=5) as client:
        count = f"{spec.sources.resolve().required_name('request_duration')}_count"
        seen = _eventually(client, glob, count, len(spec.regions))
        assert {s["metric"]["region"] for s in seen} == set(spec.regions)
        # A series without a region label gets its regional Prometheus' external label.
        staleness = _eventually(client, glob, STALENESS, 2)
        assert {(s["metric"]["region"], s["value"][1]) for s in staleness} == {
            (spec.regions[0], "2"),
            (spec.regions[1], "3"),
        }
        # Only the catalog's series are federated.
        assert _query(client, glob, "unrelated_series") == []
        # The regional servers stamp nothing on their own data and evaluate no rules.
        for region in spec.regions:
            regional = services[regional_part(region)]
            local = _query(client, regional, STALENESS)
            assert local and all("region" not in s["metric"] for s in local)
            groups = client.get(f"{regional.url}/api/v1/rules").json()["data"]["groups"]
            assert groups == []
        # The global one evaluates the cross-region rules on federated data: new observations
        # in the second region only move that region's P99.
        for _ in range(200):
            histograms[spec.regions[1]].labels(
                spec.regions[1], spec.regions[1], "false", "chat", "v1", "200"
            ).observe(2.5)
        p99 = _eventually(client, glob, f"{p99_record(spec)} > 1", 1)
        assert [s["metric"]["region"] for s in p99] == [spec.regions[1]]
        rules = client.get(f"{glob.url}/api/v1/rules").json()["data"]["groups"]
        assert any(group["name"] == "redline-red-lines" for group in rules)


def test_a_target_gone_from_its_region_goes_stale_globally(
    topology: tuple[Spec, dict[str, Service], dict[str, Any], dict[str, Any]],
) -> None:
    """/federate stamps samples with their own time and Prometheus writes no staleness marker
    for timestamped series; without `honor_timestamps: false` the global view would keep a dead
    exporter's last values for 5 minutes and an absent() alert could not fire."""
    spec, services, _, exporters = topology
    glob = services[GLOBAL_PART]
    gone = spec.regions[1]
    with httpx.Client(timeout=5) as client:
        assert len(_eventually(client, glob, STALENESS, 2)) == 2
        exporters[gone].shutdown()
        exporters[gone].server_close()
        deadline = time.monotonic() + 20
        regions = {gone}
        while time.monotonic() < deadline and gone in regions:
            result = _query(client, glob, STALENESS)
            regions = {s["metric"]["region"] for s in result}
            time.sleep(0.25)
        assert regions == {spec.regions[0]}
