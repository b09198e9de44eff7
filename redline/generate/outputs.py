"""`redline generate`: every generated file of a spec, written or compared with what is on disk."""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path

from redline.dashboards.render import build_dashboard_outputs
from redline.generate.kube_redis import build_redis_sentinel_outputs
from redline.generate.kubernetes import build_kubernetes_outputs
from redline.rules.alertmanager import build_alertmanager_config, build_prometheus_rule
from redline.rules.build import build_rule_groups, build_rule_tests
from redline.rules.render import render_rule_file, render_yaml
from redline.slo.spec import Spec

RULES_DIR = Path("rules/generated")
RULE_FILE = "redline.rules.yml"
TEST_FILE = "redline.rules.test.yml"
ALERTMANAGER_FILE = "alertmanager.yml"
PROMETHEUS_RULE_FILE = "prometheusrule.yaml"


def build_outputs(spec: Spec, source: str) -> dict[Path, str]:
    """Every generated file (path relative to the repo root) and its text."""
    groups = build_rule_groups(spec)
    return {
        RULES_DIR / RULE_FILE: render_rule_file(groups, source),
        RULES_DIR / TEST_FILE: render_yaml(build_rule_tests(spec, groups, [RULE_FILE]), source),
        RULES_DIR / ALERTMANAGER_FILE: render_yaml(build_alertmanager_config(spec, groups), source),
        RULES_DIR / PROMETHEUS_RULE_FILE: render_yaml(build_prometheus_rule(spec, groups), source),
        **build_dashboard_outputs(spec, source),
        **build_kubernetes_outputs(spec, source),
        **build_redis_sentinel_outputs(source),
    }


def write_outputs(root: Path, outputs: dict[Path, str]) -> list[Path]:
    """Write each output atomically under `root`; return the paths whose content changed."""
    changed = []
    for relative, text in outputs.items():
        path = root / relative
        if path.exists() and path.read_text("utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        # mkstemp creates 0600; generated files are mounted read-only into containers whose
        # user is not the owner, so they must stay world-readable like any checked-out file.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        changed.append(relative)
    return changed


def diff_outputs(root: Path, outputs: dict[Path, str]) -> dict[Path, str]:
    """Unified diffs of the outputs that differ from the files under `root` (missing included)."""
    diffs = {}
    for relative, text in outputs.items():
        path = root / relative
        current = path.read_text("utf-8") if path.exists() else ""
        if current != text:
            diffs[relative] = "".join(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=f"{relative} (on disk)",
                    tofile=f"{relative} (generated)",
                )
            )
    return diffs
