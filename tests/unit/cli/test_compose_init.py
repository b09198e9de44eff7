"""`redline compose init`: config files world-readable, tokens random and private, kept on a
re-run unless rotated, and clear errors on bad input (in process)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from redline.cli.main import app
from redline.generate.compose_config import SECRET_MODE, SECRETS, SECRETS_GID
from tests.support.compose import COMPOSE_FILE


@pytest.fixture
def compose_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "compose"
    folder.mkdir()
    shutil.copyfile(COMPOSE_FILE, folder / "docker-compose.yml")
    return folder


def _init(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compose", "init", *args])
    return result.exit_code, result.output


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_demo_writes_config_0644_and_random_tokens_for_the_containers_group_only(
    compose_dir: Path,
) -> None:
    code, output = _init("--dir", str(compose_dir), "--demo")
    assert code == 0, output
    config = compose_dir / "config"
    assert {_mode(p) for p in config.iterdir()} == {0o644}
    tokens = {name: (compose_dir / "secrets" / name) for name in SECRETS}
    # root here, so the group is set: owner rw, the containers' group r, nobody else
    assert {_mode(p) for p in tokens.values()} == {SECRET_MODE} and SECRET_MODE & 0o007 == 0
    assert {p.stat().st_gid for p in tokens.values()} == {SECRETS_GID}
    values = {p.read_text().strip() for p in tokens.values()}
    assert len(values) == len(SECRETS) and all(len(v) >= 40 for v in values)
    assert yaml.safe_load((config / "remediation.yml").read_text())["profile"] == "local"
    assert "COMPOSE_PROFILES=demo,milvus" in (compose_dir / ".env").read_text()


def test_a_rerun_keeps_the_tokens_unless_rotated(compose_dir: Path) -> None:
    assert _init("--dir", str(compose_dir), "--demo")[0] == 0
    token = compose_dir / "secrets" / "webhook-token"
    first = token.read_text()
    assert _init("--dir", str(compose_dir), "--demo")[0] == 0
    assert token.read_text() == first
    assert _init("--dir", str(compose_dir), "--demo", "--rotate-secrets")[0] == 0
    assert token.read_text() != first and _mode(token) == SECRET_MODE


def test_own_upstreams_reach_every_service_that_calls_them(compose_dir: Path) -> None:
    code, output = _init(
        "--dir", str(compose_dir),
        "--upstream", "primary=https://eu.llm.example.com",
        "--upstream", "secondary=https://us.llm.example.com",
        "--pod", "primary=http://10.0.0.5:8000", "--pod", "primary=http://10.0.0.6:8000",
        "--milvus-primary", "http://milvus-eu:19530", "--milvus-replica", "http://milvus-us:19530",
        "--collection", "rag_docs", "--dim", "768",
    )  # fmt: skip
    assert code == 0, output
    config = compose_dir / "config"
    gateway = yaml.safe_load((config / "gateway.yml").read_text())
    assert list(gateway["upstreams"].values()) == [
        "https://eu.llm.example.com", "https://us.llm.example.com"
    ]  # fmt: skip
    remediation = yaml.safe_load((config / "remediation.yml").read_text())
    assert remediation["serving"]["pods"]["primary"]["urls"] == [
        "http://10.0.0.5:8000", "http://10.0.0.6:8000"
    ]  # fmt: skip
    assert remediation["vector_index"]["collections"]["rag_docs"]["dim"] == 768
    index = yaml.safe_load((config / "index.yml").read_text())
    assert index["replica_uri"] == "http://milvus-us:19530"
    assert not (config / "simulator-primary.yml").exists()
    assert "COMPOSE_PROFILES=\n" in (compose_dir / ".env").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--upstream", "primary"], "expected REGION=URL"),
        (["--upstream", "primary=http://a"], "--upstream secondary=URL"),
        (["--upstream", "mars=http://a"], "not a region of the spec"),
        (["--demo", "--profile", "nope"], "unknown profile 'nope'"),
        (["--demo", "--redis", "cluster"], "--redis 'cluster': expected one of single, sentinel"),
    ],
)
def test_bad_input_is_named_and_nothing_is_written(
    compose_dir: Path, args: list[str], message: str
) -> None:
    code, output = _init("--dir", str(compose_dir), *args)
    assert code == 2 and message in output, output
    assert not (compose_dir / "config").exists() and not (compose_dir / "secrets").exists()


def test_a_folder_without_the_compose_file_is_refused(tmp_path: Path) -> None:
    code, output = _init("--dir", str(tmp_path))
    assert code == 2 and "no docker-compose.yml" in output


def test_sentinel_selects_the_ha_profile_and_writes_the_sentinels_configs(
    compose_dir: Path,
) -> None:
    code, output = _init("--dir", str(compose_dir), "--demo", "--redis", "sentinel")
    assert code == 0, output
    assert "COMPOSE_PROFILES=demo,ha,milvus" in (compose_dir / ".env").read_text()
    config = compose_dir / "config"
    assert {p.name for p in config.glob("sentinel-*.conf")} == {
        "sentinel-1.conf", "sentinel-2.conf", "sentinel-3.conf"
    }  # fmt: skip
    url = yaml.safe_load((config / "remediation.yml").read_text())["redis_url"]
    assert url.startswith("redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/")
    # The default spec acknowledges without replicas: init says what a failover can cost.
    assert "redis.min_replicas_ack is 0" in output
