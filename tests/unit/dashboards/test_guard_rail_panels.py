"""The remediation dashboard's shadow-mode, skip, guard-rail and deadline panels and its shadow
annotation, and the RPO dashboard's delta-log entries and memory (what they read, thresholds
from the spec). That each query returns data is checked against a real Prometheus in
tests/integration/devstack/test_dashboard_queries.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from redline.dashboards.queries import all_panels, panel_queries
from redline.dashboards.render import build_dashboards, render_dashboard
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import PlaybookPolicy, Spec


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec().spec


def _board(spec: Spec, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(render_dashboard(build_dashboards(spec)[name], "test"))
    return data


def _panels(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["title"]: p for p in all_panels(board) if p["type"] != "row"}


def _exprs(panel: dict[str, Any]) -> str:
    return "\n".join(t["expr"] for t in panel["targets"])


def test_shadow_runs_and_skips_by_reason(spec: Spec) -> None:
    panels = _panels(_board(spec, "remediation.json"))
    runs = str(catalog.REDLINE_REMEDIATION_RUNS_TOTAL)
    shadow = _exprs(panels["Shadow runs (range)"])
    assert f'{runs}{{outcome="shadow"}}' in shadow and "by (playbook)" in shadow
    assert "would have done" in panels["Shadow runs (range)"]["description"]
    skipped = _exprs(panels["Skipped runs by reason (range)"])
    assert f'{runs}{{outcome=~"off|paused|over_budget|breaker_open"}}' in skipped
    assert "sum by (outcome)" in skipped
    both = _exprs(panels["Shadow runs and skips"])
    assert 'outcome=~"shadow|off|paused|over_budget|breaker_open"' in both


def test_guard_rails_per_playbook(spec: Spec) -> None:
    panels = _panels(_board(spec, "remediation.json"))
    state = panels["Next alert: what each playbook does"]
    expr = _exprs(state)
    for metric in (
        catalog.REDLINE_REMEDIATION_MODE,
        catalog.REDLINE_REMEDIATION_PAUSED,
        catalog.REDLINE_REMEDIATION_BREAKER_OPEN,
    ):
        assert str(metric) in expr
    # The worker's order: off, paused, shadow (which ignores the breaker), breaker, act.
    order = [expr.index(part) for part in ('mode="off"', "paused", 'mode="shadow"', "breaker")]
    assert order == sorted(order)
    mappings = state["fieldConfig"]["defaults"]["mappings"]
    texts = {value["text"] for mapping in mappings for value in mapping["options"].values()}
    assert texts == {"acts", "shadow (plans only)", "off", "PAUSED", "BREAKER OPEN"}
    assert _exprs(panels["Guard rails over time"]) == expr
    assert panels["Guard rails over time"]["type"] == "timeseries"
    assert str(catalog.REDLINE_REMEDIATION_MODE) in _exprs(panels["Mode"])
    assert str(catalog.REDLINE_REMEDIATION_PAUSED) in _exprs(panels["Paused"])
    assert str(catalog.REDLINE_REMEDIATION_BREAKER_OPEN) in _exprs(panels["Breaker"])
    assert panels["Breaker"]["links"][0]["url"].endswith("/RemediationDisabled")


def test_overdue_jobs_against_the_shortest_deadline(spec: Spec) -> None:
    panels = _panels(_board(spec, "remediation.json"))
    assert str(catalog.REDLINE_REMEDIATION_JOBS_OVERDUE) in _exprs(panels["Overdue jobs"])
    assert panels["Overdue jobs"]["links"][0]["url"].endswith("/RemediationStuck")
    default = PlaybookPolicy().deadline_seconds
    oldest = panels[f"Oldest unfinished job (deadline {default:g} s)"]
    assert str(catalog.REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS) in _exprs(oldest)
    steps = oldest["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": default}
    data = spec.model_dump()
    data["remediation"] = {"playbooks": {"reroute": {"deadline": "5m"}}}
    tighter = _panels(_board(Spec.model_validate(data), "remediation.json"))
    assert "Oldest unfinished job (deadline 300 s)" in tighter


def test_shadow_annotation_names_the_playbook_and_its_alert(spec: Spec) -> None:
    board = _board(spec, "remediation.json")
    (shadow,) = [a for a in board["annotations"]["list"] if a.get("name") == "Shadow runs"]
    assert shadow["textFormat"].startswith("would have run {{playbook}} ({{alertname}}")
    assert shadow["titleFormat"] == "shadow: {{playbook}}"
    expr = shadow["expr"]
    assert 'outcome="shadow"' in expr and 'ALERTS{alertstate="firing",playbook!=""}' in expr
    # The bare run when no alert of its playbook was firing.
    assert "\nor on (playbook) max by (playbook)" in expr
    names = [q.where for q in panel_queries(board) if q.annotation]
    assert names == [
        "annotation 'Alerts with a playbook'",
        "annotation 'Remediation runs'",
        "annotation 'Shadow runs'",
    ]


def test_delta_log_entries_and_memory_per_collection(spec: Spec) -> None:
    panels = _panels(_board(spec, "rpo.json"))
    entries = panels["Delta-log entries held, per collection"]
    memory = panels["Delta-log memory, per collection"]
    assert _exprs(entries) == f"max by (collection) ({catalog.VECTORDB_DELTA_LOG_ENTRIES})"
    assert _exprs(memory) == f"max by (collection) ({catalog.VECTORDB_DELTA_LOG_MEMORY_BYTES})"
    assert memory["fieldConfig"]["defaults"]["unit"] == "bytes"
    assert panels["Delta-log memory"]["fieldConfig"]["defaults"]["unit"] == "bytes"
    for panel in (entries, memory, panels["Delta-log entries held"]):
        assert "Steady growth means a stuck or unregistered replica" in panel["description"]
        assert panel["links"][0]["url"].endswith("/IndexDeltaLogRPOBreach")
