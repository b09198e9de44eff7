"""The report's remediation section: what ran, what shadow mode would have done, what the guard
rails skipped, read from run events and the alerts routed to each playbook, in every format."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from redline.reporting.queries import remediation_events_query, remediation_guards_query
from redline.reporting.render.html import render_html
from redline.reporting.render.markdown import render_markdown
from redline.reporting.render.tables import render_csv_tables, render_json, render_schema
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.report import (
    AlertSamples,
    GuardState,
    RemediationCounts,
    Report,
    ReportInput,
    RunEvent,
    SloSeries,
    Window,
    build_report,
)
from redline.slo.report.remediation import describe, kind_of
from redline.slo.spec import Spec

H = 3600
M = 60
T0 = int(datetime(2025, 3, 1, tzinfo=UTC).timestamp())
WINDOW = Window(T0, T0 + 12 * H)
REGRESSION = T0 + 10 * H  # 2025-03-01 10:00
BREACH = T0 + 4 * H  # 2025-03-01 04:00


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec().spec


def _firing(start: float, minutes: int, **labels: str) -> AlertSamples:
    every = {"alertstate": "firing", **labels}
    return AlertSamples(every, [start + M * i for i in range(minutes)])


ALERTS = [
    _firing(REGRESSION, 20, alertname="SemanticRollbackTwoSignal", severity="critical",
            playbook="semantic_rollback", model="chat", model_version="v2"),
    _firing(BREACH, 30, alertname="RedLineLatencyP99", severity="critical", playbook="reroute",
            red_line="latency_p99", region="primary"),
    # An older reroute alert of another region, long over: the runs above must not take it.
    _firing(T0 + H, 5, alertname="RedLineLatencyP99", severity="critical", playbook="reroute",
            red_line="latency_p99", region="secondary"),
]  # fmt: skip

EVENTS = [
    RunEvent(REGRESSION + 2 * M, "semantic_rollback", "shadow", 1.0),
    RunEvent(BREACH + 3 * M, "reroute", "succeeded", 1.0),
    RunEvent(BREACH + 20 * M, "reroute", "over_budget", 2.0),
    RunEvent(BREACH + 21 * M, "reroute", "retry", 1.0),  # an attempt, not a run's end
    RunEvent(T0 + 6 * H, "freeze_and_replay", "paused", 1.0),  # no alert in the data
    RunEvent(T0 + 7 * H, "spot_drain", "breaker_open", 1.0),
    RunEvent(T0 + 8 * H, "custom_cleanup", "succeeded", 1.0),  # a deployment's own playbook
    RunEvent(T0 - 2 * H, "reroute", "succeeded", 1.0),  # before the period
]

GUARDS = [
    GuardState("semantic_rollback", frozenset({"shadow"}), "shadow"),
    GuardState("reroute", frozenset({"act"}), "act"),  # plainly acting: not listed
    GuardState("freeze_and_replay", frozenset({"act"}), "act", paused_during=True),
    GuardState("spot_drain", frozenset({"act"}), "act", breaker_open_during=True,
               breaker_open_at_end=True),
]  # fmt: skip

COUNTS = RemediationCounts(
    runs={
        ("semantic_rollback", "shadow"): 1.0,
        ("reroute", "succeeded"): 1.0,
        ("reroute", "over_budget"): 2.0,
        ("freeze_and_replay", "paused"): 1.0,
        ("spot_drain", "breaker_open"): 1.0,
        ("custom_cleanup", "succeeded"): 1.0,
    },
    duration_sum={"reroute": 12.0, "semantic_rollback": 3.0},
    duration_count={"reroute": 1.0, "semantic_rollback": 1.0},
    measured=True,
)


@pytest.fixture(scope="module")
def report(spec: Spec) -> Report:
    hours = {T0 + (i + 1) * H: 1000.0 for i in range(12)}
    data = ReportInput(
        window=WINDOW,
        slos={slo.name: SloSeries(hours, dict.fromkeys(hours, 0.0001)) for slo in spec.slos},
        signals={},
        alerts=ALERTS,
        remediation=COUNTS,
        remediation_events=EVENTS,
        remediation_guards=GUARDS,
    )
    return build_report(
        spec,
        data,
        spec_source="test",
        prometheus="http://p",
        generated_at=datetime(2025, 3, 1, 12, 5, tzinfo=UTC),
    )


def test_shadow_runs_say_what_they_would_have_done(report: Report) -> None:
    shadow = [a for a in report.remediation_actions if a.kind == "shadow"]
    assert [a.text for a in shadow] == [
        "shadow: would have rolled back chat v2 at 2025-03-01 10:02 UTC (semantic_rollback)"
    ]
    (action,) = shadow
    assert action.alert == "SemanticRollbackTwoSignal"
    assert action.target == {"model": "chat", "model_version": "v2"}
    assert action.at == datetime(2025, 3, 1, 10, 2, tzinfo=UTC)


def test_every_run_in_the_period_is_listed_in_order_with_its_alert(report: Report) -> None:
    texts = [a.text for a in report.remediation_actions]
    assert texts == [
        "succeeded: rerouted traffic away from primary at 2025-03-01 04:03 UTC (reroute)",
        "skipped, over budget: did not reroute traffic away from primary "
        "at 2025-03-01 04:20 UTC (reroute, 2 runs)",
        "skipped, paused: did not freeze writes to the collection and replay the delta log onto "
        "the replica at 2025-03-01 06:00 UTC (freeze_and_replay)",
        "skipped, breaker open: did not drain spot node at 2025-03-01 07:00 UTC (spot_drain)",
        "succeeded: ran custom_cleanup at 2025-03-01 08:00 UTC (custom_cleanup)",
        "shadow: would have rolled back chat v2 at 2025-03-01 10:02 UTC (semantic_rollback)",
    ]
    kinds = [(a.outcome, a.kind) for a in report.remediation_actions]
    assert ("over_budget", "skipped") in kinds and ("succeeded", "acted") in kinds
    assert all(a.outcome != "retry" for a in report.remediation_actions)
    rows = {(r.playbook, r.outcome): r for r in report.remediation}
    assert rows[("reroute", "succeeded")].mean_duration_seconds == 12.0
    assert rows[("reroute", "over_budget")].mean_duration_seconds is None  # a skip runs nothing
    reroute = report.remediation_actions[0]
    assert reroute.alert == "RedLineLatencyP99" and reroute.target["region"] == "primary"
    assert report.summary.remediation_shadow_runs == 1
    assert report.summary.remediation_skipped_runs == 4


def test_a_run_long_after_its_alert_stopped_is_not_pinned_on_it(spec: Spec) -> None:
    from redline.slo.report.build import build_incidents
    from redline.slo.report.remediation import match_incident

    incidents = build_incidents(ALERTS, WINDOW, 15.0)
    deadline = spec.remediation.policy("reroute").deadline_seconds
    end = BREACH + 30 * M
    assert match_incident(spec, "reroute", end + deadline - M, incidents) is not None
    assert match_incident(spec, "reroute", end + deadline + 2 * M, incidents) is None
    assert match_incident(spec, "reroute", BREACH - M, incidents) is None  # before it fired
    # Two alerts of one playbook: the one that started last before the run.
    found = match_incident(spec, "reroute", BREACH + 5 * M, incidents)
    assert found is not None and found.labels["region"] == "primary"


@pytest.mark.parametrize(
    ("playbook", "outcome", "labels", "expected"),
    [
        ("semantic_rollback", "failed", {"model": "chat", "model_version": "v2"},
         "tried to roll back chat v2"),
        ("semantic_rollback", "shadow", {"model": "chat"}, "would have rolled back chat"),
        ("freeze_and_replay", "shadow", {"collection": "docs", "replica": "eu"},
         "would have frozen writes to docs and replayed the delta log onto eu"),
        ("freeze_writes", "succeeded", {"collection": "docs"}, "froze writes to docs"),
        ("delta_log_replay", "dry_run", {"collection": "docs", "replica": "eu"},
         "planned to replay the delta log of docs onto eu (dry run)"),
        ("reroute", "off", {"region": "eu"}, "did not reroute traffic away from eu"),
        ("custom", "shadow", {}, "would have run custom for SomeAlert"),
        ("reroute", "weird", {}, "reroute ended weird"),
    ],
)  # fmt: skip
def test_wording_per_playbook_and_outcome(
    playbook: str, outcome: str, labels: dict[str, str], expected: str
) -> None:
    assert describe(playbook, outcome, labels, "SomeAlert") == expected


def test_kinds() -> None:
    assert [kind_of(o) for o in ("succeeded", "failed", "shadow", "dry_run", "paused")] == [
        "acted", "acted", "shadow", "dry_run", "skipped",
    ]  # fmt: skip
    assert kind_of("retry") == "other"


def test_guard_rails_list_only_playbooks_not_plainly_acting(report: Report) -> None:
    guards = {g.playbook: g for g in report.remediation_guards}
    assert set(guards) == {"semantic_rollback", "freeze_and_replay", "spot_drain"}
    assert guards["semantic_rollback"].text == (
        "semantic_rollback: mode shadow during the period, shadow at the end"
    )
    assert guards["semantic_rollback"].modes == ["shadow"]
    assert guards["freeze_and_replay"].text == (
        "freeze_and_replay: paused by a human, resumed by the end"
    )
    assert "still open at the end" in guards["spot_drain"].text


def test_markdown_html_csv_and_json_carry_the_same_lines(report: Report) -> None:
    markdown = render_markdown(report)
    page = render_html(report)
    section = markdown.split("## Remediation\n", 1)[1].split("\n## ", 1)[0]
    for action in report.remediation_actions:
        assert f"- {action.text}" in section
        assert action.text in page
    for guard in report.remediation_guards:
        assert f"- {guard.text}" in section and guard.text in page
    assert "(1 shadow, 4 skipped)" in markdown and "(1 shadow, 4 skipped)" in page
    assert 'class="shadow shadow"' in page
    tables = render_csv_tables(report)
    rows = list(csv.DictReader(io.StringIO(tables["remediation_actions.csv"])))
    assert [r["text"] for r in rows] == [a.text for a in report.remediation_actions]
    shadow = next(r for r in rows if r["kind"] == "shadow")
    assert shadow["at"] == "2025-03-01T10:02:00Z" and shadow["alert"] == "SemanticRollbackTwoSignal"
    assert shadow["target"] == "model=chat;model_version=v2"
    guards = list(csv.DictReader(io.StringIO(tables["remediation_guards.csv"])))
    assert [g["playbook"] for g in guards] == [
        "freeze_and_replay",
        "semantic_rollback",
        "spot_drain",
    ]
    data = json.loads(render_json(report))
    assert data["remediation_actions"][-1]["outcome"] == "shadow"
    assert Report.model_validate(data) == report
    schema = json.loads(render_schema())
    assert "remediation_actions" in schema["properties"]


def test_an_old_report_without_the_section_still_reads(report: Report) -> None:
    data = json.loads(render_json(report))
    for key in ("remediation_actions", "remediation_guards"):
        del data[key]
    for key in ("remediation_shadow_runs", "remediation_skipped_runs"):
        del data["summary"][key]
    old = Report.model_validate(data)
    assert old.remediation_actions == [] and "No playbook ran" in render_markdown(old)


def test_the_queries_tile_the_period_and_read_the_gauges() -> None:
    events = remediation_events_query(60)
    runs = str(catalog.REDLINE_REMEDIATION_RUNS_TOTAL)
    # The counter minus itself one step earlier: steps tile the period, no run counted twice.
    assert f"({runs}) - max by (playbook, outcome) ({runs} offset 60s)) > 0" in events
    guards = remediation_guards_query(86400)
    for metric in (
        catalog.REDLINE_REMEDIATION_MODE,
        catalog.REDLINE_REMEDIATION_PAUSED,
        catalog.REDLINE_REMEDIATION_BREAKER_OPEN,
    ):
        assert f"max_over_time({metric}[86400s])" in guards
        assert f"last_over_time({metric}[1h])" in guards
