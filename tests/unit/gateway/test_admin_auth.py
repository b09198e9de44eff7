"""The gateway's /admin endpoints are secure by default: a bearer token (file or env, compared
in constant time), or explicitly opened with a start-up warning, or 403 with the way to
configure a token. Read-only endpoints stay open. In-process (the ASGI app, no lifespan: the
admin endpoints touch neither Redis nor an upstream)."""

from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from pydantic import SecretStr, ValidationError

from redline.gateway import GatewayConfigError, GatewaySettings, build_gateway_app
from redline.gateway.app import build_admin_auth
from redline.platform.spot import AdminAuth
from redline.slo.load import load_spec

TOKEN = "s3cret-admin-token"
# The spec's regions as the nodes (no warning about unknown regions); nothing is ever sent there.
UPSTREAMS = {"primary": "http://127.0.0.1:9", "secondary": "http://127.0.0.1:9"}
SPEC = load_spec(None).spec

ENDPOINTS = [
    pytest.param("POST", "/admin/spot/drain", {"node": "primary", "budget_seconds": 1}, id="drain"),
    pytest.param("POST", "/admin/spot/release", {"node": "primary"}, id="release"),
    pytest.param("GET", "/admin/spot/nodes/primary", None, id="node-status"),
]
ADMIN_ROUTES = {"/admin/spot/drain", "/admin/spot/release", "/admin/spot/nodes/{node}"}


@dataclass
class Client:
    """Requests through ASGI, without the lifespan (nothing opens Redis or an upstream pool)."""

    app: FastAPI

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(send())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


def client(**settings: Any) -> Client:
    app = build_gateway_app(
        GatewaySettings(upstreams=UPSTREAMS, **settings), SPEC, CollectorRegistry()
    )
    return Client(app)


def call(
    c: Client, method: str, path: str, body: dict[str, Any] | None, auth: str | None = None
) -> httpx.Response:
    headers = {} if auth is None else {"authorization": auth}
    return c.request(method, path, json=body, headers=headers)


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text(f"{TOKEN}\n")
    return path


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_without_a_token_the_answer_is_401(
    token_file: Path, method: str, path: str, body: dict[str, Any] | None
) -> None:
    response = call(client(admin_token_file=token_file), method, path, body)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "AuthenticationError"
    assert "Authorization: Bearer" in response.json()["error"]["message"]


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
@pytest.mark.parametrize(
    "auth",
    [
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer nope",
        f"Basic {TOKEN}",
        TOKEN,
        "Bearer ",
    ],
)
def test_a_wrong_token_is_401(
    token_file: Path, method: str, path: str, body: dict[str, Any] | None, auth: str
) -> None:
    response = call(client(admin_token_file=token_file), method, path, body, auth)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_the_right_token_is_200(
    token_file: Path, method: str, path: str, body: dict[str, Any] | None
) -> None:
    response = call(client(admin_token_file=token_file), method, path, body, f"Bearer {TOKEN}")
    assert response.status_code == 200, response.text
    assert response.json()["node"] == "primary"
    lower = call(client(admin_token_file=token_file), method, path, body, f"bearer  {TOKEN} ")
    assert lower.status_code == 200, "the scheme is case-insensitive, spaces are not the token"


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_the_token_can_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, method: str, path: str, body: dict[str, Any] | None
) -> None:
    monkeypatch.setenv("REDLINE_ADMIN_TOKEN", TOKEN)
    c = client()
    assert call(c, method, path, body).status_code == 401
    assert call(c, method, path, body, f"Bearer {TOKEN}").status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_unconfigured_is_403_and_says_how_to_configure_a_token(
    method: str, path: str, body: dict[str, Any] | None
) -> None:
    c = client()
    for auth in (None, f"Bearer {TOKEN}"):
        response = call(c, method, path, body, auth)
        assert response.status_code == 403
        error = response.json()["error"]
        assert error["type"] == "PermissionDeniedError"
        for hint in ("no admin token is configured", "admin_token_file", "--admin-token-file",
                     "REDLINE_ADMIN_TOKEN", "--admin-open"):  # fmt: skip
            assert hint in error["message"]


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_open_with_the_flag_works_and_warns_at_start_up(
    method: str, path: str, body: dict[str, Any] | None, caplog: pytest.LogCaptureFixture
) -> None:
    c = client(admin_open=True)
    assert levels(caplog, admin_open=True) == [logging.WARNING]
    assert "gateway admin API is OPEN" in caplog.records[0].getMessage()
    assert call(c, method, path, body).status_code == 200
    assert call(c, method, path, body, "Bearer anything").status_code == 200


