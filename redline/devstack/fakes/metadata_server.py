"""A local cloud instance-metadata server: AWS IMDSv2 or GCP metadata, with a spot notice knob.

It speaks the parts of each protocol that a spot termination handler uses, as the clouds do:

AWS (IMDSv2, tokens required):
- `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds: 1..21600` answers a session
  token (text) and echoes the TTL header; a missing or out-of-range TTL is 400, a request carrying
  `X-Forwarded-For` is 403 (IMDS refuses tokens to proxied requests), any other method is 405.
- every `GET /latest/meta-data/...` needs `X-aws-ec2-metadata-token` with a live token, else 401.
- `spot/instance-action` is `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}` once a notice
  was issued and 404 before (the time is whole seconds: a notice for `in_seconds` shows up exactly
  `in_seconds` before it, up to a second after it was asked for); `spot/termination-time` is the
  time alone; `events/recommendations/rebalance` is `{"noticeTime": "..."}` once a rebalance
  recommendation was issued, 404 before.
  Bodies are `text/plain`, as IMDS sends them.

GCP:
- every `GET /computeMetadata/v1/...` needs `Metadata-Flavor: Google`, else 403; requests carrying
  `X-Forwarded-For` are refused with 403. Answers carry `Metadata-Flavor: Google` and an `ETag`.
- `instance/preempted` is `FALSE`, then `TRUE` once preempted. With `wait_for_change=true` the
  request hangs until the value's ETag differs from `last_etag` (at once if it already differs;
  without `last_etag`, until the next change), or until `timeout_sec` passes, then answers the
  current value.

Admin (not part of either protocol; for drills and tests): `POST /admin/notice {"in_seconds",
"action"}` issues an interruption notice (AWS: instance-action with time = now + in_seconds; GCP:
preempted TRUE), `POST /admin/rebalance` a rebalance recommendation, `POST /admin/reset` returns to
a fresh instance, `GET /admin/state` shows what is set.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from redline.core.settings import ServiceSettings
from redline.platform.spot import (
    FLAVOR_HEADER,
    TOKEN_HEADER,
    TOKEN_TTL_HEADER,
    format_metadata_time,
)

DEFAULT_METADATA_PORT = 8169
MAX_TOKEN_TTL = 21600
MAX_WAIT_SECONDS = 3600.0
_NOT_FOUND = (
    '<?xml version="1.0" encoding="iso-8859-1"?>\n<!DOCTYPE html>\n<html>\n <head>\n'
    "  <title>404 - Not Found</title>\n </head>\n <body>\n  <h1>404 - Not Found</h1>\n"
    " </body>\n</html>\n"
)
_GCP_FORBIDDEN = (
    "Your client does not have permission to get URL /computeMetadata/v1/{path} from this "
    "server. Missing Metadata-Flavor:Google header.\n"
)


class MetadataSettings(ServiceSettings):
    """Settings of `redline simulate metadata`."""

    provider: Literal["aws", "gcp"] = Field("aws", description="Which metadata protocol to speak.")
    instance_id: str = Field(
        "i-0123456789abcdef0", min_length=1, description="The instance id answered."
    )


class NoticeRequest(BaseModel):
    """`POST /admin/notice`: issue an interruption notice."""

    model_config = ConfigDict(extra="forbid")
    in_seconds: float = Field(120.0, gt=0, le=86400, description="Until the action (AWS time).")
    action: Literal["terminate", "stop", "hibernate"] = Field(
        "terminate", description="AWS instance-action's action."
    )


@dataclass
class MetadataState:
    """What the instance's metadata says now, and who waits for it to change."""

    provider: str
    instance_id: str
    tokens: dict[str, float] = field(default_factory=dict)  # token -> expiry (monotonic)
    action: str | None = None
    action_time: float | None = None
    action_visible_at: float = 0.0
    rebalance_time: float | None = None
    preempted: bool = False
    generation: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def bump(self) -> None:
        """Record a change and wake every long-poll waiting for one."""
        self.generation += 1
        self.changed.set()
        self.changed = asyncio.Event()

    def etag(self, value: str) -> str:
        """The ETag of a value (changes whenever the value does)."""
        return hashlib.sha256(f"{self.instance_id}\0{value}".encode()).hexdigest()[:16]


def _aws_text(body: str, status: int = 200) -> Response:
    return PlainTextResponse(body, status_code=status, headers={"server": "EC2ws"})


def _aws_error(status: int, title: str) -> Response:
    body = _NOT_FOUND.replace("404 - Not Found", f"{status} - {title}")
    return Response(body, status_code=status, media_type="text/html", headers={"server": "EC2ws"})


