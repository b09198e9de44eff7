"""The index-consistency family's promtool cases against the real promtool: they pass for the
default spec and for one with another red line, and they fail when the rule is broken."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from redline.generate.outputs import RULE_FILE, RULES_DIR, TEST_FILE, build_outputs, write_outputs
from redline.generate.promtool import run_rule_tests
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import Spec

pytestmark = pytest.mark.integration

PREFIX = "index consistency:"


def _generate(spec: Spec, root: Path) -> Path:
    """The spec's output with the test file cut down to the index-consistency cases."""
    write_outputs(root, build_outputs(spec, "spec.yaml"))
    directory = root / RULES_DIR
    tests_file = directory / TEST_FILE
    tests = yaml.safe_load(tests_file.read_text())
    tests["tests"] = [t for t in tests["tests"] if t["name"].startswith(PREFIX)]
    assert len(tests["tests"]) == 2, "no index-consistency cases"
    tests_file.write_text(yaml.safe_dump(tests))
    return directory


def _variant() -> Spec:
    spec = load_spec().spec
    red = spec.red_lines
    index = red.index_consistency.model_copy(update={"max_staleness_seconds": 3})
    return spec.model_copy(
        update={"red_lines": red.model_copy(update={"index_consistency": index})}
    )


@pytest.mark.parametrize("variant", ["default", "a 3 s red line"])
def test_the_index_consistency_cases_pass(tmp_path: Path, variant: str) -> None:
    spec = load_spec().spec if variant == "default" else _variant()
    result = run_rule_tests(_generate(spec, tmp_path), TEST_FILE)
    assert result.ok, result.output


BOUND = catalog.VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS.name


@pytest.mark.parametrize(
    ("original", "broken", "failing_case"),
    [
        # the boundary: a bound at the red line counts as weak
        (f"({BOUND}) > 12", f"({BOUND}) >= 12", "are quiet"),
        # the red line ignored (only an unbounded level fires)
        (f"({BOUND}) > 12", f"({BOUND}) > 1e9", "Bounded over the red line"),
        # every level fires, Strong included
        (f"({BOUND}) > 12", f"({BOUND}) >= 0", "are quiet"),
        # no `for`: fires at once
        ("    for: 5m\n", "", "Bounded over the red line"),
        # the level's label lost
        ("group_left (level)", "group_left ()", "Bounded over the red line"),
    ],
)
def test_the_index_consistency_cases_catch_a_broken_rule(
    tmp_path: Path, original: str, broken: str, failing_case: str
) -> None:
    directory = _generate(load_spec().spec, tmp_path)
    rules = directory / RULE_FILE
    text = rules.read_text()
    assert original in text, f"mutation target {original!r} not in the rules"
    rules.write_text(text.replace(original, broken, 1))
    result = run_rule_tests(directory, TEST_FILE)
    assert not result.ok
    assert failing_case in result.output
