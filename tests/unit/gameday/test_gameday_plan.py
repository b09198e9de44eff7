"""The game day's pure parts: the plan and its safety bounds, the timeline folded from
observations, the abort conditions, the verdict and the §5 table."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import pytest

from redline.gameday.observe import Observation, Timeline, abort_reason, advance
from redline.gameday.plan import GamedayError, Safety, build_gameday_plan, render_plan
from redline.gameday.report import GamedayResult, judge, render_json, render_markdown, verdict
from redline.gameday.run import watch_seconds
from redline.generate.chaos import ChaosOptions, drill_needs
from redline.generate.kubernetes import KubernetesOptions
from redline.slo.alerts import Alert
from redline.slo.load import load_spec
from redline.slo.spec import Spec

SAFE = Safety("redline", 600, abort_error_ratio=0.05)


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec().spec


def _options() -> ChaosOptions:
    return ChaosOptions(kubernetes=KubernetesOptions(namespace="redline"))


@pytest.mark.parametrize(
    ("safety", "problems"),
    [
        (Safety(None, None), ["--namespace: required", "--max-duration: required", "abort"]),
        (Safety("ns", 0, 0.1), ["--max-duration: 0 s, allowed 1 to 3600 s"]),
        (Safety("ns", 7200, 0.1), ["--max-duration: 7200 s"]),
        (Safety("ns", 60, 1.5), ["--abort-error-ratio: 1.5, allowed (0, 1)"]),
        (Safety("ns", 60, None, -1), ["--abort-red-line-after: -1, must be > 0"]),
    ],
)
def test_a_game_day_without_its_bounds_will_not_start(
    spec: Spec, safety: Safety, problems: list[str]
) -> None:
    with pytest.raises(GamedayError) as caught:
        build_gameday_plan(spec, "latency", _options(), safety)
    for problem in problems:
        assert problem in str(caught.value)


def test_the_plan_holds_the_generated_experiment_bounded_by_max_duration(spec: Spec) -> None:
    plan = build_gameday_plan(spec, "latency", _options(), SAFE)
    assert plan.kind == "NetworkChaos" and plan.namespace == "redline"
    assert plan.path == "/apis/chaos-mesh.org/v1alpha1/namespaces/redline/networkchaos"
    assert plan.expects == Alert.RED_LINE_LATENCY_P99
    need = drill_needs(spec)["latency"].seconds
    assert plan.detect_budget_seconds == need
    assert plan.rto_budget_seconds == need + 300
    short = build_gameday_plan(spec, "latency", _options(), Safety("redline", need + 1, 0.05))
    assert short.experiment["spec"]["duration"] == f"{int(need + 1)}s"
    assert short.duration_seconds == need + 1
    assert watch_seconds(short) == need + 300
    text = render_plan(plan)
    assert "expects:  RedLineLatencyP99" in text and "abort when the client error ratio" in text


def test_max_duration_shorter_than_the_alert_needs_is_refused(spec: Spec) -> None:
    with pytest.raises(GamedayError, match="shorter than latency's"):
        build_gameday_plan(spec, "latency", _options(), Safety("redline", 5, 0.05))


def test_an_unknown_drill_names_the_game_days(spec: Spec) -> None:
    with pytest.raises(GamedayError, match="game days: latency, latency-persistent"):
        build_gameday_plan(spec, "spot-one", _options(), SAFE)


def test_rpo_budgets_and_negative_drills(spec: Spec) -> None:
    session = build_gameday_plan(spec, "session-rpo", _options(), SAFE)
    assert session.rpo_budget_seconds == spec.rpo.session_state.max_seconds
    assert session.rpo_query is not None
    breaker = build_gameday_plan(spec, "breaker", _options(), SAFE)
    assert breaker.expects is None and breaker.rpo_query is None


def _seen(
    at: float,
    firing: Collection[str] = (),
    *,
    active: Collection[str] | None = None,
    am: Collection[str] = (),
    jobs: tuple[Mapping[str, Any], ...] = (),
    error_ratio: float | None = None,
) -> Observation:
    """One poll's reading: `active` defaults to what is firing."""
    return Observation(
        at,
        frozenset(firing),
        frozenset(firing if active is None else active),
        frozenset(am),
        jobs,
        error_ratio,
    )


