"""The webhook receiver: `build_receiver_app(settings)` returns the FastAPI app (a `ReceiverApp`).

Routes: `POST /alerts` (Alertmanager webhook v4), `GET /jobs/{id}`, `GET /jobs`, `/healthz`,
`/readyz`, `/metrics`, `/openapi.json`. Every route but the probes (`/healthz`, `/readyz`) and
`/metrics` needs the bearer token (401; constant-time compare), unless the settings open them
explicitly (`allow_unauthenticated`, logged as a warning at start). `POST /alerts` checks, in
order: the bearer token (before the body is read), the content type (415), the size (413,
from Content-Length and again while the body streams in, so an oversized body is never buffered
whole), the payload (422 naming the field). It answers 202 once every new job and its audit
record are in Redis (one script for both, see `jobs.py`), 200 when everything was already
recorded (a duplicate delivery) or needs no playbook, and 503 when Redis or the audit trail is
unavailable, with nothing recorded, so Alertmanager retries. The token never reaches a log.
Every route that needs Redis answers 503 with `Retry-After` while it is unreachable or failing
over (and `POST /alerts` while its replicas do not acknowledge, `redis.min_replicas_ack`), never
a 500 (`redline.core.failover` catches what would escape); `/healthz` and `/metrics` keep
answering 200 (the scrape reports what it can).

`POST /alerts` is the hot path (thousands of deliveries a second): `ReceiverApp` answers it
straight from the ASGI call with `serve_alerts`, skipping FastAPI's middleware, routing and
dependency layers; the registered route documents it and runs the same `receive_alerts`. The
guard rails (modes, budgets, breakers, pauses) are not on this path: the worker applies them
when it runs the job.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import redis
import redis.asyncio as aredis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, Security
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field, SecretStr, ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from redline.core.failover import RETRY_AFTER, install_failover_handlers
from redline.core.redisconn import (
    FAILOVER_ERRORS,
    ReplicaAckError,
    async_wait_for_replicas,
    open_async_redis,
)
from redline.remediation.audit import AsyncAuditLog, AuditError
from redline.remediation.guards import (
    Policies,
    build_snapshot,
    known_playbooks,
    load_policies,
    read_active_jobs,
    read_guard_hashes,
)
from redline.remediation.guards import load_durability as load_spec_durability
from redline.remediation.jobs import Job, JobStatus
from redline.remediation.metrics import (
    AuditStatus,
    WebhookCounters,
    build_audit_families,
    build_families,
    build_guard_families,
    build_job_ages,
    render_metrics,
)
from redline.remediation.models import WebhookPayload
from redline.remediation.receiver_store import AsyncJobStore
from redline.remediation.settings import RemediationSettings
from redline.slo.spec import RedisDurability

log = logging.getLogger(__name__)

JOB_ID = r"^[0-9a-f]{32}$"
BEARER = HTTPBearer(auto_error=False, description="The webhook bearer token.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]
STORE_DOWN = "job store (Redis) unavailable; nothing was recorded, retry later"
AUDIT_DOWN = "audit trail unavailable; nothing was recorded, retry later"
NOT_ACKNOWLEDGED = (
    "recorded on the Redis primary, but fewer replicas than redis.min_replicas_ack acknowledged "
    "it in time, so it is not accepted; retry later (the redelivery is a duplicate and waits "
    "for the replicas again)"
)
UNAUTHORIZED = "missing or wrong bearer token"
RETRY = tuple(RETRY_AFTER.items())
REDIS_DOWN: tuple[type[Exception], ...] = (redis.RedisError, *FAILOVER_ERRORS)
"""Redis failing (unreachable, failing over, a write its replicas did not acknowledge): 503."""
UNVERIFIABLE: tuple[type[Exception], ...] = (*REDIS_DOWN, AuditError)


class AlertOutcome(BaseModel):
    """What became of one alert of a delivery."""

    fingerprint: str
    status: str
    playbook: str | None
    job_id: str | None = Field(description="The job, for accepted and duplicate alerts.")
    result: Literal["accepted", "duplicate", "acknowledged"] = Field(
        description="accepted: new job; duplicate: already recorded; acknowledged: no playbook."
    )


class IngestResponse(BaseModel):
    """The answer to a delivery."""

    accepted: int = Field(description="New jobs enqueued.")
    duplicates: int = Field(description="Alerts already recorded; nothing run again.")
    acknowledged: int = Field(description="New alerts without a playbook label (audited only).")
    alerts: list[AlertOutcome]


class JobList(BaseModel):
    """A page of jobs, newest first."""

    jobs: list[Job]


class Problem(BaseModel):
    """An error answer."""

    detail: Any = Field(description="What was wrong; for 422 the list of field errors.")
    message: str | None = Field(None, description="A one-line summary.")


class ReceiverState:
    """What the routes share: settings, token, counters and (while running) Redis clients."""

    def __init__(
        self,
        settings: RemediationSettings,
        token: SecretStr | None,
        policies: Policies,
        playbooks: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        # None only when the settings open the endpoints explicitly.
        self.token = None if token is None else token.get_secret_value().encode("utf-8")
        self.policies = policies
        self.durability = RedisDurability()
        """Replica acknowledgements a job needs before its 202 (the spec's `redis`)."""
        self.playbooks = known_playbooks(policies, playbooks)
        self.counters = WebhookCounters()
        self._client: aredis.Redis | None = None
        self._store: AsyncJobStore | None = None
        self._audit: AsyncAuditLog | None = None
        self.audit_status: AuditStatus | None = None
        self._verifying = asyncio.Lock()

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Open the Redis client for the app's lifetime."""
        client = open_async_redis(
            self.settings.redis_url,
            decode_responses=True,
            socket_connect_timeout=1.0,
            socket_timeout=3.0,
        )
        self._client = client
        self._audit = AsyncAuditLog(client, self.settings.key_prefix, self.settings.audit_file)
        self._store = AsyncJobStore(
            client, self.settings.key_prefix, self.settings.retention_seconds, self._audit
        )
        try:
            await self._store.ensure_group()
        except REDIS_DOWN as exc:
            log.warning("Redis unavailable at start-up (%s); /readyz reports it", exc)
        try:
            yield
        finally:
            self._client = self._store = self._audit = None
            await client.aclose()

    @property
    def store(self) -> AsyncJobStore:
        """The job store (only while the app runs)."""
        if self._store is None:
            raise RuntimeError("the receiver app is not running (lifespan not started)")
        return self._store

    @property
    def audit(self) -> AsyncAuditLog:
        """The audit appender (only while the app runs)."""
        if self._audit is None:
            raise RuntimeError("the receiver app is not running (lifespan not started)")
        return self._audit

    async def audit_status_now(self) -> AuditStatus | None:
        """The audit trail's verification, redone when older than the configured interval.

        Verifying rereads every record, so it runs at most once per interval whatever the
        scrape rate; while Redis is down the last result stays (its timestamp ages)."""
        interval = self.settings.audit_verify_interval_seconds
        async with self._verifying:
            last = self.audit_status
            if last is not None and time.time() - last.verified_at < interval:
                return last
            try:
                chain, mirror = await self.audit.verify()
            except UNVERIFIABLE as exc:
                log.warning("audit trail not verified: %s", exc)
                return last
            copies = {"redis": chain} | ({"file": mirror} if mirror is not None else {})
            for copy, result in copies.items():
                if not result.ok:
                    log.error("audit trail %s: %s", copy, result.render(copy))
            self.audit_status = AuditStatus(time.time(), copies)
            return self.audit_status

    def check_token(self, credentials: HTTPAuthorizationCredentials | None) -> None:
        """401 unless the request carries the bearer token (constant-time compare)."""
        if not self._authorized(credentials.credentials if credentials else None):
            raise HTTPException(
                status_code=401, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}
            )

    def bearer_ok(self, header: str | None) -> bool:
        """True when a raw Authorization header carries the bearer token (constant time)."""
        scheme, _, credentials = (header or "").partition(" ")
        return self._authorized(credentials if scheme.lower() == "bearer" and credentials else None)

    def _authorized(self, offered: str | None) -> bool:
        if self.token is None:
            return True  # opened explicitly (allow_unauthenticated), warned about at start
        # Compared even when nothing was offered, so the answer time says nothing either way.
        given = offered.encode("utf-8") if offered else b""
        return hmac.compare_digest(given, self.token) and bool(offered)

    async def receive_alerts(
        self,
        authorization: str | None,
        content_type: str | None,
        content_length: str | None,
        chunks: AsyncIterator[bytes],
    ) -> Answer:
        """`POST /alerts`, whichever way it arrived: check the token, the content type, the
        size and the payload, in that order, then record the alerts (jobs and audit records in
        one round trip) and say what became of each."""
        if not self.bearer_ok(authorization):
            return Answer(401, _problem_body(UNAUTHORIZED), (("WWW-Authenticate", "Bearer"),))
        media_type = (content_type or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            return Answer(
                415, _problem_body(f"content type must be application/json, not {media_type!r}")
            )
        limit = self.settings.max_body_bytes
        body = await _read_body(content_length, chunks, limit)
        if body is None:
            return Answer(413, _problem_body(f"body larger than {limit} bytes"))
        try:
            payload = WebhookPayload.model_validate_json(body)
        except ValidationError as exc:
            return Answer(422, _validation_body(exc))
        try:
            outcomes = await self.store.ingest(payload, self.settings.dry_run)
            ack = self.durability
            if ack.min_replicas_ack > 0 and self._client is not None:
                # A 202 must survive the primary's death: replicas hold the job (and its audit
                # record) first. Too few in time: ReplicaAckError, a RedisError -> 503 below;
                # the redelivery is a duplicate and waits again. The fence shares the jobs' hash
                # tag: on a Cluster, WAIT speaks for the node holding them.
                fence = f"{{{self.settings.key_prefix}}}:ack:fence"
                await async_wait_for_replicas(
                    self._client, ack.min_replicas_ack, ack.ack_timeout_ms, fence
                )
        except ReplicaAckError as exc:
            log.warning("POST /alerts: %s (%s)", NOT_ACKNOWLEDGED, exc)
            return Answer(503, _problem_body(NOT_ACKNOWLEDGED), RETRY)
        except REDIS_DOWN as exc:
            log.warning("POST /alerts: %s (%s)", STORE_DOWN, type(exc).__name__)
            return Answer(503, _problem_body(STORE_DOWN), RETRY)
        except AuditError as exc:
            log.error("POST /alerts: audit trail not appended, nothing recorded: %s", exc)
            return Answer(503, _problem_body(AUDIT_DOWN), RETRY)
        results = Counter(outcome.result for outcome in outcomes)
        self.counters.count(Counter(alert.status for alert in payload.alerts), results["duplicate"])
        # The IngestResponse shape, built directly: a model per answer costs the hot path.
        answer = {
            "accepted": results["accepted"],
            "duplicates": results["duplicate"],
            "acknowledged": results["acknowledged"],
            "alerts": [vars(outcome) for outcome in outcomes],
        }
        return Answer(202 if results["accepted"] else 200, answer)


@dataclass(frozen=True)
class Answer:
    """What `POST /alerts` answers: status, JSON body and extra headers."""

    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()


def _problem_body(detail: Any, message: str | None = None) -> dict[str, Any]:
    summary = message if message is not None else (detail if isinstance(detail, str) else None)
    return {"detail": detail, "message": summary}


def _problem(status: int, detail: Any, message: str | None = None, **headers: str) -> JSONResponse:
    return JSONResponse(_problem_body(detail, message), status_code=status, headers=headers)


def _validation_body(exc: ValidationError) -> dict[str, Any]:
    errors = [
        {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _problem_body(
        errors, f"invalid Alertmanager webhook payload (v4): {where}: {first['msg']}{more}"
    )


async def _read_body(
    declared: str | None, chunks: AsyncIterator[bytes], limit: int
) -> bytes | None:
    """The body, or None as soon as it exceeds `limit` bytes (declared or streamed)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in chunks:
        body.extend(chunk)
        if len(body) > limit:
            return None
    return bytes(body)


async def _asgi_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """The request body as it arrives (what Starlette's `Request.stream` yields)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


_ALERT_HEADERS = (b"authorization", b"content-type", b"content-length")
# What Starlette's JSONResponse renders, with one encoder instead of one per answer.
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


async def serve_alerts(state: ReceiverState, scope: Scope, receive: Receive, send: Send) -> None:
    """`POST /alerts` as a bare ASGI handler: the same checks and answers as the FastAPI route,
    without the framework's middleware, routing and dependency layers on every delivery."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        # The first of a repeated header, as Starlette's `Headers.get` reads it.
        if name in _ALERT_HEADERS and name not in found:
            found[name] = value.decode("latin-1")
    try:
        answer = await state.receive_alerts(
            found.get(b"authorization"),
            found.get(b"content-type"),
            found.get(b"content-length"),
            _asgi_chunks(receive),
        )
    except ClientDisconnect:
        return  # nobody is left to answer; nothing was recorded (the body never arrived)
    body = _JSON.encode(answer.body).encode("utf-8")
    headers = [
        (b"content-length", str(len(body)).encode("latin-1")),
        (b"content-type", b"application/json"),
        *(
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in answer.headers
        ),
    ]
    start: Message = {"type": "http.response.start", "status": answer.status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})


class ReceiverApp(FastAPI):
    """The receiver's FastAPI app; `POST /alerts` is answered by `serve_alerts` straight from
    the ASGI call (the webhook's hot path), every other request goes through FastAPI. The
    `/alerts` route stays registered: it documents the operation and serves it when the app
    runs under a root path."""

    receiver: ReceiverState

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch `POST /alerts` to `serve_alerts`, the rest to FastAPI."""
        if (
            scope["type"] == "http"
            and scope["path"] == "/alerts"
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            await serve_alerts(self.receiver, scope, receive, send)
            return
        await super().__call__(scope, receive, send)


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "Missing or wrong bearer token."},
    503: {"model": Problem, "description": "Redis unreachable; retry."},
}


def build_alerts_router(state: ReceiverState) -> APIRouter:
    """`POST /alerts`."""
    router = APIRouter(tags=["alerts"])

    @router.post(
        "/alerts",
        status_code=202,
        response_model=IngestResponse,
        summary="Receive an Alertmanager webhook notification (payload version 4).",
        responses={
            **_ERRORS,
            200: {
                "model": IngestResponse,
                "description": "Nothing new: duplicates or no playbook.",
            },
            202: {"model": IngestResponse, "description": "New jobs durably enqueued."},
            413: {"model": Problem, "description": "Body larger than the limit."},
            415: {"model": Problem, "description": "Content type is not application/json."},
            422: {"model": Problem, "description": "Not a valid v4 payload; names the field."},
        },
        openapi_extra={
            "security": [{"HTTPBearer": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/WebhookPayload"}}
                },
            },
        },
    )
    async def post_alerts(request: Request) -> Response:
        """Record each alert of the notification as a job (or acknowledge it), then answer."""
        headers = request.headers
        answer = await state.receive_alerts(
            headers.get("authorization"),
            headers.get("content-type"),
            headers.get("content-length"),
            request.stream(),
        )
        return JSONResponse(answer.body, status_code=answer.status, headers=dict(answer.headers))

    return router


def _query_problem(request: Request, allowed: tuple[str, ...]) -> JSONResponse | None:
    """422 for an unknown or repeated query parameter: a typo must not widen a listing."""
    names = [name for name, _ in request.query_params.multi_items()]
    unknown = sorted({name for name in names if name not in allowed})
    if unknown:
        accepted = ", ".join(allowed) or "none"
        return _problem(
            422, f"unknown query parameter(s): {', '.join(map(repr, unknown))}; allowed: {accepted}"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        return _problem(422, f"query parameter given more than once: {', '.join(repeated)}")
    return None


def build_jobs_router(state: ReceiverState) -> APIRouter:
    """`GET /jobs`, `GET /jobs/{job_id}`."""
    router = APIRouter(tags=["jobs"])

    def authorized(credentials: Credentials) -> None:
        """401 unless the bearer token matches."""
        state.check_token(credentials)

    @router.get(
        "/jobs/{job_id}",
        response_model=Job,
        dependencies=[Depends(authorized)],
        responses={
            **_ERRORS,
            404: {"model": Problem, "description": "No such job."},
            422: {"model": Problem, "description": "Malformed job id or query."},
        },
        summary="One job with its plan and recorded steps.",
    )
    async def get_job(request: Request, job_id: Annotated[str, Path(pattern=JOB_ID)]) -> Response:
        """One job with its steps; 404 when unknown."""
        problem = _query_problem(request, ())
        if problem is not None:
            return problem
        try:
            job = await state.store.get(job_id)
        except REDIS_DOWN:
            return _problem(503, STORE_DOWN, **RETRY_AFTER)
        if job is None:
            return _problem(404, f"no job {job_id}")
        return JSONResponse(job.model_dump(mode="json"))

    @router.get(
        "/jobs",
        response_model=JobList,
        dependencies=[Depends(authorized)],
        responses={**_ERRORS, 422: {"model": Problem, "description": "Bad query parameter."}},
        summary="Recent jobs, newest first, filtered by playbook and status.",
    )
    async def list_jobs(
        request: Request,
        playbook: Annotated[str | None, Query(max_length=64)] = None,
        status: JobStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        """Recent jobs, filtered."""
        problem = _query_problem(request, ("playbook", "status", "limit"))
        if problem is not None:
            return problem
        try:
            jobs = await state.store.list_jobs(playbook, status, limit)
        except REDIS_DOWN:
            return _problem(503, STORE_DOWN, **RETRY_AFTER)
        return JSONResponse(JobList(jobs=jobs).model_dump(mode="json"))

    return router


def build_ops_router(state: ReceiverState) -> APIRouter:
    """`/healthz`, `/readyz`, `/metrics`."""
    router = APIRouter(tags=["operations"])

    @router.get("/healthz", summary="The process is up.")
    async def healthz() -> dict[str, str]:
        """Always ok while the process serves."""
        return {"status": "ok"}

    @router.get(
        "/readyz",
        summary="Redis is reachable.",
        responses={503: {"model": Problem, "description": "Redis unreachable."}},
    )
    async def readyz() -> Response:
        """200 when Redis answers PING, else 503 (with Retry-After)."""
        try:
            await state.store.ping()
        except REDIS_DOWN as exc:
            return _problem(503, f"redis unreachable: {type(exc).__name__}", **RETRY_AFTER)
        return JSONResponse({"status": "ready"})

    @router.get(
        "/metrics",
        summary="Prometheus metrics.",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}},
    )
    async def metrics() -> Response:
        """Webhook counters of this process, run metrics of all workers, audit chain state."""
        alerts, duplicates = state.counters.snapshot()
        guards: list[Any] = []
        try:
            runs: dict[str, str] | None = await state.store.run_metrics()
            paused, breaker = await read_guard_hashes(state.store.client, state.store.keys)
            active = await read_active_jobs(state.store.client, state.store.keys)
        except REDIS_DOWN:
            runs = None  # scrape still works; run metrics are absent until Redis is back
        else:
            ages = build_job_ages(active, state.policies, time.time())
            guards = build_guard_families(
                state.playbooks, state.policies, build_snapshot(paused, breaker), ages
            )
        audit = build_audit_families(await state.audit_status_now())
        families = build_families(alerts, duplicates, runs, state.playbooks)
        body = render_metrics([*families, *guards, *audit])
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return router


def load_durability(settings: RemediationSettings) -> RedisDurability:
    """The spec's `redis` section (replica acknowledgements); SettingsError if it won't load."""
    return load_spec_durability(settings.spec)


def build_receiver_app(
    settings: RemediationSettings,
    *,
    token: SecretStr | None = None,
    policies: Policies | None = None,
    playbooks: Sequence[str] = (),
) -> FastAPI:
    """The receiver app; `token` defaults to `settings.resolve_token()` (file or env), and no
    token is asked for only when `settings.allow_unauthenticated` says so. `policies` (default:
    from the spec and settings) and `playbooks` (the registry's names) feed the guard gauges."""
    if settings.allow_unauthenticated:
        log.warning(
            "allow_unauthenticated is set: POST /alerts and /jobs accept requests WITHOUT a "
            "bearer token; never run a receiver reachable by others like this"
        )
        secret = None
    else:
        secret = token if token is not None else settings.resolve_token()
    if policies is None:
        policies = load_policies(settings.spec, settings.profile, settings.policies)
    state = ReceiverState(settings, secret, policies, playbooks)
    state.durability = load_durability(settings)
    app = ReceiverApp(
        title="redline remediation receiver",
        version="1",
        description="Alertmanager webhook receiver: durable, idempotent, audited remediation.",
        lifespan=state.lifespan,
    )
    app.state.receiver = app.receiver = state
    # The routes answer 503 themselves; this catches what would otherwise escape as a 500.
    install_failover_handlers(app, _problem_body, "receiver")
    for router in (build_alerts_router(state), build_jobs_router(state), build_ops_router(state)):
        # The routes themselves, not the routers: an included router is one more dispatch layer
        # on every request, measurable at thousands of webhook deliveries a second.
        app.router.routes.extend(router.routes)

    def openapi() -> dict[str, Any]:
        """The generated schema plus the v4 payload models the raw-body route declares."""
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            payload = WebhookPayload.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(payload.pop("$defs", {}))
            components["WebhookPayload"] = payload
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
