"""promtool's rule unit tests, batched: each test group runs against only the rules it reads.

`promtool test rules` evaluates every rule of its rule files at every evaluation step of every
test group, so the cost of a test file grows with (groups x rules x steps): 60 groups over the
default spec's 78 rules took 33 s idle and over a minute beside other work, almost all of it
evaluating rules the group never looks at (a group over an empty rule file takes 0.1 s).

`plan_test_batches` gives each test group the rules it needs: the alerts it names, the series its
PromQL tests read, and every rule whose output those rules read, transitively. Groups needing the
same rules share a batch. Within a batch the rule groups keep their names, intervals and order,
and the rules keep their order, so each rule sees exactly the values it sees in the whole file:
Prometheus evaluates a group's rules in order and the groups in file order, and a rule's value
depends only on the series it reads. `run_rule_tests` writes each batch beside the original
files and runs the batches in parallel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_READS_EVERY_RULE = ("__name__", "ALERTS", "ALERTS_FOR_STATE")
"""Selectors that may read any rule's output: a rule or test using one gets every rule."""


class PromtoolError(Exception):
    """A rule or test file cannot be read."""


class ToolMissingError(Exception):
    """promtool or amtool is not installed."""


@dataclass(frozen=True)
class RuleRef:
    """One rule of the rule files: which file, group and position."""

    file: int
    group: int
    rule: int


@dataclass(frozen=True)
class TestBatch:
    """Test groups that need the same rules, and the rule file holding just those rules."""

    rules: Mapping[str, Any]
    """A rule file: the original groups, in order, each with only the needed rules."""
    tests: Sequence[Mapping[str, Any]]
    """The test groups, as in the test file."""

    @property
    def names(self) -> tuple[str, ...]:
        """The test groups' names."""
        return tuple(str(test.get("name", "")) for test in self.tests)


def _needed(
    rule_files: Sequence[Mapping[str, Any]],
    producers: Mapping[str, list[RuleRef]],
    every_rule: frozenset[RuleRef],
    test: Mapping[str, Any],
) -> frozenset[RuleRef]:
    """The rules a test group reads, transitively."""
    names: list[str] = [str(case["alertname"]) for case in test.get("alert_rule_test") or ()]
    exprs = [str(case["expr"]) for case in test.get("promql_expr_test") or ()]
    if any(marker in expr for expr in exprs for marker in _READS_EVERY_RULE):
        return every_rule
    for expr in exprs:
        names += _NAME.findall(expr)
    needed: set[RuleRef] = set()
    seen: set[str] = set()
    while names:
        name = names.pop()
        if name in seen:
            continue
        seen.add(name)
        for ref in producers.get(name, ()):
            if ref in needed:
                continue
            needed.add(ref)
            expr = str(rule_files[ref.file]["groups"][ref.group]["rules"][ref.rule]["expr"])
            if any(marker in expr for marker in _READS_EVERY_RULE):
                return every_rule
            names += _NAME.findall(expr)
    return frozenset(needed)


def _subset(rule_files: Sequence[Mapping[str, Any]], needed: Iterable[RuleRef]) -> dict[str, Any]:
    """One rule file with the needed rules of every file, in file, group and rule order."""
    wanted = set(needed)
    groups = []
    for f, rule_file in enumerate(rule_files):
        for g, group in enumerate(rule_file.get("groups") or ()):
            rules = [r for i, r in enumerate(group["rules"]) if RuleRef(f, g, i) in wanted]
            if rules:
                groups.append({**group, "rules": rules})
    return {"groups": groups}


def plan_test_batches(
    rule_files: Sequence[Mapping[str, Any]], test_file: Mapping[str, Any]
) -> list[TestBatch]:
    """Batches of `test_file`'s groups, each with only the rules of `rule_files` it reads."""
    producers: dict[str, list[RuleRef]] = {}
    for f, rule_file in enumerate(rule_files):
        for g, group in enumerate(rule_file.get("groups") or ()):
            for i, rule in enumerate(group["rules"]):
                name = rule.get("record") or rule.get("alert")
                producers.setdefault(str(name), []).append(RuleRef(f, g, i))
    every_rule = frozenset(ref for refs in producers.values() for ref in refs)
    batches: dict[frozenset[RuleRef], list[Mapping[str, Any]]] = {}
    for test in test_file.get("tests") or ():
        batches.setdefault(_needed(rule_files, producers, every_rule, test), []).append(test)
    return [TestBatch(_subset(rule_files, needed), tests) for needed, tests in batches.items()]


@dataclass(frozen=True)
class RuleTestResult:
    """The outcome of every batch: ok when all passed; promtool's output of the failed ones."""

    ok: bool
    output: str
    batches: int
    groups: int


def _load_yaml(path: Path) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PromtoolError(f"{path}: cannot read: {exc}") from None
    if not isinstance(data, Mapping):
        raise PromtoolError(f"{path}: not a YAML mapping")
    return data


def find_tool(name: str, package: str) -> str:
    """The path of `name` on PATH; ToolMissingError with the install command when missing."""
    path = shutil.which(name)
    if path is None:
        raise ToolMissingError(
            f"{name} not found on PATH; install it with: "
            f"apt-get update && apt-get install -y {package}"
        )
    return path


def run_rule_tests(directory: Path, test_file: str, jobs: int | None = None) -> RuleTestResult:
    """`promtool test rules test_file` in `directory`, as batches run `jobs` at a time.

    No wall-clock timeout: promtool's evaluation is finite and its time depends on the
    machine's load; the caller's own deadline (a test's timeout) bounds a hung run.
    """
    promtool = find_tool("promtool", "prometheus")
    tests = _load_yaml(directory / test_file)
    rule_files = [_load_yaml(directory / str(name)) for name in tests.get("rule_files") or ()]
    batches = plan_test_batches(rule_files, tests)
    with tempfile.TemporaryDirectory(prefix=".promtool-", dir=directory) as scratch:
        paths = []
        for index, batch in enumerate(batches):
            rules_path = Path(scratch) / f"rules-{index}.yml"
            rules_path.write_text(yaml.safe_dump(dict(batch.rules), sort_keys=False))
            test_path = Path(scratch) / f"tests-{index}.yml"
            content = {**tests, "rule_files": [rules_path.name], "tests": list(batch.tests)}
            test_path.write_text(yaml.safe_dump(content, sort_keys=False))
            paths.append(test_path)

        def run(path: Path) -> subprocess.CompletedProcess[str]:
            command = [promtool, "test", "rules", path.name]
            return subprocess.run(
                command, cwd=path.parent, capture_output=True, text=True, check=False
            )

        workers = max(1, min(jobs or os.cpu_count() or 1, len(paths) or 1))
        with ThreadPoolExecutor(workers) as pool:
            done = list(pool.map(run, paths))
    failed = [(p.stdout + p.stderr).strip() for p in done if p.returncode != 0]
    return RuleTestResult(
        ok=not failed,
        output="\n".join(failed) if failed else "SUCCESS",
        batches=len(batches),
        groups=sum(len(batch.tests) for batch in batches),
    )


__all__ = [
    "PromtoolError",
    "RuleTestResult",
    "TestBatch",
    "plan_test_batches",
    "ToolMissingError",
    "find_tool",
    "run_rule_tests",
]
