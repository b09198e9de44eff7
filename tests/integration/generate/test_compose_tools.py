"""compose/docker-compose.yml against real programs: every redline command and option it runs
exists in the installed CLI, and Debian's `docker-compose config` accepts the file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from redline.cli import app
from tests.support.compose import COMPOSE_FILE, PROFILES, load_compose

REDLINE = str(Path(sys.executable).with_name("redline"))


def _redline_command(service: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The subcommand words and the long options of a redline service's command."""
    words, options = [], []
    for token in service["command"]:
        if token.startswith("--"):
            options.append(token.split("=", 1)[0])
        elif not options and not words[-1:] == ["--region"]:
            words.append(token)
    subcommand = [w for w in words if re.fullmatch(r"[a-z][a-z-]*", w)]
    return subcommand, options


def test_every_redline_command_and_option_exists_in_the_cli() -> None:
    # In one process, through the app the `redline` console script runs (its entry point is
    # tests/integration/cli's): a subprocess per service cost 2 s of imports each, minutes on a
    # busy machine.
    runner = CliRunner()
    checked = 0
    for name, service in load_compose()["services"].items():
        if not service["image"].startswith("redline:"):
            continue
        words, options = _redline_command(service)
        result = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
        assert result.exit_code == 0, f"{name}: redline {' '.join(words)}: {result.output}"
        for option in options:
            assert option in result.output, f"{name}: redline {' '.join(words)} has no {option}"
        checked += 1
    assert checked == 10  # every redline service, the demo ones included
    bogus = runner.invoke(app, ["no-such-command", "--help"])
    assert bogus.exit_code != 0


@pytest.mark.parametrize("profiles", [(), PROFILES])
def test_docker_compose_config_accepts_the_file(profiles: tuple[str, ...]) -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (apt-get install -y docker-compose)")
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    result = subprocess.run(
        [binary, "-f", str(COMPOSE_FILE), *flags, "config"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    # docker-compose 1.29 resolves every service whatever the profiles; compose v2 only the
    # active ones, so the check is that each resolved one is a service of the file.
    assert set(resolved["services"]) <= set(yaml.safe_load(COMPOSE_FILE.read_text())["services"])
    assert {"prometheus", "grafana", "thanos-query"} <= set(resolved["services"])
