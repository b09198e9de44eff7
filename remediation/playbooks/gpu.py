"""`gpu_node_failure`: cordon and drain a GPU node whose GPU reported a drain-now XID.

Target: the alert's `node` label (`GPUXidCritical`, `spec.gpu.playbook`), the Kubernetes node;
its serving instance is `serving.upstreams[node_upstreams.get(node, node)]`.

A GPU that must be drained now is a spot preemption whose notice the XID gave: this playbook is
`spot_drain` (`remediation/playbooks/spot.py`, which it subclasses) with a synthetic notice and a
cordon in front. Reused from spot, unchanged:

- `SpotDrain._flow`/`_spot`: the spec's spot timings, the stores and the gateways' admin client;
- `redline.platform.spot.SpotDrainFlow`: `drain` (admission closed at every gateway
  (`GatewayAdmin`) and in the routing store, in-flight requests triaged against the drain
  budget), `wait_drained`, `recover` (the replacement passes the `ReadinessGate`: health, model
  loaded, a dummy inference, and a serving instance other than the failed one; admission opens);
- the notice: a `Notice` (provider `gpu-xid`, kind `interruption`) detected when the drain
  starts, ending `notice_seconds` later; `build_drain_budget` makes the budget of it, as for an
  AWS notice that names its termination time. It is stored (`SpotStateStore.put_notice`) beside
  the node's record, under a prefix of its own (`redline:gpu`, not spot's), so a GPU drain never
  shows as a pending spot notice or moves a spot agent's state machine;
- `KubernetesSettings.resolve` (the in-cluster API connection) and `KubernetesClient.taint_node`
  (a NoSchedule taint, read-modify-write with the node's resourceVersion).

Firing (every step reads the current state first and does only what is missing):

- plan (read only): the node's taint and its GPU drain record. `cordon` when the taint is
  missing; `drain`, `wait_drained`, `recover` as spot plans them, a drain "handled" when it
  started at or after the alert's `startsAt`; a read-only `check` when nothing is left.
- verify: the node is tainted, and its admission agrees with its record: RECOVERED and open.

A replacement not ready within the readiness timeout fails the `recover` step: the node stays
cordoned and its admission closed, and the job's error says so. The taint stays after recovery
too: the failed node needs a GPU reset or a reboot first, then an operator removes it
(`kubectl taint nodes NODE redline.dev/gpu-failed-`).

Recovery time: when `recover` moves the node to RECOVERED, the playbook observes
`llm_node_failure_recovery_seconds{mode}` (a histogram in the receiver's run-metrics hash,
`redline.remediation.jobs.write_recovery`; the receiver's `/metrics` serves it, as it does the
run counters of workers in other processes). Recovery is from the drain's start (the synthetic
notice's `detected_at`: admission closing) to the replacement passing the readiness gate
(`recovered_at`), so it includes the drain and the wait for the failed instance to go. The mode
is what the gate saw (`SpotDrainFlow.last_waits`): `warm` when the first replacement it reached
passed (it was already loaded; checks the failed instance itself still answered do not count:
they wait for it to go, not for a rebuild), `cold` when it failed checks on the replacement
first: nothing listening yet, or a replacement up but its model not loaded (a pod rebuild:
scheduled, started and loaded while the gate waited).
A `recover` that found the node already RECOVERED (a retried step) observes nothing, so one
recovery is counted once; a replacement never ready is no observation either: the job fails
and escalates instead. Redis failing that write is logged: the node did recover, the step stands.

A Kubernetes refusal (401, 403, 404, a bad request) fails the job at once, naming what to fix;
a timeout, 429 or 5xx the client already retried is retried with the job (bounded by
`max_attempts`). The Kubernetes
connection is resolved per job, not at start-up: a receiver outside a cluster (the devstack)
must start, and `settings_problems` names only the missing gateway, as spot's does.

Options (`playbook_options.gpu_node_failure`, `GpuNodeFailure.Options`): spot's (`redis_url`,
`routing_key_prefix`, `state_key_prefix` (default `redline:gpu`), `gateway_urls`,
`gateway_token_file`, `model`, `time_scale`, `readiness_timeout_seconds`, `poll_seconds`), and
`notice_seconds`, `node_upstreams`, `taint_key`, `kubernetes_api_url`, `kubernetes_token_file`,
`kubernetes_ca_file`, `kubernetes_insecure_skip_tls_verify`, `kubernetes_timeout_seconds`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import redis
from pydantic import Field, field_validator

from redline.platform.endpoints import check_base_url
from redline.platform.spot import (
    KubernetesClient,
    KubernetesError,
    KubernetesSettings,
    NodeRecord,
    NodeState,
    Notice,
    SpotAgentError,
    SpotDrainFlow,
)
from redline.platform.spot.kubernetes import has_taint
from redline.platform.spot.kubernetes_settings import SERVICE_ACCOUNT
from redline.remediation.jobs import StoreKeys, write_recovery
from redline.remediation.playbook import (
    PlannedStep,
    PlaybookContext,
    PlaybookError,
    StepResult,
    TransientError,
)
from redline.remediation.playbooks.spot import (
    SpotDrain,
    SpotDrainOptions,
    build_drain_tail,
    drain_handled,
)
from redline.remediation.settings import RemediationSettings
from redline.slo import catalog

DEFAULT_GPU_STATE_PREFIX = "redline:gpu"
DEFAULT_GPU_TAINT_KEY = "redline.dev/gpu-failed"
NOTICE_PROVIDER = "gpu-xid"
RBAC_RULES: tuple[dict[str, tuple[str, ...]], ...] = (
    {"apiGroups": ("",), "resources": ("nodes",), "verbs": ("get", "patch")},
)
"""What the playbook calls on Kubernetes (nodes are cluster-scoped: a ClusterRole)."""


class GpuNodeFailureOptions(SpotDrainOptions):
    """`playbook_options.gpu_node_failure`: spot's drain options, the cordon and the notice."""

    state_key_prefix: str = Field(
        DEFAULT_GPU_STATE_PREFIX,
        min_length=1,
        description="Key prefix of the GPU drains' node records and notices (apart from spot's).",
    )
    notice_seconds: float | None = Field(
        None,
        gt=0,
        description="The node's notice window (drain budget: this - the spec's detection delay, "
        "ingress removal, safety margin); default: the spec's shortest spot window, scaled.",
    )
    node_upstreams: dict[str, str] = Field(
        default_factory=dict,
        description="Kubernetes node -> its serving.upstreams name (default: the node's name).",
    )
    taint_key: str = Field(
        DEFAULT_GPU_TAINT_KEY, min_length=1, description="The NoSchedule taint that cordons it."
    )
    kubernetes_api_url: str | None = Field(
        None,
        description="API server (None: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).",
    )
    kubernetes_token_file: Path = Field(
        SERVICE_ACCOUNT / "token", description="Bearer token file (re-read on every request)."
    )
    kubernetes_ca_file: Path | None = Field(
        SERVICE_ACCOUNT / "ca.crt", description="CA bundle of the API server (None: system CAs)."
    )
    kubernetes_insecure_skip_tls_verify: bool = Field(
        False, description="Do not verify the API server's certificate (tests only)."
    )
    kubernetes_timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="Timeout of one Kubernetes API request."
    )

    @field_validator("kubernetes_api_url")
    @classmethod
    def _api(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value, "kubernetes_api_url")

    @field_validator("node_upstreams")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        blank = sorted(node for node, upstream in value.items() if not (node and upstream.strip()))
        if blank:
            raise ValueError(f"blank node or upstream name: {', '.join(map(repr, blank))}")
        return value


