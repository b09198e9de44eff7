"""The weights family's promtool cases against the real promtool: they pass for the default
spec, and each fails when its alert's line moves by one step (`>` becomes `>=`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from redline.generate.outputs import RULE_FILE, RULES_DIR, TEST_FILE, build_outputs, write_outputs
from redline.generate.promtool import run_rule_tests
from redline.slo import catalog
from redline.slo.load import load_spec

pytestmark = pytest.mark.integration

PREFIX = "weights:"


def _generate(root: Path) -> Path:
    """The default spec's output with the test file cut down to the weights cases."""
    write_outputs(root, build_outputs(load_spec().spec, "spec.yaml"))
    directory = root / RULES_DIR
    tests_file = directory / TEST_FILE
    tests = yaml.safe_load(tests_file.read_text())
    tests["tests"] = [t for t in tests["tests"] if t["name"].startswith(PREFIX)]
    assert len(tests["tests"]) == 4, [t["name"] for t in tests["tests"]]
    tests_file.write_text(yaml.safe_dump(tests))
    return directory


def test_the_weights_cases_pass(tmp_path: Path) -> None:
    result = run_rule_tests(_generate(tmp_path), TEST_FILE)
    assert result.ok, result.output


@pytest.mark.parametrize(
    ("original", "broken", "failing_case"),
    [
        # a DEK exactly at its rotation period is overdue
        ("> on (keyring)", ">= on (keyring)", "DEK rotation"),
        # a keyring with no shard past retention pages
        (
            f"({catalog.WEIGHTS_SHARDS_PAST_RETENTION}) > 0",
            f"({catalog.WEIGHTS_SHARDS_PAST_RETENTION}) >= 0",
            "DEK retention",
        ),
        # a passed verification pages
        (
            f"({catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION}) > 0",
            f"({catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION}) >= 0",
            "shard verification",
        ),
        # a region exactly at the RPO fires
        (
            f"({catalog.WEIGHTS_SYNC_LAG_SECONDS}) > 90",
            f"({catalog.WEIGHTS_SYNC_LAG_SECONDS}) >= 90",
            "sync RPO",
        ),
    ],
)
def test_the_weights_cases_catch_a_broken_rule(
    tmp_path: Path, original: str, broken: str, failing_case: str
) -> None:
    directory = _generate(tmp_path)
    rules = directory / RULE_FILE
    text = rules.read_text()
    assert text.count(original) == 1, f"mutation target {original!r} not once in the rules"
    rules.write_text(text.replace(original, broken, 1))
    result = run_rule_tests(directory, TEST_FILE)
    assert not result.ok
    assert failing_case in result.output
