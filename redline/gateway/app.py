"""The gateway's ASGI app: an OpenAI-compatible reverse proxy over regional upstreams.

It is the only place where "P99 including reroute" can be measured honestly: the latency
histogram is observed from the moment a request arrives until its last byte is sent, across every
attempt, so a request that failed over from the primary carries the failed attempt's time too.

Routes: `/v1/chat/completions` and `/v1/completions` (proxied with reroute,
`redline.gateway.proxy`), `/v1/models` (proxied, not recorded), `/metrics`, `/healthz`, and the
spot endpoints `/admin/spot/drain`, `/admin/spot/release` and `/admin/spot/nodes/{node}`
(`redline.gateway.spot`). Every `/admin` endpoint requires the bearer token of
`admin_token_file` (or `REDLINE_ADMIN_TOKEN`), checked in constant time before anything else;
with `admin_open` it takes none (a WARNING at start-up); with neither it answers 403 saying how
to configure one. `/healthz`, `/metrics` and the proxied routes are never guarded, and the
check is not on the proxy's path.

Redis is on a request's path only for the quotas (`on_store_error`: fail_open or a 503) and the
spot ledger (a resumed or not-retry-safe request: 503); every 503 carries `Retry-After`, and an
error of a Redis failing over that escapes a route is a 503 with `Retry-After` too, never a 500
(`redline.core.failover`).

No `_created` series are exposed unless `created_series`: prometheus-client's switch for them is
process-wide and read at every scrape, so building the app sets it for the whole process (one
gateway per process; the last app built decides for every registry).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from pydantic import BaseModel, ValidationError

from redline.core.created import apply_created_series
from redline.core.failover import install_failover_handlers
from redline.gateway.intent import IntentConfigError
from redline.gateway.metrics import GatewayMetrics
from redline.gateway.proxy import Gateway, openai_error
from redline.gateway.quotas import QuotaConfigError, QuotaGate, build_quota_gate
from redline.gateway.settings import GatewayConfigError, GatewaySettings
from redline.gateway.spot import SpotDrainRequest, SpotReleaseRequest
from redline.gateway.tokens import TokenizerConfigError
from redline.gateway.tracing import GatewayTracing, TracingConfigError
from redline.platform.spot import AdminAuth, AdminRefusal
from redline.slo.spec import Spec

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)

ADMIN_HOWTO = (
    "Set admin_token_file (redline gateway --admin-token-file FILE) or the REDLINE_ADMIN_TOKEN "
    "variable and send 'Authorization: Bearer <token>'; or, on a trusted network only, set "
    "admin_open: true (--admin-open) to serve /admin without a token."
)


class AdminRefusedError(Exception):
    """An `/admin` request without the right token (answered by the app's handler)."""

    def __init__(self, refusal: AdminRefusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def build_admin_auth(settings: GatewaySettings) -> AdminAuth:
    """The check every `/admin` endpoint runs; GatewayConfigError when the token is unusable."""
    return AdminAuth("gateway", settings.resolve_admin_token(), settings.admin_open, ADMIN_HOWTO)


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


def _failover_body(message: str) -> dict[str, Any]:
    """An OpenAI-shaped 503 body (what `openai_error` writes)."""
    return {"error": {"message": message, "type": "ServiceUnavailableError", "param": None,
                      "code": 503}}  # fmt: skip


def build_gateway_app(
    settings: GatewaySettings,
    spec: Spec,
    registry: CollectorRegistry | None = None,
    tracing: GatewayTracing | None = None,
) -> FastAPI:
    """The gateway's ASGI app; its metrics go to `registry` (a new one when None), its spans
    to `tracing` (when None: as the `tracing` setting and the OTEL_* variables say)."""
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
    auth = build_admin_auth(settings)  # an unusable token file stops the build, before serving
    apply_created_series(settings.created_series)
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    own_tracing = tracing is None
    gateway, quotas = _build_gateway(settings, spec, registry, tracing)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        auth.announce(log)  # here, once logging is set up and the banner printed
        await gateway.start()
        refresher = asyncio.create_task(gateway.refresh_forever(), name="routing-refresh")
        try:
            yield
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            await gateway.stop()
            if quotas is not None:
                await quotas.aclose()
            if own_tracing:
                # The batch processor's last spans go out (a blocking flush, once, at exit).
                gateway.tracing.shutdown()

    app = FastAPI(title="redline gateway", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.gateway = gateway
    app.state.registry = registry

    @app.exception_handler(AdminRefusedError)
    async def admin_refused(request: Request, exc: AdminRefusedError) -> Response:
        answer = openai_error(exc.refusal.status, exc.refusal.message, exc.refusal.kind)
        answer.headers.update(exc.refusal.headers)
        return answer

    _add_routes(app, gateway, registry)
    # Last: the proxied routes are matched first, so the admin router costs them nothing.
    app.include_router(_admin_router(gateway, auth))
    # Redis failing over never shows as a 500: 503 + Retry-After (no cost until it happens).
    install_failover_handlers(app, _failover_body, "gateway")

    return app


def _build_gateway(
    settings: GatewaySettings,
    spec: Spec,
    registry: CollectorRegistry,
    tracing: GatewayTracing | None,
) -> tuple[Gateway, QuotaGate | None]:
    """The proxy and its quota gate, from the settings (GatewayConfigError when unusable)."""
    metrics = GatewayMetrics(
        registry,
        spec.sources.buckets,
        list(settings.upstreams),
        settings.max_model_labels,
    )
    breakers = settings.breakers.apply(spec.breakers)  # GatewayConfigError when invalid
    if tracing is None:
        try:
            tracing = GatewayTracing.from_settings(settings.tracing)
        except TracingConfigError as exc:
            raise GatewayConfigError(str(exc)) from None
    try:
        quotas = build_quota_gate(settings, spec.quotas, registry)
    except (QuotaConfigError, TokenizerConfigError, IntentConfigError) as exc:
        raise GatewayConfigError(str(exc)) from None
    return Gateway(settings, metrics, breakers, tracing, quotas), quotas


def _add_routes(app: FastAPI, gateway: Gateway, registry: CollectorRegistry) -> None:
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
    async def metrics_endpoint(request: Request) -> Response:
        # OpenMetrics when the scraper asks for it (Prometheus does): the only exposition that
        # carries the latency histogram's trace-id exemplars; else the classic text format.
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), headers={"content-type": content_type})

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return gateway.status()


def _admin_router(gateway: Gateway, auth: AdminAuth) -> APIRouter:
    def unknown_node(node: str) -> Response | None:
        if node in gateway.regions:
            return None
        return openai_error(
            404, f"unknown node {node!r}; upstreams: {', '.join(gateway.regions)}", "NotFoundError"
        )

    async def require_admin(request: Request) -> None:
        refusal = auth.check(request.headers.get("authorization"))
        if refusal is not None:
            raise AdminRefusedError(refusal)

    # Every route under /admin is guarded by the router, before its body is read or its node
    # looked up: a caller without the token learns nothing, not even which nodes exist.
    admin = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

    @admin.post("/spot/drain")
    async def spot_drain(request: Request) -> Response:
        parsed = await _parse_admin(request, SpotDrainRequest)
        if isinstance(parsed, Response):
            return parsed
        return unknown_node(parsed.node) or JSONResponse(gateway.spot.drain(parsed))

    @admin.post("/spot/release")
    async def spot_release(request: Request) -> Response:
        parsed = await _parse_admin(request, SpotReleaseRequest)
        if isinstance(parsed, Response):
            return parsed
        refused = unknown_node(parsed.node)
        if refused is not None:
            return refused
        released = gateway.spot.release(parsed.node)
        gateway.router.released(parsed.node)
        return JSONResponse({"node": parsed.node, "released": released})

    @admin.get("/spot/nodes/{node}")
    async def spot_node(node: str) -> Response:
        return unknown_node(node) or JSONResponse(gateway.spot.node_status(node))

    return admin
