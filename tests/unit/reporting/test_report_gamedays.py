"""Game days in the SLO report: `gameday.json` files read back, kept by the period, and printed
as the §5 table with each run's steps in every format; absent when none were given."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from redline.gameday.observe import Timeline
from redline.gameday.plan import Safety, build_gameday_plan
from redline.gameday.report import GamedayResult, judge
from redline.gameday.report import render_json as render_gameday_json
from redline.generate.chaos import ChaosOptions
from redline.generate.kubernetes import KubernetesOptions
from redline.reporting.gamedays import (
    GamedayError,
    GamedayRun,
    ReportWithGamedays,
    build_gamedays,
    load_gamedays,
)
from redline.reporting.render.html import render_html
from redline.reporting.render.markdown import render_markdown
from redline.reporting.render.tables import render_csv_tables, render_json, render_schema
from redline.slo.load import load_spec
from redline.slo.report import Report, ReportInput, SloSeries, Window, build_report

H = 3600
T0 = int(datetime(2025, 3, 1, tzinfo=UTC).timestamp())
WINDOW = Window(T0, T0 + 12 * H)


def _run(drill: str, kind: str, fault_at: float | None, **changes: Any) -> dict[str, Any]:
    """One result as `redline gameday run` writes it (`result_as_dict`)."""
    run: dict[str, Any] = {
        "drill": drill,
        "experiment": {"kind": kind, "namespace": "redline", "name": f"redline-{drill}"},
        "expects": "RedLineLatencyP99",
        "fault_at": fault_at,
        "ended_at": None if fault_at is None else fault_at + 300.0,
        "detect_seconds": 31.5,
        "alertmanager_seconds": 33.0,
        "notify_seconds": 34.25,
        "playbook_start_seconds": 35.0,
        "remediate_seconds": 80.0,
        "rto_seconds": 95.0,
        "rpo_seconds": None,
        "failed_requests": 12.0,
        "red_lines_fired": {"RedLineLatencyP99": 31.5},
        "worst_error_ratio": 0.01,
        "job_id": "job-1",
        "budgets": {"detect_seconds": 120.0, "rto_seconds": 420.0, "rpo_seconds": None},
        "aborted": None,
        "error": None,
        "problems": [],
        "verdict": "pass",
    }
    return run | changes


def _write(path: Path, runs: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs, indent=2), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def report() -> Report:
    spec = load_spec().spec
    hours: dict[float, float] = {T0 + (i + 1) * H: 1000.0 for i in range(12)}
    data = ReportInput(
        window=WINDOW,
        slos={slo.name: SloSeries(hours, dict.fromkeys(hours, 0.0001)) for slo in spec.slos},
        signals={},
        alerts=[],
    )
    return build_report(
        spec, data, spec_source="test", prometheus="http://p",
        generated_at=datetime(2025, 3, 1, 12, 5, tzinfo=UTC),
    )  # fmt: skip


@pytest.fixture
def runs(tmp_path: Path) -> list[GamedayRun]:
    late = _run(
        "session-rpo", "NetworkChaos", T0 + 5 * H, rto_seconds=None, rpo_seconds=9.0,
        failed_requests=None, verdict="FAIL: RPO 9 s > 3 s", problems=["RPO 9 s > 3 s"],
        budgets={"detect_seconds": 60.0, "rto_seconds": 360.0, "rpo_seconds": 3.0},
    )  # fmt: skip
    _write(tmp_path / "day1" / "gameday.json", [late])
    _write(tmp_path / "day2" / "gameday.json", [_run("latency", "NetworkChaos", T0 + 2 * H)])
    _write(tmp_path / "old" / "gameday.json", [_run("latency", "NetworkChaos", T0 - H)])
    return load_gamedays([tmp_path])


def test_a_directory_is_searched_and_the_period_keeps_its_own(runs: list[GamedayRun]) -> None:
    assert len(runs) == 3 and {Path(r.source).parent.name for r in runs} == {
        "day1",
        "day2",
        "old",
    }
    kept = build_gamedays(runs, WINDOW)
    # In time order; the run before the period is left out, and so is one at its end.
    assert [(r.drill, r.fault_at) for r in kept] == [
        ("latency", datetime(2025, 3, 1, 2, tzinfo=UTC)),
        ("session-rpo", datetime(2025, 3, 1, 5, tzinfo=UTC)),
    ]
    at_end = runs[0].model_copy(update={"fault_at": datetime(2025, 3, 1, 12, tzinfo=UTC)})
    assert build_gamedays([at_end], WINDOW) == []
    assert [r.outcome for r in kept] == ["pass", "fail"]


def test_a_run_whose_fault_was_never_injected_sits_at_its_end(tmp_path: Path) -> None:
    errored = _run("latency", "NetworkChaos", None, ended_at=T0 + H, error="forbidden")
    (run,) = load_gamedays([_write(tmp_path / "g.json", [errored])])
    assert run.fault_at is None and build_gamedays([run], WINDOW) == [run]
    assert run.outcome == "error"


def test_what_redline_gameday_writes_reads_back(tmp_path: Path) -> None:
    """The contract: `redline.gameday.report.render_json`'s file loads without loss."""
    options = ChaosOptions(kubernetes=KubernetesOptions(namespace="redline"))
    plan = build_gameday_plan(
        load_spec().spec, "session-rpo", options, Safety("redline", 600, 0.05)
    )
    result = GamedayResult(plan, Timeline(T0 + H, firing_at=T0 + H + 20.0,
                           recovered_at=T0 + H + 60.0), T0 + H + 90.0, rpo_seconds=2.0,
                           failed_requests=0.0)  # fmt: skip
    result.problems = judge(result)
    path = tmp_path / "gameday.json"
    path.write_text(render_gameday_json([result]), encoding="utf-8")
    (run,) = load_gamedays([path])
    assert run.fault == f"session-rpo ({plan.kind})" and run.verdict == "pass"
    assert run.fault_at == datetime(2025, 3, 1, 1, tzinfo=UTC)
    assert (run.detect_seconds, run.rto_seconds, run.rpo_seconds) == (20.0, 60.0, 2.0)
    assert run.budgets.rpo_seconds == plan.rpo_budget_seconds
    assert run.source == str(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[{", "g.json: line 1, column 3: malformed JSON"),
        ('{"drill": "latency"}', "g.json: (top level): expected a JSON list"),
        (json.dumps([_run("a", "PodChaos", 1.0e9) | {"fault_at": "soon"}]),
         "g.json: [0].fault_at: expected unix seconds (a number) or null, got 'soon'"),
        (
            json.dumps([_run("a", "PodChaos", 1.0e9), {**_run("b", "PodChaos", 1.0e9),
                        "experiment": {"namespace": "x", "name": "y"}}]),
            "g.json: [1].experiment.kind: required field is missing",
        ),
        (json.dumps([_run("a", "PodChaos", 1.0e9, failed_requests="many")]),
         "g.json: [0].failed_requests: Input should be a valid number"),
    ],
)  # fmt: skip
def test_a_malformed_file_names_the_file_and_field(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "g.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(GamedayError) as caught:
        load_gamedays([path])
    assert problem in str(caught.value)
    assert all(line.startswith(str(path)) for line in caught.value.problems)


def test_missing_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(GamedayError, match="nowhere.json: no such file or directory"):
        load_gamedays([tmp_path / "nowhere.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(GamedayError, match="empty: no gameday.json under this directory"):
        load_gamedays([tmp_path / "empty"])


def test_markdown_prints_the_table_and_each_runs_steps(
    report: Report, runs: list[GamedayRun]
) -> None:
    text = render_markdown(report, build_gamedays(runs, WINDOW))
    section = text[text.index("## Game days") : text.index("## Calendar")]
    assert "2 game day(s) (`redline gameday run`), 1 within every budget." in section
    assert "| fault | RTO | RPO | failed requests | verdict |" in section
    assert "| latency (NetworkChaos) | 95.0 s | n/a | 12 | pass |" in section
    assert "| session-rpo (NetworkChaos) | n/a | 9.0 s | n/a | FAIL: RPO 9 s > 3 s |" in section
    assert (
        "| latency (NetworkChaos) | 2025-03-01 02:00 UTC | RedLineLatencyP99 | 31.5 s | 33.0 s | "
        "34.2 s | 35.0 s | 80.0 s | 95.0 s | detect 120 s, RTO 420 s |"
    ) in section
    assert "detect 60 s, RTO 360 s, RPO 3 s |" in section
    assert "No game day's fault fell in the period." in render_markdown(report, [])


def test_html_prints_the_same(report: Report, runs: list[GamedayRun]) -> None:
    page = render_html(report, gamedays=build_gamedays(runs, WINDOW))
    section = page[page.index('<section id="gamedays">') : page.index('<section id="calendar">')]
    assert "<td>latency (NetworkChaos)</td>" in section
    assert '<span class="status fail">FAIL</span> <small>FAIL: RPO 9 s &gt; 3 s</small>' in section
    assert '<td class="num">95.0 s</td>' in section and '<td class="num">34.2 s</td>' in section
    assert "No game day" in render_html(report, gamedays=[])


def test_csv_and_json_carry_one_row_and_object_per_run(
    report: Report, runs: list[GamedayRun]
) -> None:
    kept = build_gamedays(runs, WINDOW)
    rows = list(csv.DictReader(io.StringIO(render_csv_tables(report, kept)["gamedays.csv"])))
    assert [(r["drill"], r["kind"], r["fault_at"], r["verdict"]) for r in rows] == [
        ("latency", "NetworkChaos", "2025-03-01T02:00:00Z", "pass"),
        ("session-rpo", "NetworkChaos", "2025-03-01T05:00:00Z", "FAIL: RPO 9 s > 3 s"),
    ]
    assert rows[0]["rto_seconds"] == "95.0" and rows[0]["rpo_budget_seconds"] == ""
    assert rows[0]["red_lines_fired"] == "RedLineLatencyP99=31.5"
    assert rows[1]["problems"] == "RPO 9 s > 3 s"
    data = json.loads(render_json(report, kept))
    assert [g["drill"] for g in data["gamedays"]] == ["latency", "session-rpo"]
    assert data["gamedays"][0]["fault_at"] == "2025-03-01T02:00:00Z"
    back = ReportWithGamedays.model_validate(data)
    assert back.gamedays == kept
    assert "gamedays" in json.loads(render_schema())["properties"]
    assert json.loads(render_json(report, []))["gamedays"] == []


def test_without_game_days_nothing_changes(report: Report) -> None:
    assert "Game days" not in render_markdown(report)
    assert 'id="gamedays"' not in render_html(report)
    assert "gamedays.csv" not in render_csv_tables(report)
    assert render_json(report) == report.model_dump_json(indent=2) + "\n"
    assert "gamedays" not in json.loads(render_json(report))
