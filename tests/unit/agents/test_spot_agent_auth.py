"""The spot agent's POST /notice is secure by default: its own token (file or env), else the
gateways' token, or explicitly opened with a start-up warning, or 403 with the way to configure
a token; /healthz stays open. In-process, without the lifespan (no agent thread, no Redis)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr, ValidationError

from redline.agents.spot import SpotAgent, SpotAgentSettings, build_agent_app, build_agent_auth
from redline.platform.spot import SpotAgentError
from redline.slo.load import load_spec

TOKEN = "agent-t0ken"
GATEWAY_TOKEN = "gateway-t0ken"
SPOT = load_spec(None).spec.spot
# Only the notice route is mutating; the list is checked against the app's routes below.
ENDPOINTS = [pytest.param("POST", "/notice", {"in_seconds": 30}, id="notice")]
READ_ONLY = {"/healthz", "/metrics", "/state"}


def settings_of(**values: Any) -> SpotAgentSettings:
    return SpotAgentSettings.model_validate(
        {"node": "spot-a", "provider": "manual", "redis_url": "redis://127.0.0.1:9/0", **values}
    )


def build(**values: Any) -> FastAPI:
    return build_agent_app(settings_of(**values), SPOT)


def levels(caplog: pytest.LogCaptureFixture, **values: Any) -> list[int]:
    """The levels of what the agent logs at start-up about /notice (its lifespan announces it;
    the lifespan also starts the agent's threads, so the announcement is called here)."""
    caplog.clear()
    logger = logging.getLogger("redline.agents.spot")
    with caplog.at_level(logging.DEBUG, logger.name):
        build_agent_auth(settings_of(**values))[1].announce(logger)
    return [r.levelno for r in caplog.records]


def call(
    app: FastAPI, method: str, path: str, body: dict[str, Any] | None, auth: str | None = None
) -> httpx.Response:
    headers = {} if auth is None else {"authorization": auth}

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            return await client.request(method, path, json=body, headers=headers)

    return asyncio.run(send())


def queued(app: FastAPI) -> int:
    agent: SpotAgent = app.state.agent
    return agent.notices.qsize()


def secret(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    return path


def test_the_mutating_routes_are_the_ones_tested_here(tmp_path: Path) -> None:
    app = build(admin_token_file=secret(tmp_path, "t", TOKEN))
    paths = set(app.openapi()["paths"])
    assert paths - READ_ONLY == {"/notice"}


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
@pytest.mark.parametrize(
    "auth",
    [None, "Bearer nope", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN, f"Bearer {GATEWAY_TOKEN}"],
)
def test_no_or_a_wrong_token_is_401_and_queues_nothing(
    tmp_path: Path, method: str, path: str, body: dict[str, Any], auth: str | None
) -> None:
    app = build(
        admin_token_file=secret(tmp_path, "t", TOKEN),
        gateway_token_file=secret(tmp_path, "g", GATEWAY_TOKEN),
    )
    response = call(app, method, path, body, auth)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert queued(app) == 0


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_the_right_token_is_200(
    tmp_path: Path, method: str, path: str, body: dict[str, Any]
) -> None:
    app = build(admin_token_file=secret(tmp_path, "t", TOKEN))
    response = call(app, method, path, body, f"Bearer {TOKEN}")
    assert response.status_code == 200, response.text
    assert response.json()["node"] == "spot-a" and queued(app) == 1


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_the_token_can_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, method: str, path: str, body: dict[str, Any]
) -> None:
    monkeypatch.setenv("REDLINE_ADMIN_TOKEN", TOKEN)
    app = build()
    assert call(app, method, path, body).status_code == 401
    assert call(app, method, path, body, f"Bearer {TOKEN}").status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_without_its_own_token_the_gateways_token_guards_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, path: str, body: dict[str, Any]
) -> None:
    from_file = build(gateway_token_file=secret(tmp_path, "g", GATEWAY_TOKEN))
    assert call(from_file, method, path, body).status_code == 401
    assert call(from_file, method, path, body, f"Bearer {GATEWAY_TOKEN}").status_code == 200
    monkeypatch.setenv("REDLINE_GATEWAY_TOKEN", GATEWAY_TOKEN)
    from_env = build()
    assert call(from_env, method, path, body).status_code == 401
    assert call(from_env, method, path, body, f"Bearer {GATEWAY_TOKEN}").status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_unconfigured_is_403_and_says_how_to_configure_a_token(
    method: str, path: str, body: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = build()
    assert levels(caplog) == [logging.INFO]
    for auth in (None, f"Bearer {TOKEN}"):
        response = call(app, method, path, body, auth)
        assert response.status_code == 403
        detail = response.json()["detail"]
        for hint in ("no admin token is configured", "--admin-token-file", "REDLINE_ADMIN_TOKEN",
                     "gateway_token_file", "--token-file", "--admin-open"):  # fmt: skip
            assert hint in detail
    assert queued(app) == 0


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_open_with_the_flag_works_and_warns_at_start_up(
    tmp_path: Path,
    method: str,
    path: str,
    body: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Open wins over the gateways' token, which the agent still needs for the gateways.
    values = {"admin_open": True, "gateway_token_file": secret(tmp_path, "g", GATEWAY_TOKEN)}
    app = build(**values)
    assert levels(caplog, **values) == [logging.WARNING]
    assert "spot agent admin API is OPEN" in caplog.records[0].getMessage()
    assert GATEWAY_TOKEN not in caplog.text
    assert call(app, method, path, body).status_code == 200
    assert queued(app) == 1


def test_healthz_stays_open(tmp_path: Path) -> None:
    for app in (build(), build(admin_token_file=secret(tmp_path, "t", TOKEN))):
        assert call(app, "GET", "/healthz", None).status_code == 200


def test_open_and_its_own_token_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="exclusive"):
        SpotAgentSettings(admin_open=True, admin_token_file=secret(tmp_path, "t", TOKEN))
    with pytest.raises(ValidationError, match="exclusive"):
        SpotAgentSettings(admin_open=True, admin_token=SecretStr(TOKEN))


def test_an_unusable_token_refuses_to_start(tmp_path: Path) -> None:
    empty = secret(tmp_path, "empty", "")
    with pytest.raises(SpotAgentError, match="is empty"):
        build(admin_token_file=empty)
    with pytest.raises(SpotAgentError, match="is empty"):
        build(gateway_token_file=empty)
    with pytest.raises(SpotAgentError, match="cannot read"):
        build(admin_token_file=tmp_path / "missing")
    with pytest.raises(SpotAgentError, match="empty"):
        build(admin_token=SecretStr(" "))
