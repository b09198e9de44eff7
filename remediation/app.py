"""The webhook receiver: `build_receiver_app(settings)` returns the FastAPI app.

Routes: `POST /alerts` (Alertmanager webhook v4), `GET /jobs/{id}`, `GET /jobs`, `/healthz`,
`/readyz`, `/metrics`, `/openapi.json`. Every route but the probes (`/healthz`, `/readyz`) and
`/metrics` needs the bearer token (401; constant-time compare), unless the settings open them
explicitly (`allow_unauthenticated`, logged as a warning at start). `POST /alerts` checks, in
order: the bearer token (before the body is read), the content type (415), the size (413,
from Content-Length and again while the body streams in, so an oversized body is never buffered
whole), the payload (422 naming the field). It answers 202 once every new job is in Redis, 200
when everything was already recorded (a duplicate delivery) or needs no playbook, and 503 when
Redis is unreachable so Alertmanager retries. The token never reaches a log.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import redis
import redis.asyncio as aredis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, Security
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field, SecretStr, ValidationError

from redline.remediation.audit import AsyncAuditLog, AuditEntry, AuditError
from redline.remediation.guards import (
    Policies,
    build_snapshot,
    known_playbooks,
    load_policies,
    read_active_jobs,
    read_guard_hashes,
)
from redline.remediation.jobs import AsyncJobStore, IngestOutcome, Job, JobStatus
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
from redline.remediation.settings import RemediationSettings

log = logging.getLogger(__name__)

JOB_ID = r"^[0-9a-f]{32}$"
BEARER = HTTPBearer(auto_error=False, description="The webhook bearer token.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]
STORE_DOWN = "job store (Redis) unavailable; nothing was recorded, retry later"


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
        client = aredis.Redis.from_url(
            self.settings.redis_url,
            decode_responses=True,
            socket_connect_timeout=1.0,
            socket_timeout=3.0,
        )
        self._client = client
        self._store = AsyncJobStore(
            client, self.settings.key_prefix, self.settings.retention_seconds
        )
        self._audit = AsyncAuditLog(client, self.settings.key_prefix, self.settings.audit_file)
        try:
            await self._store.ensure_group()
        except redis.RedisError as exc:
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
            except (redis.RedisError, AuditError) as exc:
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
        self._check(credentials.credentials if credentials else None)

    def check_authorization(self, header: str | None) -> None:
        """`check_token` on a raw Authorization header (the hot path skips FastAPI's DI)."""
        scheme, _, credentials = (header or "").partition(" ")
        self._check(credentials if scheme.lower() == "bearer" and credentials else None)

    def _check(self, offered: str | None) -> None:
        if self.token is None:
            return  # opened explicitly (allow_unauthenticated), warned about at start
        # Compared even when nothing was offered, so the answer time says nothing either way.
        given = offered.encode("utf-8") if offered else b""
        if not hmac.compare_digest(given, self.token) or not offered:
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )


def _problem(status: int, detail: Any, message: str | None = None, **headers: str) -> JSONResponse:
    summary = message if message is not None else (detail if isinstance(detail, str) else None)
    return JSONResponse({"detail": detail, "message": summary}, status_code=status, headers=headers)


def _validation_problem(exc: ValidationError) -> JSONResponse:
    errors = [
        {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _problem(
        422, errors, f"invalid Alertmanager webhook payload (v4): {where}: {first['msg']}{more}"
    )


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it exceeds `limit` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            return None
    return bytes(body)


def _audit_entries(payload: WebhookPayload, outcomes: list[IngestOutcome]) -> list[AuditEntry]:
    entries: list[AuditEntry] = []
    for alert, outcome in zip(payload.alerts, outcomes, strict=True):
        common = {
            "fingerprint": alert.fingerprint,
            "status": alert.status,
            "alertname": alert.labels.get("alertname", ""),
            "receiver": payload.receiver,
            "group_key": payload.group_key,
        }
        if outcome.result == "accepted":
            entries.append(
                AuditEntry("job.accepted", outcome.job_id, {**common, "playbook": alert.playbook})
            )
        elif outcome.result == "acknowledged":
            entries.append(
                AuditEntry("alert.acknowledged", None, {**common, "labels": dict(alert.labels)})
            )
    return entries


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
        state.check_authorization(request.headers.get("authorization"))
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            return _problem(415, f"content type must be application/json, not {media_type!r}")
        limit = state.settings.max_body_bytes
        body = await _read_body(request, limit)
        if body is None:
            return _problem(413, f"body larger than {limit} bytes")
        try:
            payload = WebhookPayload.model_validate_json(body)
        except ValidationError as exc:
            return _validation_problem(exc)
        try:
            outcomes = await state.store.ingest(payload, state.settings.dry_run)
        except redis.RedisError as exc:
            log.warning("POST /alerts: %s (%s)", STORE_DOWN, type(exc).__name__)
            return _problem(503, STORE_DOWN, **{"Retry-After": "1"})
        results = Counter(outcome.result for outcome in outcomes)
        state.counters.count(
            Counter(alert.status for alert in payload.alerts), results["duplicate"]
        )
        try:
            await state.audit.append_many(_audit_entries(payload, outcomes))
        except (redis.RedisError, AuditError) as exc:
            # The jobs are recorded; the worker's job.started record carries the full alert.
            log.error("POST /alerts: audit trail not appended: %s", exc)
            return _problem(503, "jobs recorded but the audit trail is unavailable; retry")
        # The IngestResponse shape, built directly: a model per answer costs the hot path.
        answer = {
            "accepted": results["accepted"],
            "duplicates": results["duplicate"],
            "acknowledged": results["acknowledged"],
            "alerts": [vars(outcome) for outcome in outcomes],
        }
        return JSONResponse(answer, status_code=202 if results["accepted"] else 200)

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
        except redis.RedisError:
            return _problem(503, STORE_DOWN, **{"Retry-After": "1"})
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
        except redis.RedisError:
            return _problem(503, STORE_DOWN, **{"Retry-After": "1"})
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
        """200 when Redis answers PING, else 503."""
        try:
            await state.store.ping()
        except redis.RedisError as exc:
            return _problem(503, f"redis unreachable: {type(exc).__name__}")
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
        except redis.RedisError:
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
    app = FastAPI(
        title="redline remediation receiver",
        version="1",
        description="Alertmanager webhook receiver: durable, idempotent, audited remediation.",
        lifespan=state.lifespan,
    )
    app.state.receiver = state
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
