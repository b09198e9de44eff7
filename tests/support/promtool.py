"""One rule family's promtool cases against the real promtool: the spec's output written with
its test file cut down to the family's cases, and the same run on a rule file with one mutation
(a rule family's cases must pass, and fail when its rule is broken)."""

from __future__ import annotations

from pathlib import Path

import yaml

from redline.generate.outputs import RULE_FILE, RULES_DIR, TEST_FILE, build_outputs, write_outputs
from redline.generate.promtool import RuleTestResult, run_rule_tests
from redline.slo.spec import Spec


def write_family_cases(spec: Spec, root: Path, prefix: str) -> tuple[Path, int]:
    """The spec's output in `root`, its test file holding only the cases named `prefix...`;
    the rules directory and the number of cases kept."""
    write_outputs(root, build_outputs(spec, "spec.yaml"))
    directory = root / RULES_DIR
    tests_file = directory / TEST_FILE
    tests = yaml.safe_load(tests_file.read_text())
    tests["tests"] = [t for t in tests["tests"] if t["name"].startswith(prefix)]
    tests_file.write_text(yaml.safe_dump(tests))
    return directory, len(tests["tests"])


def run_family_cases(directory: Path) -> RuleTestResult:
    """promtool's verdict on the cases `write_family_cases` kept."""
    return run_rule_tests(directory, TEST_FILE)


def run_with_broken_rule(directory: Path, original: str, broken: str) -> RuleTestResult:
    """The cases run on the rule file with its first `original` replaced by `broken`."""
    rules = directory / RULE_FILE
    text = rules.read_text()
    assert original in text, f"mutation target {original!r} not in the rules"
    rules.write_text(text.replace(original, broken, 1))
    return run_rule_tests(directory, TEST_FILE)
