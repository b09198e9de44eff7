"""Secure by default: every receiver route but the probes, /metrics and the schema needs the
bearer token; only an explicit setting opens them, with a warning."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from redline.core.settings import SettingsError
from redline.remediation.app import build_receiver_app
from redline.remediation.settings import RemediationSettings

OPEN = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect",
        "/redoc"}  # fmt: skip
JOB = "0" * 32


def _request(app: FastAPI, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request through ASGI, without the lifespan (no Redis client is opened)."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(send())


def _routes() -> list[tuple[str, str]]:
    """Every (method, path) the app documents, but the open ones."""
    app = build_receiver_app(RemediationSettings(), token=SecretStr("t0ken"))
    return [
        (method.upper(), path.replace("{job_id}", JOB))
        for path, operations in app.openapi()["paths"].items()
        if path not in OPEN
        for method in sorted(operations)
    ]


def test_the_receiver_has_the_routes_this_test_knows() -> None:
    # A new route is covered by the 401 test below automatically; this keeps the list honest.
    assert sorted(_routes()) == [("GET", "/jobs"), ("GET", f"/jobs/{JOB}"), ("POST", "/alerts")]


@pytest.mark.parametrize(("method", "path"), _routes())
@pytest.mark.parametrize(
    "header", [None, "Bearer wrong", "Basic dDBrZW4=", "Bearer", "bearer t0ken0", "t0ken"]
)
def test_every_route_needs_the_token(method: str, path: str, header: str | None) -> None:
    app = build_receiver_app(RemediationSettings(), token=SecretStr("t0ken"))
    headers = {"Authorization": header} if header is not None else {}
    # No lifespan: the token is checked before anything touches Redis.
    response = _request(app, method, path, headers=headers, json={})
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert "t0ken" not in response.text


def test_no_token_refuses_to_build_unless_explicitly_opened(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("REDLINE_WEBHOOK_TOKEN", raising=False)
    with pytest.raises(SettingsError, match="webhook token"):
        build_receiver_app(RemediationSettings())
    with caplog.at_level(logging.WARNING, logger="redline.remediation.app"):
        app = build_receiver_app(RemediationSettings(allow_unauthenticated=True))
    assert "WITHOUT a bearer token" in caplog.text
    # Open: the request gets past the token to the payload check.
    answer = _request(app, "POST", "/alerts", json={"version": "3"})
    assert answer.status_code == 422
