"""`POST /alerts` is answered by a bare ASGI handler in front of FastAPI; under a root path the
FastAPI route serves it. Both must give the same answer to every bad request (no Redis needed:
all of these are refused before the store is touched)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from redline.remediation.app import build_receiver_app
from redline.remediation.settings import RemediationSettings

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}
LIMIT = 4096

CASES = {
    "no token": ({"Content-Type": "application/json"}, b"{}"),
    "wrong token": ({"Authorization": "Bearer t0ken0", "Content-Type": "application/json"}, b"{}"),
    "basic scheme": ({"Authorization": f"Basic {TOKEN}"}, b"{}"),
    "text/plain": ({**AUTH, "Content-Type": "text/plain"}, b"{}"),
    "no content type": (AUTH, b"{}"),
    "too large": (JSON, b" " * (LIMIT + 1)),
    "truncated JSON": (JSON, b'{"version": "4",'),
    "not an object": (JSON, b"[1, 2]"),
    "version 3": (JSON, json.dumps({"version": "3"}).encode()),
    "json with charset, empty": ({**JSON, "Content-Type": "application/json; charset=utf-8"}, b""),
}


def _answer(app: FastAPI, root_path: str, headers: dict[str, str], body: bytes) -> httpx.Response:
    """POST `body` to `{root_path}/alerts` through ASGI, without the lifespan (no Redis)."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
            return await client.post(f"{root_path}/alerts", content=body, headers=headers)

    return asyncio.run(send())


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fast_path_answers_like_the_fastapi_route(case: str) -> None:
    app = build_receiver_app(RemediationSettings(max_body_bytes=LIMIT), token=SecretStr(TOKEN))
    headers, body = CASES[case]
    fast = _answer(app, "", headers, body)
    routed = _answer(app, "/hook", headers, body)
    assert 400 <= fast.status_code < 500, fast.text
    assert (routed.status_code, routed.json()) == (fast.status_code, fast.json())
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert fast.headers.get("www-authenticate") == routed.headers.get("www-authenticate")
    assert fast.json()["message"], "every refusal says why in one line"
    assert TOKEN not in fast.text
