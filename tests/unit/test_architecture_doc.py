"""docs/architecture.md stays true: its tree names every module of the product."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slo", "rules", "dashboards", "exporters", "remediation", "redline")


def _tree() -> str:
    doc = (ROOT / "docs/architecture.md").read_text()
    return doc.split("<!-- tree:start -->\n", 1)[1].split("<!-- tree:end -->", 1)[0]


def test_the_tree_names_every_module_and_package() -> None:
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", _tree()))
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__init__.py":
                name = path.parent.name
            elif path.name == "__main__.py":
                continue
            else:
                name = path.stem
            if name not in words:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, "add these to the tree in docs/architecture.md:\n" + "\n".join(missing)


def test_the_readme_links_only_inside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)", readme)
    assert "docs/architecture.md" in targets
    for target in targets:
        assert not target.startswith(("..", "/")), target
        assert (ROOT / target).exists(), target
