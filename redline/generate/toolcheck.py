"""Run promtool and amtool over generated files and report each check's outcome."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from redline.generate.outputs import ALERTMANAGER_FILE, RULE_FILE, TEST_FILE


@dataclass(frozen=True)
class CheckResult:
    """One tool run: what ran, whether it passed, and what it printed."""

    name: str
    command: tuple[str, ...]
    ok: bool
    output: str


class ToolMissingError(Exception):
    """promtool or amtool is not installed."""


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolMissingError(
            f"{name} not found on PATH; install it with: "
            f"apt-get update && apt-get install -y {package}"
        )
    return path


def run_checks(directory: Path) -> list[CheckResult]:
    """promtool check rules, promtool test rules and amtool check-config on `directory`."""
    promtool = _tool("promtool", "prometheus")
    amtool = _tool("amtool", "prometheus-alertmanager")
    commands = [
        ("promtool check rules", (promtool, "check", "rules", RULE_FILE)),
        ("promtool test rules", (promtool, "test", "rules", TEST_FILE)),
        ("amtool check-config", (amtool, "check-config", ALERTMANAGER_FILE)),
    ]
    results = []
    for name, command in commands:
        proc = subprocess.run(
            command, cwd=directory, capture_output=True, text=True, timeout=120, check=False
        )
        results.append(
            CheckResult(name, command, proc.returncode == 0, (proc.stdout + proc.stderr).strip())
        )
    return results
