"""The error-budget dashboard of grouped SLOs: one variable per group label, read from the SLO
recordings, and every panel of a grouped SLO filtered by its group labels and showing them in
the legend; ungrouped SLOs and the other dashboards unchanged."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from redline.dashboards.panels import build_variables
from redline.dashboards.queries import (
    GrafanaContext,
    all_panels,
    panel_queries,
    substitute,
    variable_queries,
)
from redline.dashboards.render import build_dashboards, dashboard_json
from redline.rules.build import build_rule_groups
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import Spec
from tests.unit.dashboards.grafana_schema import schema_problems

BOARD = "error-budgets.json"


def _grouped(spec: Spec, **group_by: tuple[str, ...]) -> Spec:
    """`spec` with each SLO named in `group_by` grouped by those labels."""
    slos = tuple(
        slo.model_copy(update={"group_by": group_by.get(slo.name, slo.group_by)})
        for slo in spec.slos
    )
    return spec.model_copy(update={"slos": slos})


def _by_model(spec: Spec) -> Spec:
    return _grouped(spec, **{slo.name: ("model",) for slo in spec.slos})


def _boards(spec: Spec) -> dict[str, dict[str, Any]]:
    return {name: dashboard_json(board, "test") for name, board in build_dashboards(spec).items()}


def _board(spec: Spec) -> dict[str, Any]:
    return _boards(spec)[BOARD]


def _variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def _slo_targets(board: dict[str, Any], slo: str) -> list[dict[str, Any]]:
    """Every target of the panels of one SLO (titled `<slo>: ...`)."""
    return [
        target
        for panel in all_panels(board)
        if panel["type"] != "row" and panel["title"].startswith(f"{slo}: ")
        for target in panel["targets"]
    ]


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec().spec


def test_default_spec_has_no_group_variables(spec: Spec) -> None:
    assert not any(slo.group_by for slo in spec.slos)
    assert list(_variables(_board(spec))) == ["datasource"]


def test_grouped_by_model_adds_a_model_variable_read_from_the_slo_recordings(
    spec: Spec,
) -> None:
    variables = _variables(_board(_by_model(spec)))
    assert list(variables) == ["datasource", "model"]
    model = variables["model"]
    assert model["type"] == "query" and model["label"] == "Model"
    assert model["query"] == f"label_values({catalog.SLO_ERROR_BUDGET_REMAINING_RECORD}, model)"
    assert model["multi"] and model["includeAll"] and model["refresh"] == 2
    assert model["current"]["value"] == "$__all"
    (parsed,) = variable_queries(_board(_by_model(spec)))
    assert (parsed.name, parsed.label, parsed.match, parsed.multi) == (
        "model",
        "model",
        catalog.SLO_ERROR_BUDGET_REMAINING_RECORD,
        True,
    )


def test_every_panel_of_a_grouped_slo_filters_on_model_and_shows_it(spec: Spec) -> None:
    board = _board(_by_model(spec))
    for slo in spec.slos:
        targets = _slo_targets(board, slo.name)
        assert len(targets) >= 11, slo.name  # 3 budget panels, 2 targets per burn pair
        for target in targets:
            selectors = re.findall(r"redline:[\w:]+(\{[^}]*\})", target["expr"])
            assert selectors, target["expr"]
            for sel in selectors:
                assert f'slo="{slo.name}"' in sel and 'model=~"$model"' in sel, target["expr"]
            assert target["legendFormat"].startswith("{{model}}"), target
    for slo in spec.slos:
        exhaustion = [t["expr"] for t in _slo_targets(board, slo.name) if "clamp_max" in t["expr"]]
        assert exhaustion and all("\n/ on (slo, model)\n" in expr for expr in exhaustion)


def test_ungrouped_slos_are_unchanged_beside_a_grouped_one(spec: Spec) -> None:
    grouped, ungrouped = spec.slos[0].name, spec.slos[1].name
    default, mixed = _board(spec), _board(_grouped(spec, **{grouped: ("model",)}))
    assert _slo_targets(mixed, ungrouped) == _slo_targets(default, ungrouped)
    assert _slo_targets(mixed, grouped) != _slo_targets(default, grouped)
    assert list(_variables(mixed)) == ["datasource", "model"]
    assert mixed["annotations"] == default["annotations"]


def test_only_the_error_budget_dashboard_changes(spec: Spec) -> None:
    default, grouped = _boards(spec), _boards(_by_model(spec))
    for name in default:
        if name != BOARD:
            assert grouped[name] == default[name], name


def test_one_variable_per_label_in_the_label_order(spec: Spec) -> None:
    first, second = spec.slos[0].name, spec.slos[1].name
    board = _board(_grouped(spec, **{first: ("region", "model"), second: ("model_version",)}))
    variables = _variables(board)
    assert list(variables) == ["datasource", "model", "model_version", "region"]
    assert variables["model_version"]["label"] == "Model version"
    for target in _slo_targets(board, first):
        assert 'region=~"$region"' in target["expr"] and 'model=~"$model"' in target["expr"]
        assert "$model_version" not in target["expr"]
        assert target["legendFormat"].startswith("{{region}} {{model}}")
    for target in _slo_targets(board, second):
        assert 'model_version=~"$model_version"' in target["expr"]
        assert '$model"' not in target["expr"] and "$region" not in target["expr"]
    exhaustion = next(t["expr"] for t in _slo_targets(board, first) if "clamp_max" in t["expr"])
    assert "on (slo, region, model)" in exhaustion


def test_grouped_queries_substitute_and_read_recorded_series(spec: Spec) -> None:
    grouped = _grouped(spec, **{spec.slos[0].name: ("model", "served_region")})
    board = _board(grouped)
    records = {r.record for g in build_rule_groups(grouped) for r in g.recordings}
    defined = {v.name for v in variable_queries(board)}
    assert defined == {"model", "served_region"}
    assert {v.match for v in variable_queries(board)} <= records
    context = GrafanaContext(0, 6 * 3600, 15, {"model": ["chat"], "served_region": ["a", "b"]})
    for query in panel_queries(board):
        expr = substitute(query.expr, context)
        assert "$" not in expr, query.where
        for used in re.findall(r"redline:[a-zA-Z0-9_:]+", expr):
            assert used in records, f"{query.where}: no recording rule {used}"


def test_grouped_dashboard_passes_grafanas_schema(spec: Spec) -> None:
    board = _board(_grouped(spec, **{spec.slos[0].name: ("model", "region")}))
    problems = schema_problems(json.loads(json.dumps(board)))
    assert not problems, "\n".join(str(problem) for problem in problems)


def test_a_variable_cannot_be_both_a_label_and_a_group_variable(spec: Spec) -> None:
    assert [v.name for v in build_variables(spec, ["region"], ["model"])] == [
        "datasource",
        "region",
        "model",
    ]
    with pytest.raises(ValueError, match="model"):
        build_variables(spec, ["region", "model"], ["model"])
