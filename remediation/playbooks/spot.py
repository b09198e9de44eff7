"""`spot_drain`: drain a spot node that got an interruption notice, from Alertmanager.

Target: the alert's `node` label (`SpotPreemptionNotice` fires while a node's notice is pending,
i.e. stored by its spot agent but not drained). The spot agent normally drains the node itself
within a second of the notice; this playbook runs the same flow (`redline.platform.spot.
SpotDrainFlow`) when it did not: an agent started with `act: false`, or one whose drain failed.

Firing:
- plan (read only): the node's stored notice and state; the steps still missing of `drain`
  (READY/RECOVERED -> DRAINING: admission closed in the routing store and at every gateway, the
  in-flight requests triaged against the drain budget), `wait_drained` (-> TERMINATING once
  nothing runs on the node or the budget is spent) and `recover` (-> RECOVERED once the replacement
  at `serving.upstreams[node]` passes the readiness gate: health, model loaded, a dummy
  inference; then admission opens again).
- verify: the node is RECOVERED after this notice and its admission is open.

Each step reads the node's state first and does only what is missing, so a retried or reclaimed
job is harmless. A replacement that is not ready within the readiness timeout fails the job
(admission stays closed; `SpotReplacementSlow` pages).

Options (`playbook_options.spot_drain`, the typed `SpotDrain.Options`, validated at start-up):
`redis_url`, `routing_key_prefix`, `state_key_prefix`, `gateway_urls` (default:
`serving.gateway_url`), `gateway_token_file`, `model` (default: `serving.probe_model`),
`time_scale` (drills), `readiness_timeout_seconds` (default: the spec's), `poll_seconds`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import httpx
import redis
from pydantic import BaseModel, ConfigDict, Field

from redline.core.settings import SettingsError, read_secret
from redline.platform.routing import DEFAULT_PREFIX as ROUTING_PREFIX
from redline.platform.routing import RoutingError, RoutingStore
from redline.platform.spot import (
    DEFAULT_STATE_PREFIX,
    GatewayAdmin,
    NodeRecord,
    NodeState,
    ReadinessGate,
    SpotAgentError,
    SpotDrainFlow,
    SpotError,
    SpotStateStore,
    scale_spot,
)
from redline.remediation.playbook import (
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RemediationSettings, ServingSettings
from redline.slo.load import SpecError, apply_profile, load_spec
from redline.slo.spec import Spot


class SpotDrainOptions(BaseModel):
    """`playbook_options.spot_drain`: where the drain's state lives and how it waits."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    redis_url: str | None = Field(None, description="Redis of the stores (default: receiver's).")
    routing_key_prefix: str = Field(ROUTING_PREFIX, description="Routing store key prefix.")
    state_key_prefix: str = Field(DEFAULT_STATE_PREFIX, description="Spot state key prefix.")
    gateway_urls: list[str] = Field(
        default_factory=list, description="Gateways to drain (default: serving.gateway_url)."
    )
    gateway_token_file: Path | None = Field(None, description="Gateways' admin token file.")
    model: str | None = Field(None, description="Model the readiness gate expects.")
    time_scale: float = Field(1.0, gt=0, le=1, description="Scale of the spec's spot durations.")
    readiness_timeout_seconds: float | None = Field(
        None, gt=0, description="Longest wait for the replacement (default: the spec's)."
    )
    poll_seconds: float = Field(0.25, gt=0, description="Poll interval of the waits.")


def drain_handled(record: NodeRecord, since: float) -> bool:
    """Whether a drain of the node started at or after `since` (its notice, or the alert)."""
    return record.draining_at is not None and record.draining_at >= since


def build_drain_tail(
    target: str, record: NodeRecord, handled: bool, info: dict[str, Any]
) -> list[PlannedStep]:
    """`wait_drained` and `recover`, while the drain is not handled yet or still in progress."""
    if handled and record.state not in (NodeState.DRAINING, NodeState.TERMINATING):
        return []
    return [
        PlannedStep("wait_drained", f"wait until nothing runs on {target}", info),
        PlannedStep(
            "recover",
            f"wait for {target}'s replacement to pass the readiness gate, then reopen its "
            "admission",
            info,
        ),
    ]


