"""A game day's result as the design notes' fault-injection table (§5): fault | RTO | RPO |
failed requests | verdict against the budget, with the loop's steps behind it; Markdown and
JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redline.gameday.observe import Timeline
from redline.gameday.plan import GamedayPlan


@dataclass
class GamedayResult:
    """What a game day measured and its verdict."""

    plan: GamedayPlan
    timeline: Timeline
    ended_at: float
    aborted: str | None = None
    error: str | None = None
    rpo_seconds: float | None = None
    failed_requests: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def rto_seconds(self) -> float | None:
        """Fault -> the expected alert resolved."""
        return self.timeline.since_fault(self.timeline.recovered_at)

    @property
    def detect_seconds(self) -> float | None:
        """Fault -> the expected alert firing."""
        return self.timeline.since_fault(self.timeline.firing_at)

    @property
    def ok(self) -> bool:
        """Within every budget, not aborted, no error."""
        return not self.problems and self.aborted is None and self.error is None


def judge(result: GamedayResult) -> list[str]:
    """Every budget the result missed (empty: within all of them)."""
    plan, timeline = result.plan, result.timeline
    problems = []
    if plan.expects is None:
        problems += [f"{alert} fired (none may)" for alert in sorted(timeline.red_lines)]
    else:
        detect, rto = result.detect_seconds, result.rto_seconds
        if detect is None:
            problems.append(f"{plan.expects} never fired")
        elif detect > plan.detect_budget_seconds:
            problems.append(f"detected after {detect:g} s > {plan.detect_budget_seconds:g} s")
        if detect is not None and rto is None:
            problems.append(f"{plan.expects} never resolved")
        elif rto is not None and rto > plan.rto_budget_seconds:
            problems.append(f"RTO {rto:g} s > {plan.rto_budget_seconds:g} s")
    if plan.rpo_budget_seconds is not None and result.rpo_seconds is not None:
        if result.rpo_seconds > plan.rpo_budget_seconds:
            problems.append(f"RPO {result.rpo_seconds:g} s > {plan.rpo_budget_seconds:g} s")
    return problems


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


def verdict(result: GamedayResult) -> str:
    """`pass`, `FAIL: ...`, `ABORTED: ...` or `ERROR: ...`."""
    if result.error is not None:
        return f"ERROR: {result.error}"
    if result.aborted is not None:
        return f"ABORTED: {result.aborted}"
    return "pass" if result.ok else "FAIL: " + "; ".join(result.problems)


def render_markdown(results: Sequence[GamedayResult]) -> str:
    """The §5 table, then each game day's loop."""
    lines = [
        "| fault | RTO | RPO | failed requests | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        rto = _seconds(r.rto_seconds) if r.plan.expects else "–"
        failed = "–" if r.failed_requests is None else f"{r.failed_requests:.0f}"
        lines.append(
            f"| {r.plan.drill} ({r.plan.kind}) | {rto} | {_seconds(r.rpo_seconds)} | {failed} | "
            f"{verdict(r)} |"
        )
    for r in results:
        t = r.timeline
        lines += [
            "",
            f"**{r.plan.drill}**: expects {r.plan.expects or 'no red-line alert'}; budgets "
            f"detect {r.plan.detect_budget_seconds:g} s, RTO {r.plan.rto_budget_seconds:g} s",
            "",
            "| step | since the fault |",
            "|---|---|",
            f"| detect (firing in Prometheus) | {_seconds(t.since_fault(t.firing_at))} |",
            f"| in Alertmanager | {_seconds(t.since_fault(t.alertmanager_at))} |",
            f"| notify (receiver's job) | {_seconds(t.since_fault(t.notified_at))} |",
            f"| playbook start | {_seconds(t.since_fault(t.playbook_started_at))} |",
            f"| remediate (verify passed) | {_seconds(t.since_fault(t.remediated_at))} |",
            f"| recover (alert resolved) | {_seconds(t.since_fault(t.recovered_at))} |",
        ]
    return "\n".join(lines) + "\n"


def result_as_dict(result: GamedayResult) -> dict[str, Any]:
    """Plain data for JSON."""
    t = result.timeline
    return {
        "drill": result.plan.drill,
        "experiment": {
            "kind": result.plan.kind,
            "namespace": result.plan.namespace,
            "name": result.plan.name,
        },  # fmt: skip
        "expects": result.plan.expects,
        "fault_at": t.fault_at,
        "ended_at": result.ended_at,
        "detect_seconds": t.since_fault(t.firing_at),
        "alertmanager_seconds": t.since_fault(t.alertmanager_at),
        "notify_seconds": t.since_fault(t.notified_at),
        "playbook_start_seconds": t.since_fault(t.playbook_started_at),
        "remediate_seconds": t.since_fault(t.remediated_at),
        "rto_seconds": result.rto_seconds,
        "rpo_seconds": result.rpo_seconds,
        "failed_requests": result.failed_requests,
        "red_lines_fired": {k: t.since_fault(v) for k, v in sorted(t.red_lines.items())},
        "worst_error_ratio": t.worst_error_ratio,
        "job_id": t.job_id,
        "budgets": {
            "detect_seconds": result.plan.detect_budget_seconds,
            "rto_seconds": result.plan.rto_budget_seconds,
            "rpo_seconds": result.plan.rpo_budget_seconds,
        },  # fmt: skip
        "aborted": result.aborted,
        "error": result.error,
        "problems": result.problems,
        "verdict": verdict(result),
    }


def render_json(results: Sequence[GamedayResult]) -> str:
    """Every result as JSON."""
    return json.dumps([result_as_dict(r) for r in results], indent=2, sort_keys=True) + "\n"
