"""The spot agent: one per spot node; it watches the node's notice sources (AWS, GCP, manual) in
threads and runs the drain flow (`redline.platform.spot.SpotDrainFlow`: notice -> admission
closed -> triage -> drained -> replacement ready) for every interruption, with the node's state in
Redis and its series on `/metrics`.

- `SpotAgentSettings`: the settings of `redline spot-agent run`;
- `SpotAgentMetrics`: the agent's series (below);
- `SpotAgent`: the notice watchers and the flow thread;
- `build_agent_app`: `/metrics`, `/state`, `/healthz` and `POST /notice` (the manual trigger).

`POST /notice` requires a bearer token: `admin_token_file` (or `REDLINE_ADMIN_TOKEN`), else the
gateways' token (`gateway_token_file` / `REDLINE_GATEWAY_TOKEN`, the token the agent already
holds); with `admin_open` it takes none (a WARNING at start-up); with no token at all it answers
403 saying how to configure one. `/metrics`, `/state` and `/healthz` are read-only and open.

Series: `llm_node_state{node,state}` (1 for the current state), the histogram
`llm_spot_notice_to_draining_seconds{node,provider}`, `llm_spot_replacement_ready_latency_seconds
{node,provider}` (TERMINATING -> RECOVERED; while still waiting, the time waited so far, so an
alert can fire on a replacement that never becomes ready), `llm_spot_drain_budget_seconds{node}`,
`llm_spot_notice_pending{node,provider}`, `llm_spot_notices_total{node,provider,kind}`,
`llm_spot_agent_errors_total{node}`, `llm_spot_replacement_requests_total{node,via,outcome}`.

On Kubernetes (`kubernetes.enabled`), a notice also taints the node `NoSchedule` and marks its
serving pods not ready through their readiness gate; `replacement` asks for a replacement at
notice time (scale a Deployment, or a cloud hook). Both run in threads beside the drain
(`redline.platform.spot.ClusterActions`); both are off by default.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import httpx
import redis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import Counter, Histogram
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from redline.core.settings import ServiceSettings, SettingsError, read_secret
from redline.platform.routing import DEFAULT_PREFIX as ROUTING_PREFIX
from redline.platform.routing import RoutingStore
from redline.platform.spot import (
    DEFAULT_STATE_PREFIX,
    AdminAuth,
    AwsImdsSource,
    Clock,
    ClusterActions,
    GatewayAdmin,
    GcpMetadataSource,
    KubernetesClient,
    KubernetesSettings,
    ManualSource,
    NodeActions,
    NodeRecord,
    NodeState,
    Notice,
    NoticeSource,
    NoticeWatcher,
    ReadinessGate,
    ReplacementLog,
    ReplacementRunner,
    ReplacementSettings,
    SpotAgentError,
    SpotDrainFlow,
    SpotError,
    SpotStateError,
    SpotStateStore,
    build_replacement_provider,
)
from redline.slo import catalog
from redline.slo.spec import Spot

log = logging.getLogger(__name__)

DEFAULT_AGENT_PORT = 9110
ADMIN_HOWTO = (
    "Set admin_token_file (redline spot-agent run --admin-token-file FILE) or the "
    "REDLINE_ADMIN_TOKEN variable (else the gateways' token, gateway_token_file, is used) and "
    "send 'Authorization: Bearer <token>' (redline spot-agent trigger --token-file FILE); or, on "
    "a trusted network only, set admin_open: true (--admin-open)."
)
RECHECK_SECONDS = 10.0
"""How often an agent whose replacement missed the readiness timeout checks it again."""


# ---- metrics --------------------------------------------------------------------------------


def _gauge(metric: catalog.Metric) -> GaugeMetricFamily:
    return GaugeMetricFamily(metric.family, metric.help, labels=metric.labels)


class SpotAgentMetrics(Collector):
    """The agent's series; node state and replacement latency are read from the live record."""

    def __init__(
        self,
        registry: CollectorRegistry,
        record: Callable[[], NodeRecord],
        pending: Callable[[], Notice | None],
        clock: Clock,
    ) -> None:
        self.record = record
        self.pending = pending
        self.clock = clock
        notice_to_draining = catalog.LLM_SPOT_NOTICE_TO_DRAINING_SECONDS
        self.notice_to_draining = Histogram(
            notice_to_draining.family,
            notice_to_draining.help,
            notice_to_draining.labels,
            buckets=notice_to_draining.buckets,
            registry=registry,
        )
        notices = catalog.LLM_SPOT_NOTICES_TOTAL
        self.notices = Counter(notices.family, notices.help, notices.labels, registry=registry)
        errors = catalog.LLM_SPOT_AGENT_ERRORS_TOTAL
        self.errors = Counter(errors.family, errors.help, errors.labels, registry=registry)
        replacements = catalog.LLM_SPOT_REPLACEMENT_REQUESTS_TOTAL
        self.replacements = Counter(
            replacements.family, replacements.help, replacements.labels, registry=registry
        )
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """Node state, replacement latency and budget from the current record."""
        record = self.record()
        state = _gauge(catalog.LLM_NODE_STATE)
        for value in NodeState:
            state.add_metric((record.node, value.value), 1.0 if record.state is value else 0.0)
        yield state
        latency = _gauge(catalog.LLM_SPOT_REPLACEMENT_READY_LATENCY_SECONDS)
        waited = record.replacement_latency(self.clock())
        if waited is not None:
            latency.add_metric((record.node, record.provider or "unknown"), waited)
        yield latency
        budget = _gauge(catalog.LLM_SPOT_DRAIN_BUDGET_SECONDS)
        if record.budget_seconds is not None:
            budget.add_metric((record.node,), record.budget_seconds)
        yield budget
        pending = _gauge(catalog.LLM_SPOT_NOTICE_PENDING)
        notice = self.pending()
        pending.add_metric(
            (record.node, notice.provider if notice else record.provider or "unknown"),
            1.0 if notice is not None else 0.0,
        )
        yield pending

    def describe(self) -> list[Metric]:
        """No fixed description: the families are built at collection."""
        return []


