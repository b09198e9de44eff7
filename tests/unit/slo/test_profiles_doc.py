"""docs/spec-and-rules.md prints every source profile as `render_profiles_markdown` renders it."""

from __future__ import annotations

from pathlib import Path

from redline.slo.sources import PROFILE_NAMES, render_profiles_markdown

ROOT = Path(__file__).resolve().parents[3]


def test_the_profiles_tables_name_every_profile_once_per_table() -> None:
    text = render_profiles_markdown()
    for name in PROFILE_NAMES:
        assert text.count(f"| `{name}` |") == 3, name
        assert f"- `{name}`: " in text


def test_spec_and_rules_doc_prints_the_profiles() -> None:
    doc = (ROOT / "docs/spec-and-rules.md").read_text()
    table = doc.split("<!-- profiles:start -->\n", 1)[1].split("<!-- profiles:end -->", 1)[0]
    assert table == render_profiles_markdown(), (
        "docs/spec-and-rules.md's source profiles are stale: replace the text between the "
        "profiles markers with the output of `python -m redline.slo.sources`"
    )
