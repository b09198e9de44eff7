"""compose/docker-compose.yml: mounted paths exist, images pinned, host ports are unique,
health-gated start order, provisioning consistent with the generated files (the checks against
the real CLI and `docker-compose config` are in tests/integration/generate)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.core.settings import ServiceSettings, load_settings
from redline.dashboards.render import DASHBOARDS_DIR
from redline.devstack.fakes.simulator import SimulatorSettings
from redline.devstack.loadgen import LoadgenSettings
from redline.exporters.settings import ExporterSettings
from redline.gateway.settings import GatewaySettings
from redline.generate.compose import SERVICE_PORTS, TOKEN_PATH, build_compose_prometheus_config
from redline.generate.compose_config import (
    CONFIG_DIR,
    SECRETS,
    SECRETS_DIR,
    SECRETS_GID,
    SENTINEL_MASTER,
    SENTINEL_PORT,
    SENTINELS,
    ComposeConfigError,
    ComposeOptions,
    RedisTopology,
    build_compose_config,
    build_upstreams,
    redis_url,
)
from redline.platform.index.settings import IndexSettings
from redline.platform.sessions import SessionSettings
from redline.remediation.settings import RemediationSettings
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


INIT_WRITES = {COMPOSE / CONFIG_DIR, COMPOSE / SECRETS_DIR}
"""Folders `redline compose init` fills: not in the repo, checked against its output below."""


def test_every_mounted_path_exists_in_the_repo_or_is_written_by_init(
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
            if any(path == d or path.is_relative_to(d) for d in INIT_WRITES):
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
    assert {Path(s["file"]).name for s in compose["secrets"].values()} == set(SECRETS)
    thanos = [v for v in services["thanos-sidecar"]["volumes"] if v.startswith("./thanos:")]
    assert thanos and (COMPOSE / "thanos" / "bucket-none.yml").is_file()


def _config_files_used(service: dict[str, Any]) -> set[str]:
    """Files under /etc/redline a service's command or healthcheck names."""
    words = [*service.get("command", []), *service.get("healthcheck", {}).get("test", [])]
    return {
        w.removeprefix("/etc/redline/") for w in map(str, words) if w.startswith("/etc/redline/")
    }


@pytest.mark.parametrize(
    ("demo", "redis"),
    [(True, "single"), (False, "single"), (True, "sentinel")],
    ids=["demo", "own-upstreams", "demo-sentinel"],
)
def test_init_writes_every_file_the_services_use(
    services: dict[str, dict[str, Any]], demo: bool, redis: RedisTopology
) -> None:
    spec = load_spec().spec
    upstreams = {} if demo else {r: f"https://{r}.llm.example.com" for r in spec.regions}
    files = build_compose_config(
        spec, "version: v1\n", ComposeOptions(demo=demo, upstreams=upstreams, redis=redis)
    )
    profiles = ({"demo", "milvus"} if demo else set()) | ({"ha"} if redis == "sentinel" else set())
    for name, service in services.items():
        if service.get("profiles") and not profiles & set(service["profiles"]):
            continue
        for used in _config_files_used(service):
            assert used in files, f"{name} uses /etc/redline/{used}, which init does not write"
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("./config/"):
                assert source.removeprefix("./config/") in files, f"{name}: {source}"
    assert files["../.env"].splitlines()[-1] == f"COMPOSE_PROFILES={','.join(sorted(profiles))}"


def test_init_refuses_a_missing_or_unknown_upstream() -> None:
    spec = load_spec().spec
    with pytest.raises(ComposeConfigError, match="--upstream secondary=URL"):
        build_upstreams(spec, ComposeOptions(upstreams={"primary": "http://a"}))
    with pytest.raises(ComposeConfigError, match="not a region of the spec"):
        build_upstreams(spec, ComposeOptions(upstreams={"mars": "http://a"}))


NOT_SETTINGS = {"prometheus.yml", "alertmanager.yml", "redline.rules.yml"}
SETTINGS_CLASSES: dict[str, type[ServiceSettings]] = {
    "gateway.yml": GatewaySettings,
    "exporters.yml": ExporterSettings,
    "remediation.yml": RemediationSettings,
    "index.yml": IndexSettings,
    "sessions.yml": SessionSettings,
    "loadgen.yml": LoadgenSettings,
    "simulator-primary.yml": SimulatorSettings,
    "simulator-secondary.yml": SimulatorSettings,
}


