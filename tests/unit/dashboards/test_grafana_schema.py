"""Every dashboard read through Grafana's own schema (grafana-foundation-sdk's models, made
strict in `grafana_schema`): the committed ones and those of every example spec pass, and a
broken copy fails with the dashboard, the panel and the JSON path of what is wrong."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.dashboards.render import BUILDERS, DASHBOARDS_DIR, build_dashboards, dashboard_json
from redline.slo.load import load_spec
from tests.unit.dashboards.grafana_schema import (
    GRAFANA_VERSION,
    Problem,
    schema_problems,
    sdk_grafana_version,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "slo/specs/examples").glob("*.yaml"))


def _committed(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / DASHBOARDS_DIR / name).read_text("utf-8"))
    return data


def _report(problems: list[Problem]) -> str:
    return "\n".join(str(problem) for problem in problems)


def test_the_sdk_describes_the_grafana_compose_runs() -> None:
    # The SDK publishes one build per Grafana release; pip's newest is not the one we ship.
    assert sdk_grafana_version() == GRAFANA_VERSION, (
        f"install grafana-foundation-sdk's build for Grafana {GRAFANA_VERSION} (pyproject.toml)"
    )
    compose = yaml.safe_load((ROOT / "compose/docker-compose.yml").read_text("utf-8"))
    image = compose["services"]["grafana"]["image"]
    assert image == f"grafana/grafana:{GRAFANA_VERSION}", (
        f"compose runs {image}: check the dashboards against that Grafana's schema"
    )


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_committed_dashboard_passes_grafanas_schema(name: str) -> None:
    problems = schema_problems(_committed(name))
    assert not problems, _report(problems)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.stem)
def test_dashboards_of_every_example_spec_pass_grafanas_schema(example: Path) -> None:
    spec = load_spec(example).spec
    for name, dashboard in build_dashboards(spec).items():
        problems = schema_problems(dashboard_json(dashboard, str(example)))
        assert not problems, f"{example.name} {name}:\n{_report(problems)}"


Mutation = Callable[[dict[str, Any]], None]


def _first(data: dict[str, Any], kind: str) -> dict[str, Any]:
    panel: dict[str, Any] = next(p for p in data["panels"] if p["type"] == kind)
    return panel


def _set(path: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Mutation:
    return lambda data: path(data).__setitem__(key, value)


def _stat(data: dict[str, Any]) -> dict[str, Any]:
    return _first(data, "stat")


def _series(data: dict[str, Any]) -> dict[str, Any]:
    return _first(data, "timeseries")


def _row(data: dict[str, Any]) -> dict[str, Any]:
    return _first(data, "row")


def _region(data: dict[str, Any]) -> dict[str, Any]:
    variable: dict[str, Any] = data["templating"]["list"][1]
    return variable


def _drop_uid(data: dict[str, Any]) -> None:
    del _stat(data)["targets"][0]["datasource"]["uid"]


def _drop_ref_id(data: dict[str, Any]) -> None:
    del _stat(data)["targets"][0]["refId"]


BROKEN: dict[str, tuple[Mutation, str, str]] = {
    # what is broken: (how, where, what the report says)
    "unknown panel field": (_set(_stat, "span", 6), "span", "does not know"),
    "unknown top-level field": (
        lambda data: data.__setitem__("rows", []),
        "$.rows",
        "does not know",
    ),
    "unknown target field": (
        lambda data: _stat(data)["targets"][0].__setitem__("step", 10),
        "targets[0].step",
        "does not know",
    ),
    "unknown stat option": (
        lambda data: _stat(data)["options"].__setitem__("sparkline", True),
        "options.sparkline",
        "does not know",
    ),
    "unknown time-series field config": (
        lambda data: _series(data)["fieldConfig"]["defaults"]["custom"].__setitem__("fill", 1),
        "fieldConfig.defaults.custom.fill",
        "does not know",
    ),
    "field of a panel on a row": (_set(_row, "targets", []), "targets", "does not know"),
    "null description": (_set(_stat, "description", None), "description", "null"),
    "string grid height": (
        lambda data: _stat(data)["gridPos"].__setitem__("h", "6"),
        "gridPos.h",
        'wrong type: "6" where the schema wants int',
    ),
    "string flag on a target": (
        lambda data: _stat(data)["targets"][0].__setitem__("instant", "false"),
        "targets[0].instant",
        "wants bool",
    ),
    "unit as a number": (
        lambda data: _stat(data)["fieldConfig"]["defaults"].__setitem__("unit", 1),
        "fieldConfig.defaults.unit",
        "wants str",
    ),
    "stat colour mode outside the enum": (
        lambda data: _stat(data)["options"].__setitem__("colorMode", "rainbow"),
        "options.colorMode",
        "'background'",
    ),
    "draw style outside the enum": (
        lambda data: _series(data)["fieldConfig"]["defaults"]["custom"].__setitem__(
            "drawStyle", "area"
        ),
        "fieldConfig.defaults.custom.drawStyle",
        "'bars'",
    ),
    "graph tooltip outside the enum": (
        lambda data: data.__setitem__("graphTooltip", 3),
        "$.graphTooltip",
        "0 | 1 | 2",
    ),
    "variable refresh outside the enum": (
        _set(_region, "refresh", "always"),
        "$.templating.list[1].refresh",
        "wrong type",
    ),
    "legacy variable tags": (
        _set(_region, "useTags", False),
        "$.templating.list[1].useTags",
        "does not know",
    ),
    "link flag as a string": (
        lambda data: _stat(data)["links"][0].__setitem__("targetBlank", "yes"),
        "links[0].targetBlank",
        "wants bool",
    ),
    "threshold as a string": (
        lambda data: _stat(data)["fieldConfig"]["defaults"]["thresholds"]["steps"].append(
            {"color": "red", "value": "high"}
        ),
        "thresholds.steps[",
        "wants float",
    ),
    "removed graph panel": (_set(_stat, "type", "graph"), ".type", "not a panel plugin"),
    "misspelt panel type": (_set(_series, "type", "timeserie"), ".type", "not a panel plugin"),
    "datasource without uid": (_drop_uid, "targets[0].datasource", "no uid"),
    "unknown datasource type": (
        lambda data: _stat(data)["datasource"].__setitem__("type", "promethues"),
        "$.panels",
        "promethues",
    ),
    "null panel datasource": (_set(_stat, "datasource", None), "$.panels", "cannot read it"),
    "target without refId": (_drop_ref_id, "targets[0].refId", "required"),
    "panel outside the grid": (
        lambda data: _stat(data)["gridPos"].__setitem__("x", 20),
        "gridPos",
        "24-column grid",
    ),
    "unknown annotation field": (
        lambda data: data["annotations"]["list"][1].__setitem__("query", "up"),
        "$.annotations.list[1].query",
        "does not know",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_copy_fails_with_where_and_why(case: str) -> None:
    mutate, where, why = BROKEN[case]
    data = copy.deepcopy(_committed("red-lines.json"))
    mutate(data)
    problems = schema_problems(data)
    assert problems, f"{case}: not caught"
    report = _report(problems)
    assert any(where in p.path and why in p.message for p in problems), report
    assert all(p.dashboard == data["title"] for p in problems)
    if where.startswith(("$.rows", "$.graphTooltip", "$.templating", "$.annotations")):
        assert all(p.panel is None for p in problems), report
    else:
        titles = {p["title"] for p in data["panels"]}
        assert all(p.panel in titles for p in problems), report


def test_the_report_names_dashboard_panel_and_path() -> None:
    data = copy.deepcopy(_committed("red-lines.json"))
    stat = _stat(data)
    index = data["panels"].index(stat)
    stat["gridPos"]["w"] = "6"
    (problem,) = schema_problems(data)
    assert str(problem) == (
        f"{data['title']}: panel {stat['title']!r} at $.panels[{index}].gridPos.w: "
        'wrong type: "6" where the schema wants int'
    )
