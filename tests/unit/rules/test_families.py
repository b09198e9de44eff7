"""The family chain: every family builds rules, and every alert it builds has promtool cases
proving it fires and proving it stays silent."""

from __future__ import annotations

import re
from typing import Any

import pytest

from redline.rules.build import FAMILIES, Family, build_rule_groups, build_rule_tests
from redline.rules.model import AlertRule
from redline.rules.promtool_cases import AlertIndex, Case
from redline.rules.records import display_records
from redline.slo.load import apply_profile, load_spec
from redline.slo.sources import PROFILE_NAMES
from redline.slo.spec import Sources, Spec

_LABEL = re.compile(r'(\w+)="([^"]*)"')
ENGINE_PROFILES = [name for name in PROFILE_NAMES if name != "redline-gateway"]


def profile_spec(base: Spec, profile: str) -> Spec:
    """`base` reading its SLIs from `profile` (TGI's series name no model: one is set)."""
    sources = Sources(profile=profile, model="chat" if profile == "tgi" else None)  # type: ignore[arg-type]
    return base.model_copy(update={"sources": sources})


@pytest.fixture(params=["default", "local", *ENGINE_PROFILES])
def spec(request: pytest.FixtureRequest) -> Spec:
    base = load_spec().spec
    if request.param == "default":
        return base
    if request.param == "local":
        return apply_profile(base, "local")
    return profile_spec(base, request.param)


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
        "sources", "recordings", "red_lines", "saturation", "rpo", "index_consistency",
        "rollback", "mutation", "slo", "drift", "spot", "breakers", "quotas", "gpu", "weights",
        "remediation", "guards",
    ]  # fmt: skip
    groups = build_rule_groups(spec)
    assert groups == [g for f in FAMILIES for g in f.build_rules(spec)]
    assert len({g.name for g in groups}) == len(groups)
    tests = build_rule_tests(spec, groups, ["rules.yml"])["tests"]
    assert tests == [c.to_dict() for f in FAMILIES for c in _cases(spec, f)]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_builds_rules(spec: Spec, family: Family) -> None:
    # The source mirror is empty where every signal is read as it is (redline's gateway), the
    # saturation family where the source has no engine queue (the gateway, OpenTelemetry).
    resolved = spec.sources.resolve()
    assert (
        family.build_rules(spec)
        or (family.name == "sources" and not resolved.mirrored)
        or (family.name == "saturation" and not resolved.profile.saturation)
    )
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


def test_a_family_without_alerts_only_records_what_other_rules_read(spec: Spec) -> None:
    """Every recording of an alert-less family feeds a rule, or is one of the few the dashboards
    and reports read (tokens/s, TTFT)."""
    groups = build_rule_groups(spec)
    shown = set(display_records(spec))
    for family in FAMILIES:
        own = family.build_rules(spec)
        if any(g.alerts for g in own):
            continue
        for group in own:
            for recording in group.recordings:
                readers = " ".join(
                    rule.expr for g in groups for rule in g.rules if rule is not recording
                )
                read = re.search(rf"{re.escape(recording.record)}\b", readers)
                assert read or recording.record in shown, f"{recording.record} feeds no rule"


def test_every_case_checks_something(spec: Spec) -> None:
    cases: list[dict[str, Any]] = build_rule_tests(spec, build_rule_groups(spec), [])["tests"]
    assert all(case["alert_rule_test"] for case in cases)