def build_gpu_plan(
    node: str, upstream: str, tainted: bool, record: NodeRecord, since: float
) -> list[PlannedStep]:
    """The steps still missing for a GPU failure that started at `since`, from the node's taint
    and its GPU drain record (pure)."""
    info: dict[str, Any] = {"node": node, "upstream": upstream, "state": record.state.value}
    handled = drain_handled(record, since)
    steps: list[PlannedStep] = []
    if not tainted:
        steps.append(PlannedStep("cordon", f"taint {node} NoSchedule: no new pods on it", info))
    if not handled and record.state in (NodeState.READY, NodeState.RECOVERED):
        steps.append(
            PlannedStep(
                "drain",
                f"close {upstream}'s admission and triage its in-flight requests",
                {**info, "since": since},
            )
        )
    steps.extend(build_drain_tail(upstream, record, handled, info))
    if not steps:
        steps.append(
            PlannedStep("check", f"{node} already cordoned and {upstream} recovered", info, True)
        )
    return steps


def build_recovery(record: NodeRecord, checks: int, waits: int) -> tuple[str, float] | None:
    """The mode and seconds of the recovery `recover` just made, from the node's record, the
    readiness checks it took and how many of them waited on the replacement (None: it made no
    check, or the record has no drain start)."""
    if checks < 1 or record.state is not NodeState.RECOVERED:
        return None
    if record.detected_at is None or record.recovered_at is None:
        return None
    mode = catalog.RECOVERY_WARM if waits == 0 else catalog.RECOVERY_COLD
    return mode, max(0.0, record.recovered_at - record.detected_at)


