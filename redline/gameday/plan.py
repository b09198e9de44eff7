"""A game day's plan: which experiment, what it must cause, the budgets it is judged against and
the safety bounds it runs within.

The experiment is the Chaos Mesh object `redline generate --chaos` writes for the drill
(`redline.generate.chaos`), so a game day injects exactly what the generated files hold. A game
day refuses to start without an explicit namespace, a duration bound and at least one abort
condition: the client error ratio over the last minute passing `abort_error_ratio`, or a red
line still breached `abort_red_line_seconds` after it fired.

Budgets, from the spec:
- detect: the experiment's need (`drill_needs`: the alert's `for` and the pipeline's scrapes,
  evaluations and group_wait), measured fault -> alert firing in Prometheus;
- RTO: the need plus `REPAIR_MARGIN_SECONDS` (notification, playbook and verification),
  measured fault -> alert resolved;
- RPO: the spec's recovery point where the fault has one (`session-rpo`: the session state's,
  `staleness`: the index's eventual-consistency window), measured as the worst value of the
  series over the game day.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redline.generate.chaos import (
    CHAOS_MESH_API,
    CHAOS_MESH_DRILLS,
    DRILL_LABEL,
    MAX_DURATION_SECONDS,
    REPAIR_MARGIN_SECONDS,
    ChaosBuildError,
    ChaosOptions,
    build_chaos_mesh_experiments,
    build_plans,
    drill_needs,
)
from redline.rules.signals import aggregate
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

PLURALS = {
    "NetworkChaos": "networkchaos",
    "PodChaos": "podchaos",
    "StressChaos": "stresschaos",
    "IOChaos": "iochaos",
    "HTTPChaos": "httpchaos",
}
"""The Chaos Mesh kinds' resource names (the CRDs' `spec.names.plural`)."""

RED_LINE_ALERTS = (
    Alert.RED_LINE_LATENCY_P99,
    Alert.RED_LINE_LATENCY_SLOW_REQUESTS,
    Alert.RED_LINE_CONTEXT_KEEPALIVE,
    Alert.RED_LINE_INDEX_STALENESS,
)
ABORT_WINDOW = "1m"
"""The window of the abort condition's client error ratio."""


class GamedayError(Exception):
    """A game day cannot start (a missing safety bound, an unknown drill) or could not run."""


@dataclass(frozen=True)
class Safety:
    """The bounds a game day runs within; `check` refuses a game day without them."""

    namespace: str | None
    max_duration_seconds: float | None
    abort_error_ratio: float | None = None
    abort_red_line_seconds: float | None = None

    def check(self) -> None:
        """GamedayError naming each missing or out-of-range bound."""
        problems = []
        if not self.namespace:
            problems.append("--namespace: required (the namespace the experiment is created in)")
        duration = self.max_duration_seconds
        if duration is None:
            problems.append("--max-duration: required (the longest the game day may run)")
        elif not 0 < duration <= MAX_DURATION_SECONDS:
            problems.append(
                f"--max-duration: {duration:g} s, allowed 1 to {MAX_DURATION_SECONDS} s"
            )
        if self.abort_error_ratio is None and self.abort_red_line_seconds is None:
            problems.append(
                "an abort condition is required: --abort-error-ratio (client error ratio over "
                f"{ABORT_WINDOW}, e.g. 0.05) and/or --abort-red-line-after (seconds a red line may "
                "stay breached)"
            )
        if self.abort_error_ratio is not None and not 0 < self.abort_error_ratio < 1:
            problems.append(f"--abort-error-ratio: {self.abort_error_ratio:g}, allowed (0, 1)")
        if self.abort_red_line_seconds is not None and self.abort_red_line_seconds <= 0:
            problems.append(f"--abort-red-line-after: {self.abort_red_line_seconds:g}, must be > 0")
        if problems:
            raise GamedayError("the game day will not start:\n- " + "\n- ".join(problems))


@dataclass(frozen=True)
class GamedayPlan:
    """Everything a game day does and judges, decided before anything is applied."""

    drill: str
    experiment: dict[str, Any]
    expects: str | None
    """The alert the fault must fire; None when none may fire (a negative drill)."""
    differs: str
    detect_budget_seconds: float
    rto_budget_seconds: float
    rpo_budget_seconds: float | None
    rpo_query: str | None
    duration_seconds: float
    safety: Safety
    error_ratio_query: str
    failed_requests_query: str
    """PromQL with `$window`: failed requests over the game day."""

    @property
    def kind(self) -> str:
        """The experiment's Chaos Mesh kind."""
        return str(self.experiment["kind"])

    @property
    def name(self) -> str:
        """The experiment object's name."""
        return str(self.experiment["metadata"]["name"])

    @property
    def namespace(self) -> str:
        """The experiment object's namespace."""
        return str(self.experiment["metadata"]["namespace"])

    @property
    def path(self) -> str:
        """The experiment's collection on the Kubernetes API."""
        group, version = CHAOS_MESH_API.split("/")
        return f"/apis/{group}/{version}/namespaces/{self.namespace}/{PLURALS[self.kind]}"


