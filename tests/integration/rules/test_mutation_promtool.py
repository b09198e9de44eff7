"""The mutation family's rules and cases against the real promtool, for each variant the spec
can build: the default (candidate only), a gate with a `for` (early rollback on a mutation while
the gate's conditions hold) and `rollback.on_mutation: true`; and a broken rule fails its case.

Only the rollback and mutation groups are loaded (the mutation cases feed the gate's recorded
series directly): the rollback family's own cases assume its default `for` of 0, and the whole
file.s run is tests/integration/rules/test_promtool.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from redline.generate.promtool import RuleTestResult, run_rule_tests
from redline.rules.families import mutation, rollback
from redline.rules.families.mutation import MIN_CHANGES
from redline.rules.promtool_cases import AlertIndex
from redline.rules.render import render_rule_file, render_yaml
from redline.slo.load import load_spec
from redline.slo.spec import Spec

pytestmark = pytest.mark.integration


def _variant(name: str) -> Spec:
    spec = load_spec().spec
    if name == "gate-for":
        return spec.model_copy(update={"rollback": spec.rollback.model_copy(
            update={"for_seconds": 600})})  # fmt: skip
    if name == "on-mutation":
        return spec.model_copy(update={"rollback": spec.rollback.model_copy(
            update={"on_mutation": True})})  # fmt: skip
    return spec


def _write(spec: Spec, directory: Path) -> str:
    groups = rollback.build_rules(spec) + mutation.build_rules(spec)
    rules = render_rule_file(groups, "spec.yaml")
    (directory / "rules.yml").write_text(rules)
    cases = mutation.build_tests(spec, AlertIndex(groups))
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [case.to_dict() for case in cases],
    }
    (directory / "tests.yml").write_text(render_yaml(tests, "spec.yaml"))
    assert yaml.safe_load(rules)["groups"]
    return rules


def _promtool(directory: Path) -> RuleTestResult:
    return run_rule_tests(directory, "tests.yml")


@pytest.mark.parametrize("variant", ["default", "gate-for", "on-mutation"])
def test_every_variant_passes_its_promtool_cases(tmp_path: Path, variant: str) -> None:
    rules = _write(_variant(variant), tmp_path)
    assert ("OutputConsistencyMutationRollback" in rules) == (variant != "default")
    result = _promtool(tmp_path)
    assert result.ok, result.output


def test_a_rule_without_the_changes_leg_fails_its_case(tmp_path: Path) -> None:
    text = _write(_variant("default"), tmp_path)
    leg = f">= {MIN_CHANGES}"
    assert leg in text
    (tmp_path / "rules.yml").write_text(text.replace(leg, ">= 0"))
    result = _promtool(tmp_path)
    assert not result.ok
    assert f"{MIN_CHANGES - 1} changed tokens stay silent" in result.output
