"""The safety net of `redline.core.failover`: an error of a Redis failing over that escapes a
route is a 503 with Retry-After in the app's own error shape; any other error stays a 500."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis.exceptions
import redis.sentinel
from fastapi import FastAPI

from redline.core.failover import RETRY_AFTER_SECONDS, install_failover_handlers
from redline.core.redisconn import FAILOVER_ERRORS, ReplicaAckError

RAISED: dict[str, Exception] = {
    "connection": redis.exceptions.ConnectionError("Connection refused"),
    "timeout": redis.exceptions.TimeoutError("Timeout reading from socket"),
    "readonly": redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    "no-master": redis.sentinel.MasterNotFoundError("No master found for 'redline'"),
    "not-acked": ReplicaAckError("only 0 of 1 replica(s) acknowledged the write"),
    "socket": ConnectionResetError(104, "Connection reset by peer"),
}


def build_app() -> FastAPI:
    app = FastAPI()

    @app.get("/raise/{name}")
    async def fail(name: str) -> dict[str, Any]:
        if name == "bug":
            raise ValueError("a bug")
        raise RAISED[name]

    install_failover_handlers(app, lambda message: {"problem": message}, "test")
    return app


def get(path: str) -> httpx.Response:
    """GET `path` from a fresh app, in process; a 500 is answered, not raised."""

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.get(path)

    return asyncio.run(call())


@pytest.mark.parametrize("name", sorted(RAISED))
def test_a_failover_error_becomes_503_with_retry_after(name: str) -> None:
    assert isinstance(RAISED[name], FAILOVER_ERRORS)
    answer = get(f"/raise/{name}")
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    message = answer.json()["problem"]
    assert type(RAISED[name]).__name__ in message and "retry" in message
    # The error's text (addresses, hosts) stays in the log, out of the answer.
    assert str(RAISED[name]) not in message


def test_any_other_error_stays_a_500() -> None:
    assert get("/raise/bug").status_code == 500
