"""The top-level CLI loads command modules lazily, and each registers what it is listed with."""

from __future__ import annotations

import subprocess
import sys

import pytest

from redline.cli.lazy import LAZY_MODULES, load_module_commands


@pytest.mark.parametrize("module", sorted(LAZY_MODULES))
def test_each_module_registers_exactly_its_listed_commands(module: str) -> None:
    assert set(load_module_commands(module)) == set(LAZY_MODULES[module])


def test_spec_commands_do_not_import_the_heavy_modules() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from redline.cli import app\n"
        "result = CliRunner().invoke(app, ['validate'])\n"
        "assert result.exit_code == 0, result.output\n"
        "heavy = ('pymilvus', 'fastapi', 'redline.cli.index')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
