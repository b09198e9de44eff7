"""Run promtool and amtool over generated files and report each check's outcome.

The rule unit tests run batched (`redline.generate.promtool`): each test group against only the
rules it reads, which is what makes them seconds instead of minutes on a small machine.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from redline.generate.outputs import ALERTMANAGER_FILE, RULE_FILE, TEST_FILE
from redline.generate.promtool import ToolMissingError, find_tool, run_rule_tests


@dataclass(frozen=True)
class CheckResult:
    """One tool run: what ran, whether it passed, and what it printed."""

    name: str
    command: tuple[str, ...]
    ok: bool
    output: str


def run_checks(directory: Path) -> list[CheckResult]:
    """promtool check rules, promtool test rules (batched), amtool check-config on `directory`."""
    promtool = find_tool("promtool", "prometheus")
    amtool = find_tool("amtool", "prometheus-alertmanager")
    results = [_run("promtool check rules", (promtool, "check", "rules", RULE_FILE), directory)]
    tested = run_rule_tests(directory, TEST_FILE)
    command = (promtool, "test", "rules", TEST_FILE)
    results.append(CheckResult("promtool test rules", command, tested.ok, tested.output))
    results.append(
        _run("amtool check-config", (amtool, "check-config", ALERTMANAGER_FILE), directory)
    )
    return results


def _run(name: str, command: tuple[str, ...], directory: Path) -> CheckResult:
    # No wall-clock timeout: each check is finite and its time depends on the machine's load.
    proc = subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False)
    return CheckResult(name, command, proc.returncode == 0, (proc.stdout + proc.stderr).strip())


__all__ = ["CheckResult", "ToolMissingError", "run_checks"]
