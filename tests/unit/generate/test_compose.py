"""compose/docker-compose.yml: mounted paths exist, images pinned, host ports are unique,
health-gated start order, provisioning consistent with the generated files (the checks against
the real CLI and `docker-compose config` are in tests/integration/generate)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.dashboards.render import DASHBOARDS_DIR
from redline.exporters.settings import load_exporter_settings
from redline.generate.compose import COMPOSE_DIR, build_compose_prometheus_config
from redline.generate.outputs import build_outputs
from redline.slo.load import load_spec
from tests.support.compose import COMPOSE, ROOT, load_compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def _host_path(source: str) -> Path | None:
    """The repo path of a bind mount's source (None for a named volume)."""
    if not source.startswith((".", "/")):
        return None
    return (COMPOSE / source).resolve()


def test_every_mounted_path_exists_in_the_repo(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    named = set(compose.get("volumes", {}))
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            path = _host_path(source)
            if path is None:
                assert source in named, f"{name}: volume {source} is not declared"
                continue
            assert path.exists(), f"{name}: mounts {source}, which is not in the repo"
            assert path.is_relative_to(ROOT), f"{name}: mounts {source} from outside the repo"
        build = service.get("build")
        if build:
            context = (COMPOSE / build["context"]).resolve()
            assert context == ROOT
            dockerfile = context / build["dockerfile"]
            for line in dockerfile.read_text("utf-8").splitlines():
                if line.startswith("COPY "):
                    for source in line.split()[1:-1]:
                        assert (context / source).exists(), f"Dockerfile copies missing {source}"
    for secret in compose["secrets"].values():
        assert (COMPOSE / secret["file"]).is_file()
    thanos = [v for v in services["thanos-sidecar"]["volumes"] if v.startswith("./thanos:")]
    assert thanos and (COMPOSE / "thanos" / "bucket-none.yml").is_file()


def test_generated_files_mounted_are_generated(services: dict[str, dict[str, Any]]) -> None:
    generated = {(ROOT / path).resolve() for path in build_outputs(load_spec().spec, "x")}
    mounted = {
        _host_path(volume.split(":")[0])
        for service in services.values()
        for volume in service.get("volumes", [])
    }
    for relative in (
        "rules/generated/redline.rules.yml",
        f"{COMPOSE_DIR}/prometheus.yml",
        f"{COMPOSE_DIR}/alertmanager.yml",
    ):
        assert (ROOT / relative).resolve() in mounted & generated, relative
    assert (ROOT / DASHBOARDS_DIR).resolve() in mounted


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"


def test_every_service_has_a_healthcheck_and_waits_on_conditions(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        profiles = set(service.get("profiles", []))
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services, f"{name}: depends on unknown {dependency}"
            assert rule["condition"] in {"service_healthy", "service_completed_successfully"}
            needed = set(services[dependency].get("profiles", []))
            assert not needed or needed & profiles, (
                f"{name} (profiles {profiles or 'default'}) depends on {dependency}, which "
                f"only runs under {needed}"
            )


def test_host_ports_do_not_collide(services: dict[str, dict[str, Any]]) -> None:
    seen: dict[str, str] = {}
    for name, service in services.items():
        for mapping in service.get("ports", []):
            host = str(mapping).rsplit(":", 1)[0]
            assert host not in seen, f"{name} and {seen.get(host)} both publish host port {host}"
            seen[host] = name
    assert {"3000", "9090", "9093", "10904"} <= set(seen)


def test_alertmanagers_form_a_cluster(services: dict[str, dict[str, Any]]) -> None:
    for name in ("alertmanager-1", "alertmanager-2"):
        peers = {f for f in services[name]["command"] if f.startswith("--cluster.peer=")}
        assert peers == {"--cluster.peer=alertmanager-1:9094", "--cluster.peer=alertmanager-2:9094"}
    config = yaml.safe_load((ROOT / COMPOSE_DIR / "alertmanager.yml").read_text("utf-8"))
    webhook = config["receivers"][0]["webhook_configs"][0]
    assert webhook["url"].startswith("http://remediation:9095/")
    token = webhook["http_config"]["authorization"]["credentials_file"]
    assert "--token-file=" + token in services["remediation"]["command"]


def _service_port(services: dict[str, dict[str, Any]], host: str, port: str) -> None:
    assert host in services or host == "localhost", f"no service {host}"


def test_scrape_targets_and_datasources_are_compose_services(
    services: dict[str, dict[str, Any]],
) -> None:
    prometheus = build_compose_prometheus_config(load_spec().spec)
    for job in prometheus["scrape_configs"]:
        for target in job["static_configs"][0]["targets"]:
            host, port = target.split(":")
            _service_port(services, host, port)
    datasources = yaml.safe_load(
        (COMPOSE / "grafana/provisioning/datasources/datasources.yml").read_text("utf-8")
    )["datasources"]
    for source in datasources:
        host, port = source["url"].removeprefix("http://").split(":")
        _service_port(services, host, port)
        assert any(port in flag for flag in services[host].get("command", [])) or port == "9090"
    provider = yaml.safe_load(
        (COMPOSE / "grafana/provisioning/dashboards/dashboards.yml").read_text("utf-8")
    )["providers"][0]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert _host_path(mounts[provider["options"]["path"]]) == (ROOT / DASHBOARDS_DIR).resolve()


def test_exporter_settings_file_is_valid() -> None:
    settings = load_exporter_settings(COMPOSE / "redline" / "exporters.yml")
    assert settings.port == 9109 and settings.redis_url == "redis://redis:6379/0"
