"""The chain of alert families: the spec in, every rule group and the promtool test file out.

Each family (`redline.rules.families.*`) builds its rule groups and the promtool cases proving
them; the order of `FAMILIES` is the order of the generated groups and cases. Every alert
carries `severity`, `summary`, `description`, `runbook_url`, and `playbook` where one applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redline.rules.families import (
    breakers,
    drift,
    gpu,
    guards,
    index_consistency,
    mutation,
    quotas,
    recordings,
    red_lines,
    remediation,
    rollback,
    rpo,
    saturation,
    slo,
    sources,
    spot,
    weights,
)
from redline.rules.families.slo import slo_error_ratio_expr
from redline.rules.families.spot import build_spot_alerts
from redline.rules.model import RuleGroup, format_duration
from redline.rules.promtool_cases import AlertIndex, Case, case_eval_step
from redline.rules.records import p99_record, rollback_records
from redline.slo.catalog import slo_errors_record as error_ratio_record
from redline.slo.spec import Spec

__all__ = [
    "FAMILIES",
    "Family",
    "build_rule_groups",
    "build_rule_tests",
    # Re-exported for the drills and the report, which read them from here
    # (`error_ratio_record` is the catalog's `slo_errors_record`).
    "build_spot_alerts",
    "error_ratio_record",
    "p99_record",
    "rollback_records",
    "slo_error_ratio_expr",
]


@dataclass(frozen=True)
class Family:
    """One alert family: its rule groups and the promtool cases proving its alerts."""

    name: str
    build_rules: Callable[[Spec], list[RuleGroup]]
    build_tests: Callable[[Spec, AlertIndex], list[Case]]


FAMILIES = (
    Family("sources", sources.build_rules, sources.build_tests),
    Family("recordings", recordings.build_rules, recordings.build_tests),
    Family("red_lines", red_lines.build_rules, red_lines.build_tests),
    Family("saturation", saturation.build_rules, saturation.build_tests),
    Family("rpo", rpo.build_rules, rpo.build_tests),
    Family("index_consistency", index_consistency.build_rules, index_consistency.build_tests),
    Family("rollback", rollback.build_rules, rollback.build_tests),
    Family("mutation", mutation.build_rules, mutation.build_tests),
    Family("slo", slo.build_rules, slo.build_tests),
    Family("drift", drift.build_rules, drift.build_tests),
    Family("spot", spot.build_rules, spot.build_tests),
    Family("breakers", breakers.build_rules, breakers.build_tests),
    Family("quotas", quotas.build_rules, quotas.build_tests),
    Family("gpu", gpu.build_rules, gpu.build_tests),
    Family("weights", weights.build_rules, weights.build_tests),
    Family("remediation", remediation.build_rules, remediation.build_tests),
    Family("guards", guards.build_rules, guards.build_tests),
)
"""Every family, in the order of the generated rule file and test file."""


def build_rule_groups(spec: Spec) -> list[RuleGroup]:
    """Every rule group of the spec, in a stable order."""
    return [group for family in FAMILIES for group in family.build_rules(spec)]


def build_rule_tests(spec: Spec, groups: list[RuleGroup], rule_files: list[str]) -> dict[str, Any]:
    """The promtool test file proving `groups` (in `rule_files`, relative to the test file)."""
    alerts = AlertIndex(groups)
    cases = [case for family in FAMILIES for case in family.build_tests(spec, alerts)]
    return {
        "rule_files": rule_files,
        "evaluation_interval": format_duration(case_eval_step(spec)),
        "tests": [case.to_dict() for case in cases],
    }
