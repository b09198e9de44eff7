"""The spot drills, each on a started fleet; each reports client-visible non-recoverable failures
(target 0), wasted decode tokens, notice -> DRAINING and replacement latency:

- `spot-one`: one node preempted under load;
- `spot-two`: both spot nodes at once, capacity below demand: traffic spills to `ondemand`;
- `spot-long-streams`: notice during long streams on the GCP node (a 1.5 s window): triage
  continues what fits and aborts the rest, whose retries resume after the served prefix;
- `spot-never-ready`: the replacement never passes the readiness gate (inference fails): the
  node stays TERMINATING with admission closed, `SpotReplacementSlow` fires; then a healthy
  replacement recovers it and the alert resolves.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from redline.devstack.drills.spot.clients import LoadMix, SpotLoad
from redline.devstack.drills.spot.fleet import Say, SpotDrillError, SpotFleet
from redline.devstack.processes import ServiceError
from redline.platform.prometheus import PrometheusError
from redline.slo import catalog
from redline.slo.alerts import Alert

WASTED_TOKENS = catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL
SPOT_DRILL_ORDER = ("spot-one", "spot-two", "spot-long-streams", "spot-never-ready")
DRILL_FAILURES = (SpotDrillError, ServiceError, PrometheusError, httpx.HTTPError, redis.RedisError)
"""What makes a spot drill's report an error rather than a crash of the whole run."""