class SpotDrain(Playbook):
    """Notice -> DRAINING -> TERMINATING -> RECOVERED for the alert's node."""

    name = "spot_drain"
    target_label = "node"
    Options = SpotDrainOptions

    def __init__(
        self,
        options: SpotDrainOptions,
        serving: ServingSettings,
        redis_url: str,
        spec_path: Path | None = None,
        profile: str | None = None,
    ) -> None:
        self.options = options
        self.serving = serving
        self.redis_url = redis_url
        self.spec_path = spec_path
        self.profile = profile

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: SpotDrainOptions) -> Self:
        """The drain on `settings.serving`, its spot timings from the spec (read per job)."""
        return cls(options, settings.serving, settings.redis_url, settings.spec, settings.profile)

    def settings_problems(self) -> Sequence[str]:
        """A gateway to drain through (the options were validated when it was built)."""
        if not self.options.gateway_urls and not self.serving.gateway_url:
            return [
                "serving.gateway_url (or playbook_options.spot_drain.gateway_urls) is not set "
                "(the gateways that close a draining node's admission)"
            ]
        return []

    # ---- helpers -----------------------------------------------------------------------------

    def _spot(self, options: SpotDrainOptions) -> Spot:
        try:
            spot = apply_profile(load_spec(self.spec_path).spec, self.profile).spot
        except SpecError as exc:
            raise PlaybookError(f"{self.name}: spec: {'; '.join(exc.problems)}") from None
        if options.time_scale != 1:
            spot = scale_spot(spot, options.time_scale)
        return spot

    def _node(self, ctx: PlaybookContext) -> str:
        node = ctx.labels[self.target_label].strip()
        if node not in self.serving.upstreams:
            raise PlaybookError(
                f"{self.name}: node {node!r} is not among serving.upstreams "
                f"({', '.join(self.serving.upstreams) or 'none configured'})"
            )
        return node

    @contextmanager
    def _flow(self, ctx: PlaybookContext, node: str) -> Iterator[SpotDrainFlow]:
        options = self.options
        gateways = options.gateway_urls or (
            [self.serving.gateway_url] if self.serving.gateway_url else []
        )
        if not gateways:
            raise PlaybookError(
                f"{self.name}: not configured: set serving.gateway_url or "
                f"playbook_options.{self.name}.gateway_urls"
            )
        try:
            secret = read_secret(options.gateway_token_file, None, "gateway admin token")
        except SettingsError as exc:
            raise PlaybookError(f"{self.name}: {exc}") from None
        token = None if secret is None else secret.get_secret_value()
        spot = self._spot(options)
        if options.readiness_timeout_seconds is not None:
            spot = spot.model_copy(
                update={"readiness_timeout_seconds": options.readiness_timeout_seconds}
            )
        url = options.redis_url or self.redis_url
        store = SpotStateStore.from_url(url, options.state_key_prefix)
        routing = RoutingStore.from_url(url, options.routing_key_prefix)
        timeout = max(2.0, self.serving.timeout_seconds)
        client = httpx.Client(timeout=httpx.Timeout(timeout, connect=2.0), trust_env=False)
        try:
            yield SpotDrainFlow(
                node,
                spot,
                store,
                routing,
                GatewayAdmin(gateways, client, token),
                ReadinessGate(client, options.model or self.serving.probe_model),
                self.serving.upstreams[node],
                poll_seconds=options.poll_seconds,
                tick=ctx.ensure_lease,
            )
        except (redis.RedisError, httpx.TransportError) as exc:
            raise TransientError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        except (SpotError, RoutingError) as exc:
            raise PlaybookError(f"{self.name}: {exc}") from None
        finally:
            client.close()
            store.close()
            routing.close()

    # ---- firing ------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """The steps the node still needs for its pending notice."""
        node = self._node(ctx)
        with self._flow(ctx, node) as flow:
            notice = flow.store.get_notice(node)
            record = flow.record()
            if notice is None:
                raise PlaybookError(f"{self.name}: node {node} has no stored notice to drain")
            handled = drain_handled(record, notice.detected_at)
            budget = (
                flow.spot.drain_budget(notice.provider) if notice.provider != "manual" else None
            )
        steps = []
        info = {"node": node, "state": record.state.value, "provider": notice.provider}
        if not handled and record.state in (NodeState.READY, NodeState.RECOVERED):
            steps.append(
                PlannedStep(
                    "drain",
                    f"close {node}'s admission and triage its in-flight requests "
                    f"(drain budget {budget if budget is None else round(budget, 3)} s)",
                    {**info, "notice_detected_at": notice.detected_at},
                )
            )
        steps.extend(build_drain_tail(node, record, handled, info))
        if not steps:
            steps.append(PlannedStep("recover", f"{node} already recovered from its notice", info))
        return steps

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Carry out one step of the flow (each checks the node's state first)."""
        node = self._node(ctx)
        with self._flow(ctx, node) as flow:
            try:
                if step.name == "drain":
                    notice = flow.store.get_notice(node)
                    if notice is None:
                        return StepResult.failure(f"node {node} has no stored notice")
                    record = flow.drain(notice)
                    ctx.record("triage", f"{len(flow.last_reports)} gateway(s) drained",
                               reports=flow.last_reports)  # fmt: skip
                    return StepResult.success(
                        f"{node} {record.state.value}: budget {record.budget_seconds} s, "
                        f"notice -> DRAINING {record.notice_to_draining} s",
                        state=record.state.value,
                        notice_to_draining=record.notice_to_draining,
                    )
                if step.name == "wait_drained":
                    record = flow.wait_drained()
                    return StepResult.success(f"{node} {record.state.value}",
                                              state=record.state.value)  # fmt: skip
                if step.name == "recover":
                    record = flow.recover(flow.spot.readiness_timeout_seconds)
                    check = flow.last_check.as_dict() if flow.last_check else None
                    if record.state is not NodeState.RECOVERED:
                        return StepResult.failure(
                            f"{node}'s replacement is not ready after "
                            f"{flow.spot.readiness_timeout_seconds:g} s "
                            f"({check['detail'] if check else 'no check'}): admission stays closed",
                            readiness=check,
                        )
                    self._recovered(ctx, flow, record)
                    return StepResult.success(
                        f"{node} recovered: {record.detail}",
                        state=record.state.value,
                        replacement_latency=record.replacement_latency(time.time()),
                        readiness=check,
                    )
            except SpotAgentError as exc:
                raise TransientError(f"{self.name}: {exc}") from exc
        return StepResult.failure(f"{self.name}: unknown step {step.name!r}")

    def _recovered(self, ctx: PlaybookContext, flow: SpotDrainFlow, record: NodeRecord) -> None:
        """Called once `recover` found the node RECOVERED (by it, or before it: see
        `flow.last_checks`); a subclass observes the recovery here."""

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The node recovered from its notice and admits requests again."""
        node = self._node(ctx)
        with self._flow(ctx, node) as flow:
            record = flow.record()
            notice = flow.store.get_notice(node)
            admission = flow.routing.get_admission(node)
        if record.state is not NodeState.RECOVERED:
            return StepResult.failure(f"{node} is {record.state.value}, not recovered")
        if notice is not None and (record.draining_at or 0) < notice.detected_at:
            return StepResult.failure(f"{node} never drained for its last notice")
        if not admission.open:
            return StepResult.failure(f"{node}'s admission is still closed ({admission.reason})")
        return StepResult.success(
            f"{node} recovered, admission open",
            notice_to_draining=record.notice_to_draining,
            replacement_latency=record.replacement_latency(time.time()),
        )


__all__ = ["build_drain_tail", "drain_handled", "SpotDrain", "SpotDrainOptions"]
