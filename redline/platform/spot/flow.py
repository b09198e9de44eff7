"""The drain flow of one spot node, step by step, each step idempotent (it reads the node's state
first), so the agent and the `spot_drain` playbook drive the same flow:

- `drain(notice)`: READY/RECOVERED -> DRAINING: every gateway closes admission and triages the
  node's in-flight requests against the drain budget; the routing store keeps admission closed;
- `wait_drained`: -> TERMINATING once nothing is in flight on the node or the budget is spent;
- `recover`: -> RECOVERED once the replacement passes the readiness gate; admission opens again.

`on_notice` is called when a drain starts, before the gateways are asked: it must return at once
(the agent's `ClusterActions` starts threads there: node taint, pods not ready, the replacement
request), so nothing it does delays the drain. `on_recovered` is called after RECOVERED.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from redline.platform.routing import RoutingError, RoutingStore
from redline.platform.spot.admin import GatewayAdmin
from redline.platform.spot.drain import build_drain_budget
from redline.platform.spot.errors import SpotAgentError
from redline.platform.spot.readiness import ReadinessCheck, ReadinessGate
from redline.platform.spot.state import Clock, NodeRecord, NodeState, Notice, build_transition
from redline.platform.spot.store import SpotStateStore
from redline.slo.spec import Spot

log = logging.getLogger(__name__)


@dataclass
class SpotDrainFlow:
    """Notice -> DRAINING -> TERMINATING -> RECOVERED for one node, step by step."""

    node: str
    spot: Spot
    store: SpotStateStore
    routing: RoutingStore
    gateways: GatewayAdmin
    gate: ReadinessGate
    upstream_url: str | None
    clock: Clock = time.time
    poll_seconds: float = 0.1
    on_draining: Callable[[NodeRecord], None] | None = None
    on_notice: Callable[[Notice], None] | None = None  # must not block (see the module doc)
    on_recovered: Callable[[NodeRecord], None] | None = None
    tick: Callable[[], None] | None = None  # called on every poll (a playbook's lease check)
    last_reports: list[dict[str, Any]] = field(default_factory=list, init=False)
    last_check: ReadinessCheck | None = field(default=None, init=False)
    last_checks: int = field(default=0, init=False)
    """Readiness checks the last `recover` made (0: it found the node not TERMINATING)."""
    last_waits: int = field(default=0, init=False)
    """Of those, the failed checks that the preempted instance did not answer: nothing listening
    yet, or a replacement not ready (still loading). 0 when the gate waited only for the failed
    instance to go and the first replacement it reached was ready: a warm one."""
    _preempted: str = field(default="", init=False)

    def record(self) -> NodeRecord:
        """The node's current record."""
        return self.store.get(self.node)

    def _observe(self, check: ReadinessCheck) -> None:
        self.last_check = check
        self.last_checks += 1
        if not check.ready and not (self._preempted and check.instance == self._preempted):
            self.last_waits += 1
        if self.tick is not None:
            self.tick()

    def drain(self, notice: Notice) -> NodeRecord:
        """Close admission, drain every gateway, DRAINING. Idempotent: a node already draining
        or terminating is left as it is."""
        record = self.record()
        if record.state in (NodeState.DRAINING, NodeState.TERMINATING):
            return record
        if self.on_notice is not None:
            self.on_notice(notice)
        budget = build_drain_budget(self.spot, notice)
        self.last_check = None
        terminate = notice.terminate_at
        reason = f"spot {notice.provider} notice ({notice.action})" + (
            f", terminating at {terminate:.3f}" if terminate is not None else ""
        )
        close_for = max(budget.notice_seconds, 1.0) + self.spot.readiness_timeout_seconds
        # The gateways first: they stop admitting and triage at once; the routing store then
        # keeps admission closed for every other reader (and across restarts).
        failure: Exception | None = None
        try:
            self.last_reports = self.gateways.drain(
                self.node, budget.seconds, self.spot.continue_factor, close_for, reason
            )
        except (httpx.HTTPError, SpotAgentError) as exc:
            failure = exc
        try:
            self.routing.close_admission(self.node, reason)
        except RoutingError as exc:
            raise SpotAgentError(f"routing store: {exc}") from None
        if failure is not None:
            raise SpotAgentError(f"gateway drain: {failure}") from failure
        now = self.clock()
        record = build_transition(
            record,
            NodeState.DRAINING,
            now,
            provider=notice.provider,
            notice_at=notice.noticed_at,
            detected_at=notice.detected_at,
            terminate_at=terminate,
            budget_seconds=budget.seconds,
            detail=reason,
        )
        self.store.put(record)
        if self.on_draining is not None:
            self.on_draining(record)
        if self.upstream_url is not None:
            # Still the preempted instance while it drains: its replacement must differ.
            instance = self.gate.instance(self.upstream_url)
            if instance:
                record = replace(record, preempted_instance=instance)
                self.store.put(record)
        return record

    def wait_drained(self, stop: threading.Event | None = None) -> NodeRecord:
        """DRAINING -> TERMINATING once nothing is in flight on the node or its budget is spent."""
        record = self.record()
        if record.state is not NodeState.DRAINING:
            return record
        assert record.draining_at is not None
        deadline = record.draining_at + (record.budget_seconds or 0.0)
        while self.clock() < deadline:
            if self.tick is not None:
                self.tick()
            try:
                if self.gateways.inflight(self.node) == 0:
                    break
            except (httpx.HTTPError, SpotAgentError) as exc:
                log.warning("in-flight count of %s: %s", self.node, exc)
            if stop is not None and stop.wait(self.poll_seconds):
                break
            if stop is None:
                time.sleep(self.poll_seconds)
        record = build_transition(self.record(), NodeState.TERMINATING, self.clock())
        self.store.put(record)
        return record

    def recover(self, timeout: float, stop: threading.Event | None = None) -> NodeRecord:
        """TERMINATING -> RECOVERED when the replacement passes the readiness gate within
        `timeout`; admission opens again. Still TERMINATING (admission closed) otherwise."""
        self.last_checks = self.last_waits = 0
        record = self.record()
        if record.state is not NodeState.TERMINATING:
            return record
        self._preempted = record.preempted_instance
        if self.upstream_url is None:
            raise SpotAgentError(f"node {self.node}: no upstream URL to check a replacement at")
        check = self.gate.wait(
            self.upstream_url,
            timeout,
            max(self.poll_seconds, 0.05),
            record.preempted_instance or None,
            stop,
            self._observe,
        )
        if not check.ready:
            log.warning("replacement of %s not ready: %s", self.node, check.detail)
            return self.record()
        self.routing.open_admission(self.node)
        self.gateways.release(self.node)
        record = build_transition(
            self.record(), NodeState.RECOVERED, self.clock(), detail=check.detail
        )
        self.store.put(record)
        if self.on_recovered is not None:
            self.on_recovered(record)
        return record


__all__ = ["SpotDrainFlow"]