def _rpo(spec: Spec, drill: str) -> tuple[float | None, str | None]:
    if drill == "session-rpo":
        return spec.rpo.session_state.max_seconds, f"max({catalog.SESSION_CDC_RPO_SECONDS})"
    if drill == "staleness":
        index = spec.red_lines.index_consistency
        return index.max_staleness_seconds, f"max({catalog.VECTORDB_INDEX_STALENESS_SECONDS})"
    return None, None


def build_gameday_plan(
    spec: Spec, drill: str, options: ChaosOptions, safety: Safety
) -> GamedayPlan:
    """The plan of one game day; GamedayError for an unknown drill, a missing safety bound or
    options the experiments cannot be built from."""
    safety.check()
    if drill not in CHAOS_MESH_DRILLS:
        raise GamedayError(
            f"no Chaos Mesh experiment for {drill!r}; game days: {', '.join(CHAOS_MESH_DRILLS)}"
        )
    try:
        experiments = build_chaos_mesh_experiments(spec, options)
        plans = {plan.drill: plan for plan in build_plans(spec, options)}
    except ChaosBuildError as exc:
        raise GamedayError(str(exc)) from None
    experiment = experiments[f"{drill}.yaml"]
    assert experiment["metadata"]["labels"][DRILL_LABEL] == drill
    need = drill_needs(spec)[drill].seconds
    duration = parse_duration(experiment["spec"]["duration"])
    assert safety.max_duration_seconds is not None  # checked
    if safety.max_duration_seconds < need:
        raise GamedayError(
            f"--max-duration: {safety.max_duration_seconds:g} s is shorter than {drill}'s "
            f"{need:g} s (its alert cannot fire sooner)"
        )
    duration = min(duration, safety.max_duration_seconds)
    experiment = {**experiment, "spec": {**experiment["spec"], "duration": f"{int(duration)}s"}}
    plan = plans[drill]
    expects = str(plan.expects) if isinstance(plan.expects, Alert) else None
    rpo_budget, rpo_query = _rpo(spec, drill)
    errors = aggregate(spec, "errors", ABORT_WINDOW)
    requests = aggregate(spec, "requests", ABORT_WINDOW)
    return GamedayPlan(
        drill=drill,
        experiment=experiment,
        expects=expects,
        differs=plan.differs,
        detect_budget_seconds=need,
        rto_budget_seconds=need + REPAIR_MARGIN_SECONDS,
        rpo_budget_seconds=rpo_budget,
        rpo_query=rpo_query,
        duration_seconds=duration,
        safety=safety,
        error_ratio_query=f"({errors} or vector(0)) / {requests}",
        failed_requests_query=aggregate(spec, "errors", "$window", fn="increase"),
    )


def render_plan(plan: GamedayPlan) -> str:
    """What a dry run prints: the experiment, the expectation, the budgets and the bounds."""
    s = plan.safety
    lines = [
        f"game day {plan.drill}: {plan.kind} {plan.namespace}/{plan.name} for "
        f"{plan.duration_seconds:g} s",
        f"  expects:  {plan.expects or 'no red-line alert'}",
        f"  budgets:  detect <= {plan.detect_budget_seconds:g} s, RTO <= "
        f"{plan.rto_budget_seconds:g} s"
        + (
            f", RPO <= {plan.rpo_budget_seconds:g} s" if plan.rpo_budget_seconds is not None else ""
        ),
        f"  bounds:   at most {s.max_duration_seconds:g} s; abort when "
        + " or ".join(
            part
            for part in (
                f"the client error ratio over {ABORT_WINDOW} > {s.abort_error_ratio:g}"
                if s.abort_error_ratio is not None
                else "",
                f"a red line stays breached {s.abort_red_line_seconds:g} s"
                if s.abort_red_line_seconds is not None
                else "",
            )
            if part
        ),
        f"  differs from the local drill: {plan.differs}",
        f"  POST {plan.path}",
    ]
    return "\n".join(lines)
