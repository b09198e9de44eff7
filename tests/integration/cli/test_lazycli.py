"""`redline validate` in a fresh interpreter imports none of the heavy command modules."""

from __future__ import annotations

import subprocess
import sys


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