def build_metadata_app(settings: MetadataSettings) -> FastAPI:
    """The metadata server's ASGI app (one app per simulated instance)."""
    state = MetadataState(settings.provider, settings.instance_id)
    app = FastAPI(title=f"redline {settings.provider} metadata", docs_url=None, redoc_url=None)
    app.state.metadata = state
    if settings.provider == "aws":
        _aws_routes(app, state)
    else:
        _gcp_routes(app, state)

    @app.post("/admin/notice")
    async def notice(body: NoticeRequest) -> dict[str, Any]:
        now = time.time()
        terminate_at = now + body.in_seconds
        issued_at = now
        if state.provider == "aws":
            # IMDS times are whole seconds; the notice shows up exactly in_seconds before its
            # time (as AWS issues it two minutes before), so a reader can tell when it was issued.
            terminate_at = float(math.ceil(terminate_at))
            issued_at = terminate_at - body.in_seconds
            state.action = body.action
            state.action_time = terminate_at
            state.action_visible_at = issued_at
        state.preempted = True
        state.bump()
        return {"issued_at": issued_at, "terminate_at": terminate_at, **_describe(state)}

    @app.post("/admin/rebalance")
    async def rebalance() -> dict[str, Any]:
        state.rebalance_time = time.time()
        state.bump()
        return _describe(state)

    @app.post("/admin/reset")
    async def reset() -> dict[str, Any]:
        state.action = state.action_time = state.rebalance_time = None
        state.action_visible_at = 0.0
        state.preempted = False
        state.tokens.clear()
        state.bump()
        return _describe(state)

    @app.get("/admin/state")
    async def describe() -> dict[str, Any]:
        return _describe(state)

    return app


def _describe(state: MetadataState) -> dict[str, Any]:
    return {
        "provider": state.provider,
        "instance_id": state.instance_id,
        "action": state.action,
        "action_time": state.action_time,
        "rebalance_time": state.rebalance_time,
        "preempted": state.preempted,
        "generation": state.generation,
    }


def _aws_routes(app: FastAPI, state: MetadataState) -> None:
    @app.api_route("/latest/api/token", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def token(request: Request) -> Response:
        if request.method != "PUT":
            return _aws_error(405, "Method Not Allowed")
        if "x-forwarded-for" in request.headers:
            return _aws_error(403, "Forbidden")
        raw = request.headers.get(TOKEN_TTL_HEADER, "").strip()
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TOKEN_TTL:
            return _aws_error(400, "Missing or Invalid Parameters")
        ttl = int(raw)
        value = secrets.token_urlsafe(42)
        now = time.monotonic()
        state.tokens = {t: e for t, e in state.tokens.items() if e > now}
        state.tokens[value] = now + ttl
        response = _aws_text(value)
        response.headers[TOKEN_TTL_HEADER] = str(ttl)
        return response

    @app.get("/latest/meta-data/{path:path}")
    async def meta_data(path: str, request: Request) -> Response:
        presented = request.headers.get(TOKEN_HEADER)
        expiry = state.tokens.get(presented or "")
        if expiry is None or expiry <= time.monotonic():
            return _aws_error(401, "Unauthorized")
        path = path.rstrip("/")
        if path == "instance-id":
            return _aws_text(state.instance_id)
        if path == "instance-life-cycle":
            return _aws_text("spot")
        published = state.action_time is not None and time.time() >= state.action_visible_at
        if path == "spot/instance-action" and published:
            assert state.action_time is not None
            body = {"action": state.action, "time": format_metadata_time(state.action_time)}
            return _aws_text(json.dumps(body))
        if path == "spot/termination-time" and published:
            assert state.action_time is not None
            return _aws_text(format_metadata_time(state.action_time))
        if path == "events/recommendations/rebalance" and state.rebalance_time is not None:
            return _aws_text(json.dumps({"noticeTime": format_metadata_time(state.rebalance_time)}))
        return _aws_error(404, "Not Found")


def _gcp_routes(app: FastAPI, state: MetadataState) -> None:
    def answer(value: str) -> Response:
        return Response(
            value,
            media_type="application/text",
            headers={"metadata-flavor": "Google", "etag": state.etag(value), "server": "Metadata"},
        )

    def current(path: str) -> str | None:
        if path == "instance/preempted":
            return "TRUE" if state.preempted else "FALSE"
        if path == "instance/id":
            return state.instance_id
        if path == "instance/scheduling/provisioning-model":
            return "SPOT"
        return None

    @app.get("/computeMetadata/v1/{path:path}")
    async def metadata(path: str, request: Request) -> Response:
        if "x-forwarded-for" in request.headers:
            return PlainTextResponse("Forbidden\n", status_code=403)
        if request.headers.get(FLAVOR_HEADER, "").lower() != "google":
            return PlainTextResponse(_GCP_FORBIDDEN.format(path=path), status_code=403)
        path = path.rstrip("/")
        value = current(path)
        if value is None:
            return Response("Not Found\n", status_code=404, media_type="text/html")
        params = request.query_params
        if params.get("wait_for_change", "").lower() != "true":
            return answer(value)
        try:
            timeout = float(params.get("timeout_sec", MAX_WAIT_SECONDS))
        except ValueError:
            return PlainTextResponse("Invalid timeout_sec\n", status_code=400)
        if not 0 < timeout:
            return PlainTextResponse("Invalid timeout_sec\n", status_code=400)
        last = params.get("last_etag")
        # Without last_etag the wait is for the value to change from what it is now.
        target = last if last is not None else state.etag(value)
        deadline = time.monotonic() + min(timeout, MAX_WAIT_SECONDS)
        while state.etag(current(path) or "") == target:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or await request.is_disconnected():
                break
            waiter = state.changed
            try:
                await asyncio.wait_for(waiter.wait(), timeout=min(remaining, 0.5))
            except TimeoutError:
                continue
        return answer(current(path) or "")


__all__ = [
    "DEFAULT_METADATA_PORT",
    "FLAVOR_HEADER",
    "MAX_TOKEN_TTL",
    "TOKEN_HEADER",
    "TOKEN_TTL_HEADER",
    "MetadataSettings",
    "MetadataState",
    "NoticeRequest",
    "build_metadata_app",
]
