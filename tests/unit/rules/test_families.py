"""The family chain: every family builds rules, and every alert it builds has promtool cases
proving it fires and proving it stays silent."""

from __future__ import annotations

import re
from typing import Any

import pytest

from redline.rules.build import FAMILIES, Family, build_rule_groups, build_rule_tests
from redline.rules.model import AlertRule
from redline.rules.promtool_cases import AlertIndex, Case
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Spec

_LABEL = re.compile(r'(\w+)="([^"]*)"')


@pytest.fixture(params=["default", "local"])
def spec(request: pytest.FixtureRequest) -> Spec:
    base = load_spec().spec
    return base if request.param == "default" else apply_profile(base, "local")


def _cases(spec: Spec, family: Family) -> list[Case]:
    return family.build_tests(spec, AlertIndex(family.build_rules(spec)))


def _input_labelsets(case: Case) -> set[frozenset[tuple[str, str]]]:
    """Distinct label sets of a case's input series (bucket bounds aside)."""
    out = set()
    for name in case.series:
        labels = _LABEL.findall(name.partition("{")[2])
        out.add(frozenset((k, v) for k, v in labels if k != "le"))
    return out


def _fires(cases: list[Case], rule: AlertRule) -> bool:
    return any(
        alertname == rule.alert
        and any(rule.labels.items() <= exp["exp_labels"].items() for exp in exp_alerts)
        for case in cases
        for alertname, exp_alerts in case.checks
    )


def _stays_silent(cases: list[Case], alert: str) -> bool:
    """Some case feeds the alert inputs of which fewer fire than there are (none, often)."""
    return any(
        alertname == alert and len(exp_alerts) < len(_input_labelsets(case))
        for case in cases
        for alertname, exp_alerts in case.checks
    )


def test_the_chain_is_every_family_in_order(spec: Spec) -> None:
    assert [f.name for f in FAMILIES] == [
        "recordings", "red_lines", "rpo", "rollback", "slo", "drift", "spot", "guards",
    ]  # fmt: skip
    groups = build_rule_groups(spec)
    assert groups == [g for f in FAMILIES for g in f.build_rules(spec)]
    assert len({g.name for g in groups}) == len(groups)
    tests = build_rule_tests(spec, groups, ["rules.yml"])["tests"]
    assert tests == [c.to_dict() for f in FAMILIES for c in _cases(spec, f)]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_builds_rules(spec: Spec, family: Family) -> None:
    assert family.build_rules(spec)
    assert all(group.rules for group in family.build_rules(spec))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_alert_has_a_firing_and_a_silent_case_in_its_family(
    spec: Spec, family: Family
) -> None:
    alerts = [a for g in family.build_rules(spec) for a in g.alerts]
    cases = _cases(spec, family)
    assert bool(alerts) == bool(cases), "cases without alerts, or alerts without cases"
    for rule in alerts:
        assert _fires(cases, rule), f"no case where {rule.alert} {rule.labels} fires"
        assert _stays_silent(cases, rule.alert), f"no case where {rule.alert} stays silent"


def test_a_family_without_alerts_only_records_what_other_families_alert_on(spec: Spec) -> None:
    expressions = " ".join(a.expr for g in build_rule_groups(spec) for a in g.alerts)
    for family in FAMILIES:
        groups = family.build_rules(spec)
        if any(g.alerts for g in groups):
            continue
        for group in groups:
            for recording in group.recordings:
                assert recording.record in expressions, f"{recording.record} feeds no alert"


def test_every_case_checks_something(spec: Spec) -> None:
    cases: list[dict[str, Any]] = build_rule_tests(spec, build_rule_groups(spec), [])["tests"]
    assert all(case["alert_rule_test"] for case in cases)