# ---- the agent ------------------------------------------------------------------------------


class SpotAgentSettings(ServiceSettings):
    """Settings of `redline spot-agent run`."""

    node: str | None = Field(
        None,
        # A DNS-1123 subdomain: a Kubernetes node's name (EKS: ip-10-0-1-2.ec2.internal).
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The node (required): its name at the gateways' /admin/spot when they list "
        "nodes as upstreams, and its Kubernetes node name on a cluster.",
    )
    provider: Literal["aws", "gcp", "manual"] = Field(
        "aws", description="Notice source: AWS IMDSv2, GCP metadata, or manual triggers only."
    )
    metadata_url: str = Field(
        "http://169.254.169.254", description="Base URL of the instance metadata service."
    )
    upstream_url: str | None = Field(
        None, description="The node's serving URL, where the replacement's readiness is checked."
    )
    gateway_urls: list[str] = Field(
        default_factory=list, description="Gateways in front of the node (their /admin/spot)."
    )
    gateway_token_file: Path | None = Field(
        None, description="File with the gateways' admin bearer token."
    )
    gateway_token: SecretStr | None = Field(
        None, description="The gateways' admin token itself (env REDLINE_GATEWAY_TOKEN)."
    )
    admin_token_file: Path | None = Field(
        None,
        description="File with the bearer token POST /notice requires (unset: the gateways' "
        "token; with no token and no admin_open, /notice answers 403).",
    )
    admin_token: SecretStr | None = Field(
        None, description="The /notice token itself (env REDLINE_ADMIN_TOKEN; the file wins)."
    )
    admin_open: bool = Field(
        False,
        description="Serve POST /notice without a token (logged as a warning at start-up; a "
        "trusted network or tests only). Exclusive with admin_token(_file).",
    )
    model: str | None = Field(
        None, description="Model the readiness gate expects (None: the first one listed)."
    )
    routing_key_prefix: str = Field(ROUTING_PREFIX, description="Routing store key prefix.")
    state_key_prefix: str = Field(DEFAULT_STATE_PREFIX, description="Node state key prefix.")
    poll_interval_seconds: float = Field(
        2.0, gt=0, description="AWS metadata poll interval (keep it <= the detection delay)."
    )
    gcp_wait_seconds: float = Field(30.0, gt=0, description="Longest GCP long-poll.")
    drain_on_rebalance: bool = Field(
        False, description="Treat an AWS rebalance recommendation as a notice (drain early)."
    )
    act: bool = Field(
        True,
        description="Run the drain flow on a notice (false: only export it, for the spot_drain "
        "playbook to act through Alertmanager).",
    )
    time_scale: float = Field(
        1.0, gt=0, le=1, description="Scale of the spec's spot durations (drills compress them)."
    )
    flow_poll_seconds: float = Field(0.1, gt=0, description="Poll interval of the flow's waits.")
    kubernetes: KubernetesSettings = Field(
        default_factory=KubernetesSettings,
        description="On a notice, taint the node and mark its serving pods not ready (off by "
        "default; the API connection also serves replacement.kind kubernetes).",
    )
    replacement: ReplacementSettings = Field(
        default_factory=ReplacementSettings,
        description="Ask for a replacement at notice time: none, kubernetes, webhook.",
    )

    @field_validator("gateway_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return value

    @model_validator(mode="after")
    def _check_admin(self) -> SpotAgentSettings:
        if self.admin_open and (self.admin_token_file is not None or self.admin_token):
            raise ValueError(
                "admin_open: true and an admin token (admin_token_file or REDLINE_ADMIN_TOKEN) "
                "are exclusive; keep the token, or remove it to open /notice"
            )
        return self

    def resolve_tokens(self) -> tuple[str | None, str | None]:
        """(the gateways' token, the /notice token): files first, then env, the /notice one
        falling back to the gateways'; SpotAgentError when a file is unreadable or empty."""
        try:
            gateway = read_secret(self.gateway_token_file, self.gateway_token, "gateway token")
            admin = read_secret(self.admin_token_file, self.admin_token, "admin token")
        except SettingsError as exc:
            raise SpotAgentError(str(exc)) from None
        gateway_token = None if gateway is None else gateway.get_secret_value().strip() or None
        admin_token = None if admin is None else admin.get_secret_value().strip() or None
        if admin is not None and admin_token is None:
            raise SpotAgentError("admin token (REDLINE_ADMIN_TOKEN) is empty")
        if gateway is not None and gateway_token is None:
            raise SpotAgentError("gateway token (REDLINE_GATEWAY_TOKEN) is empty")
        if admin_token is None and not self.admin_open:
            admin_token = gateway_token
        return gateway_token, admin_token


class ManualNotice(BaseModel):
    """`POST /notice`: a manual (test) interruption notice."""

    model_config = ConfigDict(extra="forbid")
    in_seconds: float = Field(gt=0, le=86400, description="Seconds until the node goes away.")
    reason: str = Field("manual trigger", max_length=200, description="Why (recorded).")


class SpotAgent:
    """Watches the node's notice sources and runs the flow for every interruption."""

    def __init__(
        self,
        settings: SpotAgentSettings,
        flow: SpotDrainFlow,
        sources: Sequence[NoticeSource],
        manual: ManualSource,
        metrics: SpotAgentMetrics | None = None,
        cluster: ClusterActions | None = None,
    ) -> None:
        self.settings = settings
        self.flow = flow
        self.sources = list(sources)
        self.manual = manual
        self.metrics = metrics
        self.cluster = cluster if cluster is not None else ClusterActions()
        self.stop = threading.Event()
        self.notices: queue.Queue[Notice] = queue.Queue()
        self.last_error: str | None = None
        self.watchers = [
            NoticeWatcher(
                source,
                self.notices.put,
                settings.poll_interval_seconds if source.provider == "aws" else 0.0,
                self.stop,
                self._error,
            )
            for source in self.sources
        ]
        self.thread = threading.Thread(target=self._run, name="spot-agent", daemon=True)

    def _error(self, message: str) -> None:
        self.last_error = message
        if self.metrics is not None:
            self.metrics.errors.labels(self.flow.node).inc()

    def record_error(self, message: str) -> None:
        """Count and keep a failure of a step beside the flow (Kubernetes, replacement)."""
        self._error(message)

    def trigger(self, in_seconds: float, reason: str) -> Notice:
        """A manual notice: the node goes away in `in_seconds`."""
        now = self.flow.clock()
        notice = Notice(
            self.flow.node, "manual", "interruption", "terminate", now, now,
            now + in_seconds, reason,
        )  # fmt: skip
        self.notices.put(notice)
        return notice

    def start(self) -> None:
        """Start the watchers, the flow thread and the pods' readiness reconcile."""
        for watcher in self.watchers:
            watcher.start()
        self.thread.start()
        self.cluster.start(self.stop)

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching and wait (bounded) for the threads."""
        self.stop.set()
        self.thread.join(timeout)
        for watcher in self.watchers:
            watcher.join(0.5)
        self.cluster.join(timeout)

    def _run(self) -> None:
        # A replacement's agent (or a restarted one) finishes what the last one left undone.
        self._continue(self.flow.record())
        last_check = time.monotonic()
        while not self.stop.is_set():
            try:
                notice = self.notices.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() - last_check >= RECHECK_SECONDS:
                    # Past the readiness timeout the node stays closed; keep looking, slowly,
                    # so a replacement that comes up late is still admitted.
                    last_check = time.monotonic()
                    self._recheck()
                continue
            self.handle(notice)
            last_check = time.monotonic()

    def _recheck(self) -> None:
        try:
            record = self.flow.record()
            if record.state is NodeState.TERMINATING:
                self.flow.recover(0.0, self.stop)
        except (SpotAgentError, SpotStateError, httpx.HTTPError, redis.RedisError) as exc:
            self._error(f"recheck: {type(exc).__name__}: {exc}")

    def handle(self, notice: Notice) -> NodeRecord | None:
        """Run the flow for one notice (rebalance notices only drain when configured)."""
        if self.metrics is not None:
            self.metrics.notices.labels(notice.node, notice.provider, notice.kind).inc()
        log.warning("notice for %s: %s %s (%s)", notice.node, notice.kind, notice.action,
                    notice.detail)  # fmt: skip
        if notice.kind == "rebalance" and not self.settings.drain_on_rebalance:
            return None
        if notice.kind == "rebalance":
            notice = replace(notice, kind="interruption")
        try:
            self.flow.store.put_notice(notice)
        except redis.RedisError as exc:
            self._error(f"notice store: {type(exc).__name__}: {exc}")
        if not self.settings.act:
            return None
        try:
            record = self.flow.drain(notice)
        except (SpotAgentError, SpotStateError, httpx.HTTPError, redis.RedisError) as exc:
            self._error(f"drain: {type(exc).__name__}: {exc}")
            log.error("drain of %s failed: %s", notice.node, exc)
            return None
        return self._continue(record)

    def _continue(self, record: NodeRecord) -> NodeRecord:
        try:
            if record.state is NodeState.DRAINING:
                record = self.flow.wait_drained(self.stop)
            if record.state is NodeState.TERMINATING and not self.stop.is_set():
                record = self.flow.recover(self.flow.spot.readiness_timeout_seconds, self.stop)
        except (SpotAgentError, SpotStateError, httpx.HTTPError, redis.RedisError) as exc:
            self._error(f"flow: {type(exc).__name__}: {exc}")
            log.error("spot flow of %s failed: %s", record.node, exc)
        return record


def build_sources(
    settings: SpotAgentSettings, node: str, spot: Spot, client: httpx.Client
) -> tuple[list[NoticeSource], ManualSource]:
    """The node's cloud source (if any) and its manual source."""
    manual = ManualSource()
    sources: list[NoticeSource] = [manual]
    if settings.provider == "aws":
        sources.append(AwsImdsSource(node, settings.metadata_url, spot, client))
    elif settings.provider == "gcp":
        sources.append(
            GcpMetadataSource(node, settings.metadata_url, spot, client, settings.gcp_wait_seconds)
        )
    return sources, manual


def build_cluster_actions(
    settings: SpotAgentSettings,
    redis_client: redis.Redis,
    on_replacement: Callable[[str, str], None] | None = None,
    on_error: Callable[[str], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[ClusterActions, list[Callable[[], None]]]:
    """The node's Kubernetes actions and replacement provider per the settings (nothing when
    both are off), and what to close; SpotAgentError naming a missing setting."""
    closers: list[Callable[[], None]] = []
    nodes = None
    if settings.kubernetes.enabled:
        target = settings.kubernetes.resolve(environ)
        if target.insecure:
            log.warning("kubernetes: the API server's certificate is NOT verified "
                        "(insecure_skip_tls_verify)")  # fmt: skip
        client = KubernetesClient.from_target(target)
        closers.append(client.close)
        nodes = NodeActions.from_target(client, target)
    provider = build_replacement_provider(settings.replacement, settings.kubernetes, environ)
    runner = None
    if provider is not None:
        closers.append(provider.close)
        ledger = ReplacementLog(redis_client, settings.state_key_prefix)
        runner = ReplacementRunner(
            provider,
            ledger,
            on_result=None
            if on_replacement is None
            else lambda result: on_replacement(result.via, result.outcome),
        )
    cluster = ClusterActions(
        nodes, runner, settings.kubernetes.ready_interval_seconds, on_error=on_error
    )
    return cluster, closers


def build_agent_auth(settings: SpotAgentSettings) -> tuple[str | None, AdminAuth]:
    """The token the agent sends to the gateways, and the check of its own `POST /notice`;
    SpotAgentError when a token is unusable."""
    token, admin_token = settings.resolve_tokens()
    return token, AdminAuth("spot agent", admin_token, settings.admin_open, ADMIN_HOWTO)


def build_agent_app(
    settings: SpotAgentSettings, spot: Spot, registry: CollectorRegistry | None = None
) -> FastAPI:
    """The agent's ASGI app; the agent runs while the app is served."""
    if settings.node is None:
        raise SpotAgentError("node: required (--node NAME, the node's upstream name)")
    node = settings.node
    token, auth = build_agent_auth(settings)
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    client = httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False)
    store = SpotStateStore.from_url(settings.redis_url, settings.state_key_prefix)
    routing = RoutingStore.from_url(settings.redis_url, settings.routing_key_prefix)
    holder: dict[str, NodeRecord] = {"record": NodeRecord(node)}
    pending: dict[str, Notice | None] = {"notice": None}
    metrics = SpotAgentMetrics(
        registry, lambda: holder["record"], lambda: pending["notice"], time.time
    )

    def replaced(via: str, outcome: str) -> None:
        metrics.replacements.labels(node, via, outcome).inc()

    def cluster_error(message: str) -> None:
        agent.record_error(message)  # `agent` is bound below; this runs once it has started

    try:
        cluster, closers = build_cluster_actions(settings, store.client, replaced, cluster_error)
    except SpotError:
        client.close()
        store.close()
        routing.close()
        raise

    def observed(record: NodeRecord) -> None:
        holder["record"] = record
        waited = record.notice_to_draining
        if waited is not None:
            metrics.notice_to_draining.labels(record.node, record.provider).observe(waited)

    flow = SpotDrainFlow(
        node,
        spot,
        store,
        routing,
        GatewayAdmin(settings.gateway_urls, client, token),
        ReadinessGate(client, settings.model),
        settings.upstream_url,
        poll_seconds=settings.flow_poll_seconds,
        on_draining=observed,
        on_notice=cluster.notice if cluster.enabled else None,
        on_recovered=cluster.recovered if cluster.nodes is not None else None,
    )
    sources, manual = build_sources(settings, node, spot, client)
    agent = SpotAgent(settings, flow, sources, manual, metrics, cluster)

    def refresh() -> NodeRecord:
        try:
            holder["record"] = store.get(node)
            pending["notice"] = store.notice_pending(node)
        except (redis.RedisError, SpotError) as exc:
            log.warning("node state unreadable: %s", exc)
        return holder["record"]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        auth.announce(log)  # here, once logging is set up and the banner printed
        refresh()
        agent.start()
        try:
            yield
        finally:
            agent.close()
            for close in closers:
                close()
            client.close()
            store.close()
            routing.close()

    app = FastAPI(title=f"redline spot agent ({node})", docs_url=None, lifespan=lifespan)
    app.state.agent = agent

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        refresh()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/state")
    async def state() -> dict[str, Any]:
        record = refresh()
        notice = pending["notice"]
        return {
            "node": record.node,
            "state": record.state.value,
            "record": record.to_fields(),
            "notice_to_draining": record.notice_to_draining,
            "replacement_latency": record.replacement_latency(time.time()),
            "drain_reports": flow.last_reports,
            "readiness": None if flow.last_check is None else flow.last_check.as_dict(),
            "pending_notice": None if notice is None else vars(notice),
            "last_error": agent.last_error,
            "cluster": agent.cluster.state(),
        }

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "node": node, "provider": settings.provider}

    @app.post("/notice")
    async def notice(request: Request) -> Response:
        refused = auth.check(request.headers.get("authorization"))
        if refused is not None:
            return JSONResponse(
                {"detail": refused.message}, status_code=refused.status, headers=refused.headers
            )
        try:
            body = ManualNotice.model_validate(await request.json())
        except ValueError as exc:
            return JSONResponse({"detail": f"invalid notice: {exc}"}, status_code=422)
        issued = agent.trigger(body.in_seconds, body.reason)
        return JSONResponse({"node": issued.node, "terminate_at": issued.terminate_at})

    return app


__all__ = [
    "DEFAULT_AGENT_PORT",
    "ManualNotice",
    "SpotAgent",
    "SpotAgentMetrics",
    "SpotAgentSettings",
    "build_agent_app",
    "build_agent_auth",
    "build_cluster_actions",
    "build_sources",
]
