"""The committed generated files are exactly what `redline generate` makes of the default spec."""

from __future__ import annotations

from pathlib import Path

from redline.generate.outputs import RULES_DIR, build_outputs, diff_outputs
from redline.rules.render import HEADER
from redline.slo.load import load_spec

ROOT = Path(__file__).resolve().parents[3]


def test_committed_files_match_the_default_spec() -> None:
    outputs = build_outputs(load_spec().spec, "slo/specs/default.yaml")
    diffs = diff_outputs(ROOT, outputs)
    assert not diffs, "run `redline generate`:\n" + "\n".join(diffs.values())


def test_generated_files_carry_the_header_and_no_timestamp() -> None:
    for path in sorted((ROOT / RULES_DIR).glob("*.y*ml")):
        text = path.read_text("utf-8")
        assert text.startswith(HEADER), path
        assert "2026-" not in text and "redline 0." not in text, path


def test_a_changed_spec_changes_the_output() -> None:
    spec = load_spec().spec
    changed = spec.model_copy(
        update={"rollback": spec.rollback.model_copy(update={"min_samples": 5000})}
    )
    diffs = diff_outputs(ROOT, build_outputs(changed, "slo/specs/default.yaml"))
    assert RULES_DIR / "redline.rules.yml" in diffs
    assert ">= 5000" in diffs[RULES_DIR / "redline.rules.yml"]