def levels(caplog: pytest.LogCaptureFixture, **settings: Any) -> list[int]:
    """The levels of what the app logs at start-up (its lifespan announces how /admin is
    guarded; the lifespan itself opens Redis, so its announcement is called here)."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, "redline.gateway.app"):
        build_admin_auth(GatewaySettings(upstreams=UPSTREAMS, **settings)).announce(
            logging.getLogger("redline.gateway.app")
        )
    return [r.levelno for r in caplog.records]


def test_only_an_open_admin_api_is_a_start_up_warning(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert levels(caplog) == [logging.INFO]
    assert "refuses every request (403)" in caplog.records[0].getMessage()
    assert levels(caplog, admin_token_file=token_file) == [logging.INFO]
    assert TOKEN not in caplog.text, "the token is never logged"
    assert levels(caplog, admin_open=True) == [logging.WARNING]


def test_every_admin_route_is_covered_here(token_file: Path) -> None:
    # A new /admin route fails this test until it is added to ENDPOINTS (and so tested above).
    paths = client(admin_token_file=token_file).app.openapi()["paths"]
    assert {p for p in paths if p.startswith("/admin")} == ADMIN_ROUTES
    others = {(p, m) for p, ops in paths.items() if not p.startswith("/admin") for m in ops}
    assert others == {("/v1/chat/completions", "post"), ("/v1/completions", "post"),
                      ("/v1/models", "get"), ("/metrics", "get"), ("/healthz", "get")}  # fmt: skip


@pytest.mark.parametrize("settings", [{}, {"admin_token_file": "token"}, {"admin_open": True}])
def test_read_only_endpoints_stay_open(settings: dict[str, Any], token_file: Path) -> None:
    if "admin_token_file" in settings:
        settings = {"admin_token_file": token_file}
    c = client(**settings)
    assert c.get("/healthz").status_code == 200
    assert c.get("/metrics").status_code == 200


def test_the_token_is_checked_before_the_body_or_the_node(token_file: Path) -> None:
    c = client(admin_token_file=token_file)
    good = {"authorization": f"Bearer {TOKEN}"}
    unknown = {"node": "zz", "budget_seconds": 1}
    assert c.post("/admin/spot/drain", json=unknown).status_code == 401
    assert c.get("/admin/spot/nodes/zz").status_code == 401
    assert c.post("/admin/spot/drain", content=b"{").status_code == 401
    missing = c.post("/admin/spot/drain", json=unknown, headers=good)
    assert missing.status_code == 404 and "upstreams: primary, secondary" in missing.text
    assert c.get("/admin/spot/nodes/zz", headers=good).status_code == 404
    bad = c.post("/admin/spot/drain", json={"node": "primary", "budget_seconds": -1}, headers=good)
    assert bad.status_code == 422 and "budget_seconds" in bad.text
    assert c.post("/admin/spot/drain", content=b"{", headers=good).status_code == 400
    drained = c.post("/admin/spot/drain", json={"node": "secondary", "budget_seconds": 1},
                     headers=good)  # fmt: skip
    assert drained.status_code == 200 and c.get("/healthz").json()["draining"] == ["secondary"]
    assert c.post("/admin/spot/release", json={"node": "secondary"}).status_code == 401
    assert c.get("/healthz").json()["draining"] == ["secondary"], (
        "a refused release changes nothing"
    )


def test_tokens_are_compared_in_constant_time(
    token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    c = client(admin_token_file=token_file)
    assert c.get("/admin/spot/nodes/primary", headers={"authorization": "Bearer x"}).is_client_error
    assert compared == [(b"x", TOKEN.encode())]


def test_open_and_a_token_are_exclusive(token_file: Path) -> None:
    with pytest.raises(ValidationError, match="exclusive"):
        GatewaySettings(upstreams=UPSTREAMS, admin_open=True, admin_token_file=token_file)
    with pytest.raises(ValidationError, match="exclusive"):
        GatewaySettings(upstreams=UPSTREAMS, admin_open=True, admin_token=SecretStr(TOKEN))


def test_an_unusable_token_refuses_to_start(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(GatewayConfigError, match="is empty"):
        client(admin_token_file=empty)
    with pytest.raises(GatewayConfigError, match="cannot read"):
        client(admin_token_file=tmp_path / "missing")
    with pytest.raises(GatewayConfigError, match="empty"):
        client(admin_token=SecretStr("  "))


def test_admin_auth_refuses_a_token_and_open_together() -> None:
    with pytest.raises(ValueError, match="exclusive"):
        AdminAuth("x", TOKEN, True, "")
    with pytest.raises(ValueError, match="empty"):
        AdminAuth("x", "", False, "")
    assert AdminAuth("x", None, False, "how").mode == "closed"
    refusal = AdminAuth("x", None, False, "how").check(f"Bearer {TOKEN}")
    assert refusal is not None and refusal.status == 403 and refusal.message.endswith("how")