@dataclass
class SpotDrillReport:
    """What a spot drill measured."""

    drill: str
    nodes: list[str]
    time_scale: float
    notice_windows: dict[str, float]
    drain_budgets: dict[str, float]
    failures: list[str] = field(default_factory=list)
    wasted_decode_tokens: float = 0.0
    notice_to_draining: dict[str, float | None] = field(default_factory=dict)
    replacement_latency: dict[str, float | None] = field(default_factory=dict)
    triage: dict[str, dict[str, int]] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    alert_firing_after: float | None = None
    alert_resolved_after: float | None = None
    fault_at: float | None = None
    error: str | None = None

    @property
    def non_recoverable_failures(self) -> int:
        """Client-visible failures the retry contract could not absorb (target 0)."""
        return len(self.failures)

    @property
    def ok(self) -> bool:
        """Every check held, nothing failed for a client, no error."""
        return self.error is None and not self.failures and all(ok for _, ok, _ in self.checks)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Record a check."""
        self.checks.append((name, ok, detail))
        return ok

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "drill": self.drill,
            "ok": self.ok,
            "nodes": self.nodes,
            "time_scale": self.time_scale,
            "notice_windows": self.notice_windows,
            "drain_budgets": self.drain_budgets,
            "non_recoverable_failures": self.non_recoverable_failures,
            "failures": self.failures[:20],
            "wasted_decode_tokens": self.wasted_decode_tokens,
            "notice_to_draining_seconds": self.notice_to_draining,
            "replacement_ready_latency_seconds": self.replacement_latency,
            "triage": self.triage,
            "load": self.load,
            "served": self.served,
            "alert_firing_after": self.alert_firing_after,
            "alert_resolved_after": self.alert_resolved_after,
            "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in self.checks],
            "error": self.error,
        }


def _new_report(fleet: SpotFleet, drill: str, nodes: list[str]) -> SpotDrillReport:
    providers = {fleet.nodes[n] for n in nodes}
    return SpotDrillReport(
        drill=drill,
        nodes=nodes,
        time_scale=fleet.config.time_scale,
        notice_windows={p: fleet.spot.notice_for(p) for p in sorted(providers)},
        drain_budgets={p: round(fleet.spot.drain_budget(p), 3) for p in sorted(providers)},
    )


def _finish(
    fleet: SpotFleet, report: SpotDrillReport, load: SpotLoad, wasted_before: float
) -> None:
    report.failures = load.failures()
    report.load = load.summary()
    report.wasted_decode_tokens = fleet.gateway_total(WASTED_TOKENS.name) - wasted_before
    for node in report.nodes:
        state = fleet.agent_state(node)
        report.notice_to_draining[node] = _rounded(state["notice_to_draining"])
        report.replacement_latency[node] = _rounded(state["replacement_latency"])
        decisions = [d for r in state["drain_reports"] for d in r.get("decisions", [])]
        report.triage[node] = dict(Counter(str(d["action"]) for d in decisions))
    report.check(
        "no client-visible non-recoverable failure",
        not report.failures,
        f"{report.load.get('requests', 0)} requests, {len(report.failures)} failed"
        + (f": {report.failures[0]}" if report.failures else ""),
    )
    for node in report.nodes:
        waited = report.notice_to_draining.get(node)
        # Only the detection delay scales with the drill's time; the drain itself (Redis, the
        # gateways' triage) takes real time, so the spec's own target is the fair bar.
        target = fleet.config.spec.spot.notice_to_draining_p95_seconds
        report.check(
            f"{node}: notice -> DRAINING within the spec's p95 target",
            waited is not None and waited <= target,
            f"{waited} s (target {target:g} s; detection delay scaled to "
            f"{fleet.spot.detection_delay_seconds:.3g} s)",
        )


def _rounded(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _preempt_and_recover(
    fleet: SpotFleet, report: SpotDrillReport, say: Say, nodes: list[str]
) -> None:
    preemptions = [fleet.preempt(node) for node in nodes]
    report.fault_at = min(p.issued_at for p in preemptions)
    for p in preemptions:
        say(f"{p.node} ({p.provider}): notice, termination in {p.terminate_at - time.time():.2f} s")
    for p in preemptions:
        fleet.wait_for(
            f"{p.node} DRAINING", functools.partial(fleet.drained_since, p.node, p), 10.0
        )
        say(f"{p.node}: draining")
    window = max(fleet.spot.notice_for(p.provider) for p in preemptions)
    timeout = window + fleet.spot.readiness_timeout_seconds + 10
    for p in preemptions:
        fleet.wait_for(
            f"{p.node} RECOVERED", functools.partial(fleet.recovered_since, p.node, p), timeout
        )
        say(f"{p.node}: recovered")
    for node in nodes:
        report.check(
            f"{node}: admission open again after recovery",
            fleet.admission_open(node),
            "routing store admission",
        )


def drill_spot_one(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """One spot node (AWS) preempted under load: its traffic moves to the other spot node."""
    node = next(n for n, p in fleet.nodes.items() if p == "aws")
    report = _new_report(fleet, "spot-one", [node])
    fleet.wait_ready()
    wasted = fleet.gateway_total(WASTED_TOKENS.name)
    with SpotLoad(fleet.gateway_url, 6, LoadMix((30, 250), 0.2)) as load:
        time.sleep(1.5)
        _preempt_and_recover(fleet, report, say, [node])
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    return report


def drill_spot_two(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """Both spot nodes preempted at once: capacity falls under demand, traffic spills to the
    on-demand pool."""
    nodes = list(fleet.nodes)
    report = _new_report(fleet, "spot-two", nodes)
    fleet.wait_ready()
    wasted = fleet.gateway_total(WASTED_TOKENS.name)
    with SpotLoad(fleet.gateway_url, 6, LoadMix((30, 150), 0.2)) as load:
        time.sleep(1.5)
        before = load.served_between(0, time.time())
        _preempt_and_recover(fleet, report, say, nodes)
        during = load.served_between(report.fault_at or 0.0, time.time())
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    report.served = dict(during)
    spill = fleet.config.ondemand
    report.check(
        "the on-demand pool served nothing before the preemption",
        before.get(spill, 0) == 0,
        f"served before: {dict(before)}",
    )
    report.check(
        "traffic spilled to the on-demand pool while both spot nodes drained",
        during.get(spill, 0) > 0,
        f"served after the notice: {dict(during)}",
    )
    return report


def drill_spot_long_streams(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """A notice during long streams on the GCP node: triage continues what fits the 1.5 s
    (scaled) window and aborts the rest; every aborted stream resumes after its prefix."""
    node = next(n for n, p in fleet.nodes.items() if p == "gcp")
    report = _new_report(fleet, "spot-long-streams", [node])
    fleet.wait_ready()
    wasted = fleet.gateway_total(WASTED_TOKENS.name)
    with SpotLoad(fleet.gateway_url, 6, LoadMix((200, 160, 240), 0.0)) as load:
        time.sleep(2.0)
        # Short streams in flight on the node when the notice lands: 24 tokens always fit.
        served = load.burst(6, 24)
        fleet.wait_for(f"a short stream on {node}", lambda: node in served, 10.0)
        _preempt_and_recover(fleet, report, say, [node])
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    triage = report.triage.get(node, {})
    report.check(
        "triage aborted the streams that could not finish in the budget",
        triage.get("abort", 0) > 0,
        f"decisions: {triage}",
    )
    report.check(
        "triage let the streams that fit the budget finish on the node",
        triage.get("continue", 0) > 0,
        f"decisions: {triage}",
    )
    report.check(
        "aborted streams resumed after their served prefix (no regeneration)",
        report.load.get("resumed", 0) > 0 and report.load.get("regenerated", 0) == 0,
        f"resumed {report.load.get('resumed')}, regenerated {report.load.get('regenerated')}",
    )
    return report


def drill_spot_never_ready(fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """The replacement never passes the readiness gate: admission stays closed, the node stays
    TERMINATING and SpotReplacementSlow fires; a healthy replacement then recovers it."""
    node = next(n for n, p in fleet.nodes.items() if p == "gcp")
    report = _new_report(fleet, "spot-never-ready", [node])
    fleet.wait_ready()
    wasted = fleet.gateway_total(WASTED_TOKENS.name)
    with SpotLoad(fleet.gateway_url, 4, LoadMix((30, 120), 0.2)) as load:
        time.sleep(1.0)
        preemption = fleet.preempt(node, broken_replacement=True)
        report.fault_at = preemption.issued_at
        fleet.wait_for(
            f"{node} TERMINATING",
            lambda: (
                fleet.drained_since(node, preemption) and fleet.node_state(node) == "terminating"
            ),
            15,
        )
        terminated = time.time()
        say(f"{node}: terminating; its replacement fails every inference")
        firing = fleet.wait_for(
            f"{Alert.SPOT_REPLACEMENT_SLOW} to fire",
            lambda: any(a["state"] == "firing" for a in fleet.alerts(Alert.SPOT_REPLACEMENT_SLOW,
                                                                      node=node)),
            30,
        )  # fmt: skip
        report.alert_firing_after = round(firing - preemption.issued_at, 3)
        say(f"{Alert.SPOT_REPLACEMENT_SLOW} firing after {report.alert_firing_after} s")
        state = fleet.agent_state(node)
        report.check(
            "the node stays TERMINATING while its replacement is not ready",
            state["state"] == "terminating",
            f"state {state['state']}, readiness: {state.get('readiness')}",
        )
        report.check(
            "admission stays closed while the replacement is not ready",
            not fleet.admission_open(node),
            "routing store admission",
        )
        report.check(
            "no request was answered by the broken replacement",
            load.served_between(terminated, time.time()).get(node, 0) == 0,
            f"served since termination: {dict(load.served_between(terminated, time.time()))}",
        )
        fleet.replace(node)
        say(f"{node}: healthy replacement started")
        fleet.wait_for(f"{node} RECOVERED", lambda: fleet.recovered_since(node, preemption), 30)
        resolved = fleet.wait_for(
            f"{Alert.SPOT_REPLACEMENT_SLOW} to resolve",
            lambda: not fleet.alerts(Alert.SPOT_REPLACEMENT_SLOW, node=node),
            30,
        )
        report.alert_resolved_after = round(resolved - preemption.issued_at, 3)
        time.sleep(0.5)
    _finish(fleet, report, load, wasted)
    window = fleet.spot.notice_for("gcp")
    latency = report.replacement_latency.get(node)
    report.check(
        "the replacement latency shows the wait beyond the notice window",
        latency is not None and latency > window,
        f"{latency} s (window {window:g} s)",
    )
    return report


SCENARIOS: dict[str, Callable[[SpotFleet, Say], SpotDrillReport]] = {
    "spot-one": drill_spot_one,
    "spot-two": drill_spot_two,
    "spot-long-streams": drill_spot_long_streams,
    "spot-never-ready": drill_spot_never_ready,
}
"""The spot drills by name; each runs on a started fleet."""


def run_spot_drill(name: str, fleet: SpotFleet, say: Say) -> SpotDrillReport:
    """Run one scenario; a step that does not happen in time is the report's error."""
    try:
        return SCENARIOS[name](fleet, say)
    except DRILL_FAILURES as exc:
        report = SpotDrillReport(name, [], fleet.config.time_scale, {}, {})
        report.error = f"{type(exc).__name__}: {exc}"
        return report


__all__ = ["SCENARIOS", "SPOT_DRILL_ORDER", "SpotDrillReport", "run_spot_drill"]
