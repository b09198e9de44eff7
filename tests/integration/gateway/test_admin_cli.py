"""The admin flags of `redline gateway` and `redline spot-agent run`, as real processes: an
open admin API is a WARNING in the log at start-up, a token file guards it, nothing configured
answers 403, and an open API with a token is refused before serving."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from redline.cli import app as cli_app
from redline.devstack.processes import Service, free_port, http_ok, start_service

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
TOKEN = "cli-admin-t0ken"


@pytest.fixture()
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n")
    return path


def redline(services: list[Service], tmp_path: Path, name: str, *args: str, port: int) -> Service:
    """`redline ARGS` in its own process, with no REDLINE_* variable from this one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")}
    env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, "-m", "redline.cli", *args, "--port", str(port)]
    ready = http_ok(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
    service = start_service(name, argv, tmp_path / f"{name}.log", port, ready, 60.0, env=env)
    services.append(service)
    return service


def gateway(services: list[Service], tmp_path: Path, redis_url: str, *flags: str) -> Service:
    upstream = f"primary=http://127.0.0.1:{free_port()}"  # never called: only /admin is
    args = ("gateway", "--upstream", upstream, "--redis-url", redis_url, *flags)
    return redline(services, tmp_path, f"gateway{len(services)}", *args, port=free_port())


def log(service: Service) -> str:
    return service.log_path.read_text(errors="replace")


def test_gateway_admin_open_serves_without_a_token_and_warns(
    services: list[Service], tmp_path: Path, redis_url: str
) -> None:
    gw = gateway(services, tmp_path, redis_url, "--admin-open")
    release = httpx.post(f"{gw.url}/admin/spot/release", json={"node": "primary"})
    assert release.status_code == 200 and release.json() == {"node": "primary", "released": False}
    assert "WARNING" in log(gw) and "gateway admin API is OPEN" in log(gw)


def test_gateway_admin_token_file_guards_admin_and_unset_is_403(
    services: list[Service], tmp_path: Path, redis_url: str, token_file: Path
) -> None:
    guarded = gateway(services, tmp_path, redis_url, "--admin-token-file", str(token_file))
    closed = gateway(services, tmp_path, redis_url)
    node = "/admin/spot/nodes/primary"
    assert httpx.get(f"{guarded.url}{node}").status_code == 401
    assert (
        httpx.get(f"{guarded.url}{node}", headers={"authorization": "Bearer x"}).status_code == 401
    )
    ok = httpx.get(f"{guarded.url}{node}", headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["node"] == "primary"
    refused = httpx.get(f"{closed.url}{node}", headers={"authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 403 and "--admin-token-file" in refused.text
    for service in (guarded, closed):
        assert "admin API is OPEN" not in log(service)
        assert httpx.get(f"{service.url}/healthz").status_code == 200


def test_spot_agent_notice_takes_the_gateway_token_or_opens_with_the_flag(
    services: list[Service], tmp_path: Path, redis_url: str, token_file: Path
) -> None:
    base = ("spot-agent", "run", "--provider", "manual", "--redis-url", redis_url)
    guarded = redline(services, tmp_path, "agent-a", *base, "--node", "spot-a",
                      "--gateway-token-file", str(token_file), port=free_port())  # fmt: skip
    opened = redline(services, tmp_path, "agent-b", *base, "--node", "spot-b", "--admin-open",
                     port=free_port())  # fmt: skip
    notice = {"in_seconds": 3600, "reason": "admin cli test"}
    assert httpx.post(f"{guarded.url}/notice", json=notice).status_code == 401
    accepted = httpx.post(f"{guarded.url}/notice", json=notice,
                          headers={"authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert accepted.status_code == 200 and accepted.json()["node"] == "spot-a"
    assert httpx.post(f"{opened.url}/notice", json=notice).status_code == 200
    assert "spot agent admin API is OPEN" in log(opened) and "WARNING" in log(opened)
    assert "admin API is OPEN" not in log(guarded)


def test_open_and_a_token_are_refused_before_serving(token_file: Path) -> None:
    runner = CliRunner()
    both = ["--admin-open", "--admin-token-file", str(token_file)]
    served = runner.invoke(cli_app, ["gateway", "--upstream", "primary=http://127.0.0.1:9", *both])
    assert served.exit_code == 2 and "exclusive" in served.output
    agent = runner.invoke(cli_app, ["spot-agent", "run", "--node", "a", "--provider", "manual",
                                    *both])  # fmt: skip
    assert agent.exit_code == 2 and "exclusive" in agent.output
    missing = runner.invoke(
        cli_app,
        ["gateway", "--upstream", "primary=http://127.0.0.1:9", "--admin-token-file",
         str(token_file.with_name("missing"))],
    )  # fmt: skip
    assert missing.exit_code == 2 and "cannot read" in missing.output
