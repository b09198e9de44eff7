"""The gateway's ASGI app: an OpenAI-compatible reverse proxy over regional upstreams.

It is the only place where "P99 including reroute" can be measured honestly: the latency
histogram is observed from the moment a request arrives until its last byte is sent, across every
attempt, so a request that failed over from the primary carries the failed attempt's time too.

Routes: `/v1/chat/completions` and `/v1/completions` (proxied with reroute,
`redline.gateway.proxy`), `/v1/models` (proxied, not recorded), `/metrics`, `/healthz`, and the
spot endpoints `/admin/spot/drain`, `/admin/spot/release` and `/admin/spot/nodes/{node}`
(`redline.gateway.spot`), which take a bearer token when `admin_token_file` is set.

No `_created` series are exposed unless `created_series`: prometheus-client's switch for them is
process-wide and read at every scrape, so building the app sets it for the whole process (one
gateway per process; the last app built decides for every registry).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
)
from pydantic import BaseModel, ValidationError

from redline.core.created import apply_created_series
from redline.core.settings import SettingsError, read_secret
from redline.gateway.metrics import GatewayMetrics
from redline.gateway.proxy import Gateway, openai_error
from redline.gateway.settings import GatewayConfigError, GatewaySettings
from redline.gateway.spot import SpotDrainRequest, SpotReleaseRequest
from redline.slo.spec import Spec

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)


async def _parse_admin(request: Request, model: type[_M]) -> _M | Response:
    """An admin request body validated by `model`, or a 400/422 naming the problem."""
    try:
        data = json.loads(await request.body())
    except ValueError as exc:
        return openai_error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(data, dict):
        return openai_error(400, "request body must be a JSON object", "BadRequestError")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return openai_error(422, problems, "BadRequestError")


def build_gateway_app(
    settings: GatewaySettings, spec: Spec, registry: CollectorRegistry | None = None
) -> FastAPI:
    """The gateway's ASGI app; its metrics go to `registry` (a new one when None)."""
    if not settings.upstreams:
        raise GatewayConfigError(
            "upstreams: no upstream configured; give at least one region -> base URL "
            "(e.g. --upstream primary=http://127.0.0.1:8000)"
        )
    unknown = [r for r in settings.upstreams if r not in spec.regions]
    if unknown:
        log.warning(
            "upstream regions %s are not in the spec's regions (%s)",
            ", ".join(unknown),
            ", ".join(spec.regions),
        )
    apply_created_series(settings.created_series)
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    metrics = GatewayMetrics(
        registry,
        spec.sources.buckets,
        list(settings.upstreams),
        settings.max_model_labels,
    )
    gateway = Gateway(settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        refresher = asyncio.create_task(gateway.refresh_forever(), name="routing-refresh")
        try:
            yield
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            await gateway.stop()

    app = FastAPI(title="redline gateway", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.gateway = gateway
    app.state.registry = registry
    try:
        secret = read_secret(settings.admin_token_file, None, "gateway admin token")
    except SettingsError as exc:
        raise GatewayConfigError(str(exc)) from None
    admin_token = None if secret is None else secret.get_secret_value()

    def admin_refusal(request: Request, node: str | None) -> Response | None:
        if admin_token is not None:
            presented = request.headers.get("authorization", "")
            expected = f"Bearer {admin_token}"
            if not hmac.compare_digest(presented.encode(), expected.encode()):
                return openai_error(401, "missing or wrong bearer token", "AuthenticationError")
        if node is not None and node not in gateway.regions:
            return openai_error(
                404,
                f"unknown node {node!r}; upstreams: {', '.join(gateway.regions)}",
                "NotFoundError",
            )
        return None

    @app.post("/admin/spot/drain")
    async def spot_drain(request: Request) -> Response:
        parsed = await _parse_admin(request, SpotDrainRequest)
        if isinstance(parsed, Response):
            return admin_refusal(request, None) or parsed
        refused = admin_refusal(request, parsed.node)
        if refused is not None:
            return refused
        return JSONResponse(gateway.spot.drain(parsed))

    @app.post("/admin/spot/release")
    async def spot_release(request: Request) -> Response:
        parsed = await _parse_admin(request, SpotReleaseRequest)
        if isinstance(parsed, Response):
            return admin_refusal(request, None) or parsed
        refused = admin_refusal(request, parsed.node)
        if refused is not None:
            return refused
        return JSONResponse({"node": parsed.node, "released": gateway.spot.release(parsed.node)})

    @app.get("/admin/spot/nodes/{node}")
    async def spot_node(node: str, request: Request) -> Response:
        refused = admin_refusal(request, node)
        if refused is not None:
            return refused
        return JSONResponse(gateway.spot.node_status(node))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await gateway.handle(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await gateway.handle(request)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await gateway.handle(request, record=False)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return gateway.status()

    return app
