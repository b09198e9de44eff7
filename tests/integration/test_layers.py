"""The layers contract of pyproject.toml ([tool.importlinter]) holds, and it sees every package.

import-linter reads the `redline` package from disk, and setuptools' package-dir puts
`redline.slo` in slo/ (and so on), so it runs over a tree of symlinks laid out as the installed
package, as `make lint-imports` does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lay_out_package(root: Path) -> Path:
    """Symlinks under `root` laid out as the installed `redline` package; `root/redline`."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    package = root / "redline"
    package.mkdir()
    for entry in (ROOT / "redline").iterdir():
        (package / entry.name).symlink_to(entry)
    for name, directory in config["tool"]["setuptools"]["package-dir"].items():
        if name != "redline":
            (root / name.replace(".", "/")).symlink_to(ROOT / directory)
    return package


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's contract over the tree at `root`."""
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_layers_contract_is_kept(tmp_path: Path) -> None:
    lay_out_package(tmp_path)
    result = lint_imports(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "redline layers KEPT" in result.stdout


def test_an_upward_import_in_a_package_dir_package_breaks_it(tmp_path: Path) -> None:
    package = lay_out_package(tmp_path)
    # slo/ lives outside redline/: a real directory of links to its files, plus one offender.
    slo = package / "slo"
    slo.unlink()
    slo.mkdir()
    for entry in (ROOT / "slo").iterdir():
        (slo / entry.name).symlink_to(entry)
    (slo / "offender.py").write_text('"""Imports upward."""\n\nimport redline.cli.main\n')
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "redline.slo is not allowed to import redline.cli" in result.stdout
    assert "redline.slo.offender -> redline.cli.main" in result.stdout
