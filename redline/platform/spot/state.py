"""The state machine of a spot node: READY (or RECOVERED) -> DRAINING -> TERMINATING ->
RECOVERED, the node's record of its last preemption, and the notice that starts one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Literal

from redline.platform.spot.errors import SpotError, SpotStateError

PROVIDERS = ("aws", "gcp", "manual")
Clock = Callable[[], float]
"""Unix seconds now (`time.time`, or a test's clock)."""


class NodeState(StrEnum):
    """The states of a spot node; exported as `llm_node_state{node,state}` (lowercase)."""

    READY = "ready"
    DRAINING = "draining"
    TERMINATING = "terminating"
    RECOVERED = "recovered"


TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    NodeState.READY: frozenset({NodeState.DRAINING}),
    NodeState.RECOVERED: frozenset({NodeState.DRAINING}),
    NodeState.DRAINING: frozenset({NodeState.TERMINATING}),
    NodeState.TERMINATING: frozenset({NodeState.RECOVERED}),
}
"""Allowed transitions. A recovered node is a serving node again: the next notice drains it."""


@dataclass(frozen=True)
class Notice:
    """One interruption notice as a source saw it (unix times).

    `noticed_at` is when the cloud issued the notice as far as it can be told (AWS: termination
    time - the 120 s window; GCP long-poll and manual: when it answered); `detected_at` is when
    the agent saw it; `terminate_at` is when the node goes away.
    """

    node: str
    provider: str
    kind: Literal["interruption", "rebalance"]
    action: str
    noticed_at: float
    detected_at: float
    terminate_at: float | None
    detail: str = ""

    @property
    def detection_delay(self) -> float:
        """Seconds between the notice and the agent seeing it."""
        return max(0.0, self.detected_at - self.noticed_at)


@dataclass(frozen=True)
class NodeRecord:
    """A node's state and the times of its last preemption (unix seconds; None: not yet)."""

    node: str
    state: NodeState = NodeState.READY
    provider: str = ""
    changed_at: float = 0.0
    notice_at: float | None = None
    detected_at: float | None = None
    terminate_at: float | None = None
    draining_at: float | None = None
    terminating_at: float | None = None
    recovered_at: float | None = None
    budget_seconds: float | None = None
    preempted_instance: str = ""
    detail: str = ""

    @property
    def notice_to_draining(self) -> float | None:
        """Seconds from the notice to DRAINING."""
        if self.notice_at is None or self.draining_at is None:
            return None
        return max(0.0, self.draining_at - self.notice_at)

    @property
    def gone_at(self) -> float | None:
        """When the node was gone: TERMINATING, or its termination time if that came later (a
        drained node still runs until then, and its replacement cannot take its place before)."""
        if self.terminating_at is None:
            return None
        return max(self.terminating_at, self.terminate_at or self.terminating_at)

    def replacement_latency(self, now: float) -> float | None:
        """Seconds from the node being gone to RECOVERED, or waited so far while TERMINATING."""
        gone = self.gone_at
        if gone is None:
            return None
        if self.state is NodeState.RECOVERED and self.recovered_at is not None:
            return max(0.0, self.recovered_at - gone)
        if self.state is NodeState.TERMINATING:
            return max(0.0, now - gone)
        return None

    def to_fields(self) -> dict[str, str]:
        """A flat string mapping (a Redis hash); None fields are left out."""
        out: dict[str, str] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                out[item.name] = str(value.value if isinstance(value, NodeState) else value)
        return out

    @classmethod
    def from_fields(cls, node: str, raw: Mapping[str, str]) -> NodeRecord:
        """Decode `to_fields` output; SpotError naming the bad field."""
        values: dict[str, Any] = {"node": node}
        try:
            for item in fields(cls):
                if item.name == "node" or item.name not in raw:
                    continue
                text = raw[item.name]
                if item.name == "state":
                    values["state"] = NodeState(text)
                elif item.name in ("provider", "detail", "preempted_instance"):
                    values[item.name] = text
                else:
                    values[item.name] = float(text)
        except ValueError as exc:
            raise SpotError(f"node {node}: unreadable state record: {exc}") from None
        return cls(**values)


def build_transition(
    record: NodeRecord, state: NodeState, now: float, **changes: Any
) -> NodeRecord:
    """`record` moved to `state` at `now` (the state's timestamp set); SpotStateError if the
    state machine does not allow it."""
    if state not in TRANSITIONS[record.state]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[record.state]))
        raise SpotStateError(
            f"node {record.node}: {record.state.value} -> {state.value} is not allowed "
            f"(from {record.state.value}: {allowed})"
        )
    stamp = {
        NodeState.DRAINING: "draining_at",
        NodeState.TERMINATING: "terminating_at",
        NodeState.RECOVERED: "recovered_at",
    }[state]
    if state is NodeState.DRAINING:
        # A new preemption: the previous one's later timestamps no longer apply.
        changes = {"terminating_at": None, "recovered_at": None, **changes}
    return replace(record, state=state, changed_at=now, **{stamp: now, **changes})


__all__ = [
    "PROVIDERS",
    "TRANSITIONS",
    "Clock",
    "NodeRecord",
    "NodeState",
    "Notice",
    "build_transition",
]