def build_notice(upstream: str, node: str, window: float, now: float, alert: str) -> Notice:
    """The synthetic notice of a GPU drain: detected now, the node gone in `window` seconds."""
    return Notice(
        node=upstream,
        provider=NOTICE_PROVIDER,
        kind="interruption",
        action="drain",
        noticed_at=now,
        detected_at=now,
        terminate_at=now + window,
        detail=f"{alert} on node {node}",
    )


class GpuNodeFailure(SpotDrain):
    """Cordon -> DRAINING -> TERMINATING -> RECOVERED for the alert's GPU node."""

    name = "gpu_node_failure"
    target_label = "node"
    Options = GpuNodeFailureOptions
    options: GpuNodeFailureOptions

    metrics_key: str = StoreKeys(RemediationSettings.model_fields["key_prefix"].default).metrics
    """The receiver's run-metrics hash, where the recovery histogram is observed."""

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: SpotDrainOptions) -> Self:
        """spot's drain, observing recoveries in the receiver's run-metrics hash."""
        playbook = super().from_settings(settings, options)
        playbook.metrics_key = StoreKeys(settings.key_prefix).metrics
        return playbook

    def settings_problems(self) -> Sequence[str]:
        """A gateway to drain through (the Kubernetes connection is resolved per job)."""
        if not self.options.gateway_urls and not self.serving.gateway_url:
            return [
                f"serving.gateway_url (or playbook_options.{self.name}.gateway_urls) is not set "
                "(the gateways that close a failed GPU node's admission)"
            ]
        return []

    # ---- helpers -----------------------------------------------------------------------------

    def _upstream(self, ctx: PlaybookContext) -> tuple[str, str]:
        node = ctx.labels[self.target_label].strip()
        upstream = self.options.node_upstreams.get(node, node)
        if upstream not in self.serving.upstreams:
            raise PlaybookError(
                f"{self.name}: node {node!r} serves no upstream: {upstream!r} is not among "
                f"serving.upstreams ({', '.join(self.serving.upstreams) or 'none configured'}); "
                f"map it in playbook_options.{self.name}.node_upstreams"
            )
        return node, upstream

    @contextmanager
    def _kubernetes(self) -> Iterator[KubernetesClient]:
        options = self.options
        settings = KubernetesSettings(
            api_url=options.kubernetes_api_url,
            token_file=options.kubernetes_token_file,
            ca_file=options.kubernetes_ca_file,
            insecure_skip_tls_verify=options.kubernetes_insecure_skip_tls_verify,
            timeout_seconds=options.kubernetes_timeout_seconds,
        )
        try:
            target = settings.resolve(node_actions=False)
        except KubernetesError as exc:
            where = f"playbook_options.{self.name}.kubernetes_"
            raise PlaybookError(f"{self.name}: {str(exc).replace('kubernetes.', where)}") from None
        client = KubernetesClient.from_target(target)
        try:
            yield client
        except KubernetesError as exc:
            # The client already retried timeouts, 429 and 5xx: a refusal (401, 403, 404) or
            # a bad request stays one at the next attempt.
            if exc.permanent:
                raise PlaybookError(f"{self.name}: {exc}") from exc
            raise TransientError(f"{self.name}: {exc}") from exc
        finally:
            client.close()

    def _tainted(self, kube: KubernetesClient, node: str) -> bool:
        return has_taint(kube.get_node(node), self.options.taint_key)

    def _window(self, flow: SpotDrainFlow) -> float:
        if self.options.notice_seconds is not None:
            return self.options.notice_seconds
        windows = flow.spot.notice_seconds
        return min(windows.aws, windows.gcp)

    @staticmethod
    def _since(ctx: PlaybookContext) -> float:
        return ctx.alert.starts_at.timestamp()

    # ---- firing ------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """The steps the node still needs: cordon, drain, wait drained, recover."""
        node, upstream = self._upstream(ctx)
        with self._kubernetes() as kube:
            tainted = self._tainted(kube, node)
        with self._flow(ctx, upstream) as flow:
            record = flow.record()
        return build_gpu_plan(node, upstream, tainted, record, self._since(ctx))

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Carry out one step (each reads the current state first)."""
        node, upstream = self._upstream(ctx)
        if step.name == "cordon":
            with self._kubernetes() as kube:
                changed = kube.taint_node(node, self.options.taint_key, NOTICE_PROVIDER)
            return StepResult.success(
                f"{node} {'tainted' if changed else 'already tainted'} "
                f"{self.options.taint_key}:NoSchedule",
                changed=changed,
            )
        if step.name == "check":
            return self._check(ctx, node, upstream)
        if step.name == "drain":
            with self._flow(ctx, upstream) as flow:
                record = flow.record()
                if drain_handled(record, self._since(ctx)):
                    return StepResult.success(
                        f"{upstream} already {record.state.value}", state=record.state.value
                    )
                alertname = ctx.labels.get("alertname", "a GPU failure")
                notice = build_notice(upstream, node, self._window(flow), time.time(), alertname)
                try:
                    flow.store.put_notice(notice)
                    record = flow.drain(notice)
                except SpotAgentError as exc:
                    raise TransientError(f"{self.name}: {exc}") from exc
                ctx.record("triage", f"{len(flow.last_reports)} gateway(s) drained",
                           reports=flow.last_reports)  # fmt: skip
            return StepResult.success(
                f"{upstream} {record.state.value}: budget {record.budget_seconds} s",
                state=record.state.value,
                budget_seconds=record.budget_seconds,
            )
        if step.name in ("wait_drained", "recover"):
            # spot's steps, on the GPU drain's own records
            return super().execute(ctx, step)
        return StepResult.failure(f"{self.name}: unknown step {step.name!r}")

    def _recovered(self, ctx: PlaybookContext, flow: SpotDrainFlow, record: NodeRecord) -> None:
        """Observe the recovery time and mode (see the module doc); audited with the step."""
        observed = build_recovery(record, flow.last_checks, flow.last_waits)
        if observed is None:
            return
        mode, seconds = observed
        try:
            write_recovery(ctx.redis, self.metrics_key, mode, seconds)
        except redis.RedisError as exc:
            # The node did recover: a lost observation must not fail (and re-run) the step.
            ctx.log.warning("%s: recovery of %s not observed: %s", self.name, flow.node, exc)
        ctx.record("recovery", f"{mode} recovery in {seconds:.3f} s", mode=mode,
                   seconds=round(seconds, 3), checks=flow.last_checks,
                   waits=flow.last_waits)  # fmt: skip

    def _node(self, ctx: PlaybookContext) -> str:
        """spot's steps act on the node's upstream."""
        return self._upstream(ctx)[1]

    def _check(self, ctx: PlaybookContext, node: str, upstream: str) -> StepResult:
        with self._kubernetes() as kube:
            tainted = self._tainted(kube, node)
        with self._flow(ctx, upstream) as flow:
            record = flow.record()
            admission = flow.routing.get_admission(upstream)
        data: dict[str, Any] = {
            "tainted": tainted,
            "state": record.state.value,
            "admission_open": admission.open,
        }
        if not tainted:
            return StepResult.failure(f"{node} is not tainted {self.options.taint_key}", **data)
        if not drain_handled(record, self._since(ctx)):
            return StepResult.failure(f"{upstream} was not drained for this failure", **data)
        recovered = record.state is NodeState.RECOVERED
        if recovered != admission.open:
            return StepResult.failure(
                f"{upstream} is {record.state.value} but its admission is "
                f"{'open' if admission.open else 'closed'}",
                **data,
            )
        if not recovered:
            return StepResult.failure(
                f"{upstream} is {record.state.value}: its replacement is not ready; {node} stays "
                "cordoned and its admission closed",
                **data,
            )
        return StepResult.success(
            f"{node} cordoned, {upstream} recovered, admission open",
            replacement_latency=record.replacement_latency(time.time()),
            **data,
        )

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The node is tainted; its upstream recovered from this failure, admission open."""
        node, upstream = self._upstream(ctx)
        return self._check(ctx, node, upstream)


__all__ = [
    "DEFAULT_GPU_STATE_PREFIX",
    "DEFAULT_GPU_TAINT_KEY",
    "RBAC_RULES",
    "GpuNodeFailure",
    "GpuNodeFailureOptions",
    "build_gpu_plan",
    "build_notice",
    "build_recovery",
]
