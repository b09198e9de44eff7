"""Grouped SLOs (`slos[].group_by`) against the real promtool: one SLO per group on the gateway's
series and on engines' own (label mapping, a constant model, the registry's version join), the
averages-hide-failures case, the max_groups guard, and mutations the cases must catch."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from redline.generate.outputs import RULE_FILE, RULES_DIR, TEST_FILE, build_outputs, write_outputs
from redline.generate.promtool import run_rule_tests
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import Sources, Spec

pytestmark = pytest.mark.integration

GROUP_CASE = "pages and tickets alone"
LIMIT_CASE = "(max_groups) are silent"
ZERO = (
    r"0 \* \(\n\s*sum by \(model\) \(rate\("
    + str(catalog.LLM_REQUESTS_TOTAL)
    + r"\[\w+\]\)\)\n\s*\)"
)
"""A grouped availability ratio's zero for a group without errors, in every window."""


def grouped_spec(profile: str, group_by: tuple[str, ...], model: str | None = None) -> Spec:
    """The default spec on `profile`, every SLO grouped by `group_by` with max_groups 3."""
    spec = load_spec().spec
    slos = tuple(
        slo.model_copy(update={"group_by": group_by, "max_groups": 3}) for slo in spec.slos
    )
    sources = Sources(profile=profile, model=model)  # type: ignore[arg-type]
    return spec.model_copy(update={"slos": slos, "sources": sources})


def _cases_only(root: Path, spec: Spec, keep: Callable[[str], bool]) -> tuple[Path, list[str]]:
    """Generate `spec`'s outputs under `root`, keep only the promtool cases `keep` names."""
    write_outputs(root, build_outputs(spec, "spec.yaml"))
    directory = root / RULES_DIR
    tests_file = directory / TEST_FILE
    tests = yaml.safe_load(tests_file.read_text())
    tests["tests"] = [t for t in tests["tests"] if keep(t["name"])]
    tests_file.write_text(yaml.safe_dump(tests))
    return directory, [t["name"] for t in tests["tests"]]


def _slo_cases_only(root: Path, spec: Spec) -> tuple[Path, list[str]]:
    """Only the SLO families' promtool cases."""
    return _cases_only(root, spec, lambda name: " SLO" in name)


@pytest.mark.parametrize(
    ("profile", "group_by", "model"),
    [
        ("redline-gateway", ("model",), None),
        ("redline-gateway", ("region", "served_region"), None),
        ("vllm", ("model", "model_version"), None),
        ("sglang", ("model_version",), None),
        ("tgi", ("model", "region"), "chat"),
    ],
)
def test_grouped_slo_cases_pass_promtool(
    tmp_path: Path, profile: str, group_by: tuple[str, ...], model: str | None
) -> None:
    directory, names = _slo_cases_only(tmp_path, grouped_spec(profile, group_by, model))
    assert sum(GROUP_CASE in name for name in names) == 2  # latency and availability
    assert sum(LIMIT_CASE in name for name in names) == 2
    result = run_rule_tests(directory, TEST_FILE)
    assert result.ok, result.output


@pytest.mark.parametrize(
    ("original", "broken", "failing_case"),
    [
        # the fleet's average instead of one SLO per group: the burning group is averaged away
        (re.escape("sum by (model) ("), "sum (", GROUP_CASE),
        # a group without an error series gets vector(0), which carries no group: its ratio,
        # budget and count are lost
        (ZERO, "vector(0)", "availability SLO: 3 groups"),
        # the group limit inclusive: exactly max_groups would fire
        (re.escape('{slo="latency"}) > 3'), '{slo="latency"}) >= 3', "latency SLO: 3 groups"),
    ],
)  # fmt: skip
def test_the_grouped_cases_catch_a_broken_rule(
    tmp_path: Path, original: str, broken: str, failing_case: str
) -> None:
    directory, _ = _slo_cases_only(tmp_path, grouped_spec("redline-gateway", ("model",)))
    rules = directory / RULE_FILE
    text = rules.read_text()
    mutated = re.sub(original, broken, text)
    assert mutated != text, f"mutation target {original!r} not in the rules"
    rules.write_text(mutated)
    result = run_rule_tests(directory, TEST_FILE)
    assert not result.ok
    assert failing_case in result.output


RED_GROUP_CASE = "fires for itself alone"


def red_line_grouped_spec(profile: str, group_by: tuple[str, ...], model: str | None) -> Spec:
    """The default spec on `profile`, its latency red line grouped by `group_by`."""
    spec = load_spec().spec
    latency = spec.red_lines.latency_p99.model_copy(update={"group_by": group_by})
    red_lines = spec.red_lines.model_copy(update={"latency_p99": latency})
    sources = Sources(profile=profile, model=model)  # type: ignore[arg-type]
    return spec.model_copy(update={"red_lines": red_lines, "sources": sources})


def _red_line_cases_only(root: Path, spec: Spec) -> tuple[Path, list[str]]:
    """Only the latency red line's promtool cases."""
    return _cases_only(root, spec, lambda name: name.startswith("latency red line"))


@pytest.mark.parametrize(
    ("profile", "group_by", "model", "group_cases"),
    [
        ("redline-gateway", ("model",), None, 1),
        ("vllm", ("model", "model_version"), None, 1),
        ("sglang", ("model_version",), None, 1),
        # a constant model grouped by model: one group, the other cases labelled with it
        ("tgi", ("model",), "chat", 0),
    ],
)
def test_grouped_red_line_cases_pass_promtool(
    tmp_path: Path, profile: str, group_by: tuple[str, ...], model: str | None, group_cases: int
) -> None:
    spec = red_line_grouped_spec(profile, group_by, model)
    directory, names = _red_line_cases_only(tmp_path, spec)
    assert sum(RED_GROUP_CASE in name for name in names) == group_cases
    assert len(names) >= 3 + group_cases  # the evidence cases run grouped too
    result = run_rule_tests(directory, TEST_FILE)
    assert result.ok, result.output


def test_the_grouped_red_line_case_catches_the_region_wide_p99(tmp_path: Path) -> None:
    """The P99 recorded per region only (the fleet's, as before group_by): the adapter's breach
    is averaged into its region's traffic, and the grouped case fails."""
    spec = red_line_grouped_spec("redline-gateway", ("model",), None)
    directory, _ = _red_line_cases_only(tmp_path, spec)
    rules = directory / RULE_FILE
    text = rules.read_text()
    mutated = text.replace("sum by (le, region, model) (", "sum by (le, region) (")
    assert mutated != text, "the grouped P99 recording is not in the rules"
    rules.write_text(mutated)
    result = run_rule_tests(directory, TEST_FILE)
    assert not result.ok
    assert RED_GROUP_CASE in result.output
