"""The index-consistency family's promtool cases against the real promtool: they pass for the
default spec and for one with another red line, and they fail when the rule is broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import Spec
from tests.support.promtool import run_family_cases, run_with_broken_rule, write_family_cases

pytestmark = pytest.mark.integration

PREFIX = "index consistency:"


def _generate(spec: Spec, root: Path) -> Path:
    directory, kept = write_family_cases(spec, root, PREFIX)
    assert kept == 2, kept
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
    result = run_family_cases(_generate(spec, tmp_path))
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
    result = run_with_broken_rule(directory, original, broken)
    assert not result.ok
    assert failing_case in result.output
