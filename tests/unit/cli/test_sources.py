"""`redline sources`: each profile's signals, label mapping and gaps, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from redline.cli import sources as sources_cli
from redline.cli.main import app
from redline.slo.sources import PROFILE_NAMES, PROFILES


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide enough that no cell wraps, so the names read whole: the CLI's console is created at
    import, when COLUMNS may not be set yet (another test imported it first)."""
    monkeypatch.setattr(sources_cli, "out", Console(width=400, soft_wrap=True, highlight=False))


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sources", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_a_profile_lists_its_series_labels_and_gaps(name: str) -> None:
    code, output = _run(name)
    assert code == 0, output
    profile = PROFILES[name]
    assert f"{name}: {profile.title}" in output
    for found in profile.series.values():
        for series_name in found.names:
            assert found.selector(series_name) in output
    for reason in profile.missing.values():
        assert reason in output
    if profile.mirrored:
        assert output.count("-> mapped onto the catalog's labels") == len(profile.series)
        for label, engine in profile.labels.items():
            assert f"{label} <- {engine}" in output
    else:
        assert "as it is" in output
        assert "not available: nothing" in output


def test_every_profile_without_an_argument() -> None:
    code, output = _run()
    assert code == 0
    assert all(f"{name}: " in output for name in PROFILE_NAMES)


def test_tgi_says_what_it_lacks() -> None:
    _, output = _run("tgi")
    assert "not available: TGI publishes no time-to-first-token histogram" in output
    assert "model = '<sources.model>' (constant)" in output


def test_a_spec_shows_its_overrides(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "version: v1\nservice: chat\nregions: [a]\n"
        "sources:\n  profile: vllm\n  labels: {region: cluster}\n"
    )
    code, output = _run("--spec", str(spec))
    assert code == 0, output
    assert "region <- cluster" in output


def test_an_unknown_profile_names_the_allowed_ones() -> None:
    code, output = _run("nope")
    assert code == 2
    assert "unknown profile 'nope'; allowed: " + ", ".join(PROFILE_NAMES) in output
