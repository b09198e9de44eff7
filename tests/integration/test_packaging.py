"""A built wheel installs every package under `redline.*` and works from outside the repo."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import redline, redline.slo.load as load, redline.rules.build as build, redline.remediation.app
import redline.exporters.app, redline.dashboards, redline.devstack.processes
assert redline.__file__.startswith(TARGET), redline.__file__
spec = load.load_spec().spec            # the embedded default travels in the wheel
assert build.build_rule_groups(spec)
print("ok", redline.__file__)
"""


def packages_on_disk() -> set[str]:
    """Every `redline.*` package in the source tree, through setuptools' package-dir mapping."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    found = set()
    for package, directory in config["tool"]["setuptools"]["package-dir"].items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join((package, *relative.parts)))
    return found


def test_wheel_imports_cleanly_outside_the_repo(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("redline-*.whl")
    packed = {
        str(Path(name).parent).replace("/", ".")
        for name in zipfile.ZipFile(wheel).namelist()
        if name.endswith("/__init__.py")
    }
    missing = packages_on_disk() - packed
    assert not missing, f"not in the wheel (add to [tool.setuptools] packages): {sorted(missing)}"
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    for top in ("slo", "rules", "exporters", "remediation", "dashboards"):
        assert not (target / top).exists(), f"{top} installed as a top-level package"
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", f"TARGET = {str(target)!r}\n{CHECK}"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")


def test_editable_install_imports_outside_the_repo(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"TARGET = {str(ROOT)!r}\n{CHECK}"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