def test_every_settings_file_init_writes_is_valid_for_its_service(tmp_path: Path) -> None:
    files = build_compose_config(load_spec().spec, "version: v1\n", ComposeOptions(demo=True))
    settings_files = {n for n in files if n.endswith(".yml") and n not in NOT_SETTINGS}
    assert settings_files == set(SETTINGS_CLASSES)
    for name, cls in SETTINGS_CLASSES.items():
        path = tmp_path / name
        path.write_text(files[name], "utf-8")
        settings = load_settings(cls, path)
        assert settings.host == "0.0.0.0" or name in {"index.yml", "sessions.yml", "loadgen.yml"}
    remediation = yaml.safe_load(files["remediation.yml"])
    assert remediation["workers"] >= 2 and remediation["token_file"] == TOKEN_PATH


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


def test_the_ports_redline_configures_are_the_ports_the_services_listen_on(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, port in SERVICE_PORTS.items():
        service = services[name]
        published = {str(m).rsplit(":", 1)[1] for m in service.get("ports", [])}
        words = " ".join(map(str, service.get("command", [])))
        assert str(port) in published or f":{port}" in words, f"{name} does not listen on {port}"


def test_every_container_reading_a_secret_is_in_the_secrets_group(
    services: dict[str, dict[str, Any]],
) -> None:
    """Compose bind-mounts file secrets with their host owner and mode: a container user reads
    them through the group `redline compose init` gives them."""
    dockerfile = (COMPOSE / "Dockerfile").read_text("utf-8")
    assert f"--gid {SECRETS_GID}" in dockerfile and "USER redline" in dockerfile
    for name, service in services.items():
        if not service.get("secrets"):
            continue
        redline = service["image"].startswith("redline:")
        assert redline or str(SECRETS_GID) in service.get("group_add", []), name


def test_alertmanagers_form_a_cluster(services: dict[str, dict[str, Any]]) -> None:
    for name in ("alertmanager-1", "alertmanager-2"):
        peers = {f for f in services[name]["command"] if f.startswith("--cluster.peer=")}
        assert peers == {"--cluster.peer=alertmanager-1:9094", "--cluster.peer=alertmanager-2:9094"}
    files = build_compose_config(load_spec().spec, "", ComposeOptions(demo=True))
    config = yaml.safe_load(files["alertmanager.yml"])
    webhook = config["receivers"][0]["webhook_configs"][0]
    assert webhook["url"].startswith("http://remediation:9095/")
    token = webhook["http_config"]["authorization"]["credentials_file"]
    assert token == yaml.safe_load(files["remediation.yml"])["token_file"]
    assert "webhook-token" in services["remediation"]["secrets"]


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


def test_the_sentinel_topology_points_every_redis_url_at_the_sentinels(
    services: dict[str, dict[str, Any]],
) -> None:
    spec = load_spec().spec
    files = build_compose_config(spec, "version: v1\n", ComposeOptions(demo=True, redis="sentinel"))
    url = redis_url(ComposeOptions(redis="sentinel"))
    assert url == (
        f"redis+sentinel://{','.join(f'{s}:{SENTINEL_PORT}' for s in SENTINELS)}"
        f"/{SENTINEL_MASTER}/0"
    )
    single = build_compose_config(spec, "version: v1\n", ComposeOptions(demo=True))
    for name, text in files.items():
        if not name.endswith(".yml") or name in NOT_SETTINGS:
            continue
        # Every Redis URL of every settings file, nested sections included, is the Sentinels'.
        found = re.findall(r"redis(?:\+sentinel)?://\S+", text)
        assert found == re.findall(r"redis\+sentinel://\S+", text), name
        assert len(found) == len(re.findall(r"redis://\S+", single[name])), name
    assert "/redline/1" in files["sessions.yml"]  # the replica session store: db 1
    # Each Sentinel: its own config, announcing its service name, on the port its check pings.
    for name in SENTINELS:
        config = files[f"{name}.conf"]
        assert f"sentinel announce-ip {name}\n" in config
        assert f"sentinel monitor {SENTINEL_MASTER} redis 6379 2\n" in config
        assert config.index("resolve-hostnames yes") < config.index("sentinel monitor")
        assert f"port {SENTINEL_PORT}\n" in config
        assert str(SENTINEL_PORT) in services[name]["healthcheck"]["test"]
        assert "ha" in services[name]["profiles"]
        assert f"./config/{name}.conf:/etc/redis/sentinel.conf:ro" in services[name]["volumes"]
    replica = " ".join(services["redis-replica"]["command"])
    assert "--replicaof redis 6379" in replica and "--replica-announce-ip redis-replica" in replica
    assert "--replica-announce-ip redis" in " ".join(services["redis"]["command"])
    # Neither topology writes the other's files.
    assert not any(name.endswith(".conf") for name in single)
