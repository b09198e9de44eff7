"""The alert catalog spells every alert name once; the rules raise exactly its alerts, each with
a severity and playbook the catalog names."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.rules.build import build_rule_groups
from redline.rules.model import AlertRule
from redline.slo.alerts import ERROR_BUDGET_BURN, Alert, alert_names, render_alerts_markdown
from redline.slo.load import load_spec
from redline.slo.spec import Sources, Spec
from tests.unit.slo.test_catalog import ROOT, _literal_uses

PRODUCT = ("slo", "rules", "dashboards", "exporters", "remediation", "redline")
ALLOWED = {ROOT / "slo" / "alerts.py"}


def _product_files() -> list[Path]:
    return [
        path
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.resolve() not in ALLOWED
    ]


def test_no_alert_name_is_spelled_outside_the_catalog() -> None:
    names = alert_names() | {ERROR_BUDGET_BURN.suffix}
    found = [
        f"{path.relative_to(ROOT)}:{line}: {token}"
        for path in _product_files()
        for line, token in _literal_uses(path, names)
    ]
    assert not found, "use the redline.slo.alerts entry instead of the literal:\n" + "\n".join(
        found
    )


def _variants() -> list[Spec]:
    spec = load_spec().spec
    mutation = spec.model_copy(
        update={"rollback": spec.rollback.model_copy(update={"on_mutation": True})}
    )
    grouped = spec.model_copy(
        update={"slos": tuple(s.model_copy(update={"group_by": ("model",)}) for s in spec.slos)}
    )
    engine = spec.model_copy(update={"sources": Sources(profile="vllm")})
    return [spec, mutation, grouped, engine]


def _alerts(spec: Spec) -> list[AlertRule]:
    return [rule for group in build_rule_groups(spec) for rule in group.alerts]


def test_the_rules_raise_every_catalog_alert_and_no_other() -> None:
    raised = {rule.alert for spec in _variants() for rule in _alerts(spec)}
    burn = {slo.burn_alert_name for slo in load_spec().spec.slos}
    assert raised == alert_names() | burn


@pytest.mark.parametrize("spec", _variants(), ids=["default", "on-mutation", "grouped", "vllm"])
def test_each_alert_fires_with_a_severity_and_playbook_the_catalog_names(spec: Spec) -> None:
    for rule in _alerts(spec):
        severity = rule.labels["severity"]
        if rule.alert in alert_names():
            entry = Alert(rule.alert)
            assert severity in entry.severities, rule.alert
            assert rule.labels.get("playbook") in (entry.playbook, None) or entry.playbook, rule
            assert rule.annotations["runbook_url"].endswith(f"/{entry.runbook}")
        else:
            assert severity in ERROR_BUDGET_BURN.severities, rule.alert


def test_an_alert_with_two_severities_must_be_told_which() -> None:
    assert Alert.RED_LINE_LATENCY_P99.severity == "critical"
    assert Alert.RED_LINE_LATENCY_P99 == "RedLineLatencyP99"
    assert ERROR_BUDGET_BURN.for_slo("time_to_first_token") == "TimeToFirstTokenErrorBudgetBurn"


def test_architecture_doc_prints_the_alert_catalog() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    table = doc.split("<!-- alerts:start -->\n", 1)[1].split("<!-- alerts:end -->", 1)[0]
    assert table == render_alerts_markdown(), (
        "docs/architecture.md's alert table is stale: replace it with the output of "
        "`python -m redline.slo.alerts`"
    )
