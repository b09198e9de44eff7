"""What a notice does outside the gateways, off the drain's path: the Kubernetes node actions
(taint, serving pods not ready) and the replacement request, each in its own thread started at
notice time, so the drain (admission closed, triage) never waits for the API server or a cloud
hook. Also the periodic reconcile that marks this node's serving pods ready (their readiness gate
needs it) unless the node is preempted, and the undo after a recovery on the same node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redline.platform.spot.errors import KubernetesError
from redline.platform.spot.kubernetes import NodeActions
from redline.platform.spot.replacement import ReplacementRunner, build_replacement_request
from redline.platform.spot.state import NodeRecord, Notice

log = logging.getLogger(__name__)


class ClusterActions:
    """A node's Kubernetes actions and replacement requests, run beside the drain."""

    def __init__(
        self,
        nodes: NodeActions | None = None,
        replacement: ReplacementRunner | None = None,
        ready_interval_seconds: float = 30.0,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nodes = nodes
        self.replacement = replacement
        self.ready_interval_seconds = ready_interval_seconds
        self.on_error = on_error
        self.clock = clock
        self.preempted = threading.Event()
        # One writer of the pods' condition at a time: a reconcile that read "not preempted"
        # must finish before a notice's "not ready" is written, never after it.
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.last: dict[str, Any] = {}

    @property
    def enabled(self) -> bool:
        """Whether there is anything to do at all."""
        return self.nodes is not None or self.replacement is not None

    def _fail(self, what: str, exc: Exception) -> None:
        message = f"{what}: {exc}"
        log.error("%s", message)
        self.last[f"{what}_error"] = {"at": self.clock(), "error": str(exc)}
        if self.on_error is not None:
            self.on_error(message)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def notice(self, notice: Notice) -> None:
        """Start the node actions and the replacement request; returns at once."""
        if self.nodes is not None:
            self.preempted.set()  # before the thread: a reconcile starting now must not undo it
            nodes = self.nodes
            reason = notice.detail or f"spot {notice.provider} notice ({notice.action})"

            def preempt() -> None:
                with self._lock:
                    started = self.clock()
                    try:
                        done = nodes.preempt(notice.provider, reason)
                    except KubernetesError as exc:
                        self._fail("kubernetes", exc)
                        return
                self.last["kubernetes"] = {
                    "action": "preempt", "started_at": started, "finished_at": self.clock(), **done,
                }  # fmt: skip

            self._spawn(f"spot-k8s:{notice.node}", preempt)
        if self.replacement is not None:
            runner = self.replacement
            request = build_replacement_request(
                notice, None if self.nodes is None else self.nodes.node_name
            )

            def replace() -> None:
                result = runner.run(request)
                self.last["replacement"] = result.as_dict()
                if result.outcome == "failed" and self.on_error is not None:
                    self.on_error(f"replacement: {result.detail}")

            self._spawn(f"spot-replacement:{notice.node}", replace)

    def recovered(self, record: NodeRecord) -> None:
        """After RECOVERED: untaint the node and mark its pods ready (a no-op on a new node)."""
        if self.nodes is None:
            return
        with self._lock:
            try:
                done = self.nodes.restore(f"replacement of {record.node} ready")
            except KubernetesError as exc:
                self._fail("kubernetes", exc)
                return
            self.preempted.clear()
        self.last["kubernetes"] = {"action": "restore", "finished_at": self.clock(), **done}

    def reconcile(self) -> None:
        """Mark ready the serving pods that lack the condition, unless the node is preempted."""
        if self.nodes is None:
            return
        with self._lock:
            try:
                done = self.nodes.reconcile(self.preempted.is_set())
            except KubernetesError as exc:
                self._fail("kubernetes", exc)
                return
        if done.get("preempted"):
            self.preempted.set()  # tainted by an earlier agent: keep it out until recovered
        self.last["reconcile"] = {"finished_at": self.clock(), **done}

    def start(self, stop: threading.Event) -> None:
        """Reconcile now and every `ready_interval_seconds` until `stop` (with node actions)."""
        if self.nodes is None:
            return

        def loop() -> None:
            while not stop.is_set():
                self.reconcile()
                if stop.wait(self.ready_interval_seconds):
                    return

        self._spawn("spot-k8s-reconcile", loop)

    def join(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for the running threads."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def state(self) -> dict[str, Any]:
        """JSON form of the last actions (for the agent's /state)."""
        return {
            "kubernetes": self.nodes is not None,
            "replacement": None if self.replacement is None else self.replacement.provider.via,
            "preempted": self.preempted.is_set(),
            "last": dict(self.last),
        }


__all__ = ["ClusterActions"]