def test_the_timeline_keeps_first_sightings_and_the_job_steps(spec: Spec) -> None:
    plan = build_gameday_plan(spec, "staleness", _options(), SAFE)
    alert = str(Alert.RED_LINE_INDEX_STALENESS)
    timeline = Timeline(fault_at=1000.0)
    job = {
        "id": "j1",
        "created_at": "1970-01-01T00:16:55Z",  # 1015
        "alert": {"status": "firing", "labels": {"alertname": alert}},
        "steps": [
            {"phase": "plan", "at": 1016.0},
            {"phase": "verify", "ok": False, "at": 1020.0},
            {"phase": "verify", "ok": True, "at": 1030.0},
        ],
    }
    stale_job = {**job, "id": "old", "created_at": "1970-01-01T00:10:00Z"}
    advance(timeline, plan, _seen(1005.0, active={alert}))
    assert timeline.firing_at is None  # pending only
    advance(timeline, plan, _seen(1012.0, {alert}))
    advance(timeline, plan, _seen(1014.0, {alert}, am={alert}, jobs=(stale_job, job)))
    advance(timeline, plan, _seen(1040.0, {alert}, am={alert}, jobs=(job,)))
    advance(timeline, plan, _seen(1050.0))
    advance(timeline, plan, _seen(1060.0))
    assert (timeline.firing_at, timeline.alertmanager_at) == (1012.0, 1014.0)
    assert (timeline.notified_at, timeline.playbook_started_at) == (1015.0, 1016.0)
    assert (timeline.remediated_at, timeline.recovered_at) == (1030.0, 1050.0)
    assert timeline.job_id == "j1" and timeline.red_lines == {alert: 1012.0}


def test_abort_conditions(spec: Spec) -> None:
    safety = Safety("redline", 600, abort_error_ratio=0.1, abort_red_line_seconds=30)
    plan = build_gameday_plan(spec, "latency", _options(), safety)
    red = str(Alert.RED_LINE_LATENCY_P99)
    timeline = Timeline(fault_at=0.0)
    calm = _seen(10.0, {red}, error_ratio=0.1)
    advance(timeline, plan, calm)
    assert abort_reason(plan, timeline, calm) is None  # at the bound, not over it
    erroring = _seen(11.0, {red}, error_ratio=0.2)
    assert "client error ratio over the last minute is 0.2000" in str(
        abort_reason(plan, timeline, erroring)
    )
    breached = _seen(41.0, {red}, error_ratio=float("nan"))
    assert f"{red} has been firing for 31 s" in str(abort_reason(plan, timeline, breached))
    resolved = _seen(41.0, set(), error_ratio=0.0)
    assert abort_reason(plan, timeline, resolved) is None


def test_the_verdict_and_the_table(spec: Spec) -> None:
    plan = build_gameday_plan(spec, "session-rpo", _options(), SAFE)
    good = GamedayResult(plan, Timeline(0.0, firing_at=20.0, recovered_at=60.0), 60.0,
                         rpo_seconds=2.0, failed_requests=0.0)  # fmt: skip
    good.problems = judge(good)
    assert good.ok and verdict(good) == "pass"
    late = GamedayResult(plan, Timeline(0.0, firing_at=500.0), 900.0, rpo_seconds=9.0)
    late.problems = judge(late)
    assert late.problems == [
        f"detected after 500 s > {plan.detect_budget_seconds:g} s",
        f"{plan.expects} never resolved",
        f"RPO 9 s > {plan.rpo_budget_seconds:g} s",
    ]
    table = render_markdown([good, late])
    assert "| session-rpo (NetworkChaos) | 60.0 s | 2.0 s | 0 | pass |" in table
    assert "| session-rpo (NetworkChaos) | – | 9.0 s | – | FAIL: detected after" in table
    data = json.loads(render_json([good]))
    assert data[0]["rto_seconds"] == 60.0 and data[0]["verdict"] == "pass"
    negative = build_gameday_plan(spec, "breaker", _options(), SAFE)
    fired = GamedayResult(negative, Timeline(0.0, red_lines={"RedLineLatencyP99": 5.0}), 60.0)
    assert judge(fired) == ["RedLineLatencyP99 fired (none may)"]
