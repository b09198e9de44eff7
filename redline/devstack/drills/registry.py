"""Every drill by name, the order `all` runs them in, and the names a user may ask for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.breaker import drill_breaker
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.exporter_down import drill_exporter_down
from redline.devstack.drills.gpu.drill import drill_gpu_node_failure
from redline.devstack.drills.latency import drill_latency
from redline.devstack.drills.latency_night import drill_latency_night
from redline.devstack.drills.latency_persistent import drill_latency_persistent
from redline.devstack.drills.mutation import drill_mutation
from redline.devstack.drills.partition import drill_partition
from redline.devstack.drills.quota import drill_quota
from redline.devstack.drills.redis_failover import drill_redis_failover
from redline.devstack.drills.regression import drill_regression, drill_regression_negative
from redline.devstack.drills.saturation import drill_saturation
from redline.devstack.drills.session_rpo import drill_session_rpo
from redline.devstack.drills.spot.scenarios import SPOT_DRILL_ORDER
from redline.devstack.drills.spot.stack import SPOT_DRILLS
from redline.devstack.drills.staleness import drill_staleness

DRILL_ORDER = (
    "exporter-down",
    "session-rpo",
    "partition",
    "staleness",
    "breaker",
    "latency",
    "mutation",
    "quota",
    "regression",
    "regression-negative",
    "latency-night",
    "latency-persistent",
)
"""`all` runs the drills in this order: the rollback gate's alert outlives its rollback by the
gate's 300 s window, so the regressions come late and their recovery is awaited at the end.
`latency-persistent` (about 90 s: the primary stays slow for several restore periods) runs
after them, while that recovery is awaited in the background, so it adds little to `all`, as
does `latency-night` before it (about 90 s with the load generator paused).
`breaker` (about 30 s) runs before `latency`, so its reroutes are long out of the latency
window when that drill starts. The spot drills run a fleet of their own beside the stack and
are asked for by name. `mutation` (about 20 s) runs before the regressions, while the adapter's
good version serves every region. `quota` (about 15 s) follows: its interactive P99 check wants
no fault of another drill in the path."""

BY_NAME_ONLY = ("redis-failover", "saturation", "gpu-node-failure")
"""Drills `all` leaves out: `redis-failover` needs a Sentinel stack (`redline up --redis
sentinel`; on the default stack it does not apply) and kills its Redis primary; `saturation`
needs an engine stack (`redline up --source vllm`: the gateway sees no engine queue) and pauses
the load generator for about three minutes; `gpu-node-failure` (about 30 s) runs a rig of its
own beside the stack (its own gateway, receiver, worker, Prometheus and Alertmanager on the
stack's Redis and spec): the requests it fails on purpose are its own clients', reported as its
figures (cold against warm), never the stack's users'."""

DRILL_NAMES = (*DRILL_ORDER, *SPOT_DRILL_ORDER, *BY_NAME_ONLY)
"""Every drill a user may name (`all` aside)."""

DRILLS: dict[str, Callable[[DrillContext], DrillResult]] = {
    "latency": drill_latency,
    "latency-persistent": drill_latency_persistent,
    "latency-night": drill_latency_night,
    "staleness": drill_staleness,
    "regression": drill_regression,
    "mutation": drill_mutation,
    "quota": drill_quota,
    "regression-negative": drill_regression_negative,
    "session-rpo": drill_session_rpo,
    "partition": drill_partition,
    "exporter-down": drill_exporter_down,
    "breaker": drill_breaker,
    "redis-failover": drill_redis_failover,
    "saturation": drill_saturation,
    "gpu-node-failure": drill_gpu_node_failure,
    **SPOT_DRILLS,
}
"""The explicit registry of drills, by name."""


@dataclass(frozen=True)
class Allowance:
    """How many user requests a drill may see fail, and why."""

    failed_requests: int | None
    why: str


NO_FAILED_REQUEST = Allowance(
    0,
    "the platform promises that no user request fails: the fault is absorbed (reroute, "
    "breaker, drain, a switch loaded alongside, Redis failing over behind 503 + Retry-After "
    "to the receiver and the index writer, never to the gateway's clients) or is off the "
    "serving path",
)
ALLOWANCES: dict[str, Allowance] = dict.fromkeys(DRILLS, NO_FAILED_REQUEST)
"""Each drill's allowance of failed user requests (the board and the JSON show it)."""


def resolve_names(names: Sequence[str]) -> list[str]:
    """The drills to run (`all` expands to every drill in DRILL_ORDER); DrillError if unknown."""
    wanted: list[str] = []
    for name in names:
        if name == "all":
            wanted += [n for n in DRILL_ORDER if n not in wanted]
        elif name in DRILLS:
            if name not in wanted:
                wanted.append(name)
        else:
            raise DrillError(f"unknown drill {name!r}; choose from: all, {', '.join(DRILL_NAMES)}")
    return wanted


__all__ = ["ALLOWANCES", "Allowance", "DRILLS", "DRILL_NAMES", "DRILL_ORDER", "resolve_names"]
