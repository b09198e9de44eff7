"""`redline sources`: each profile's signals, label mapping and gaps, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from rich.console import Console
from typer.testing import CliRunner

from redline.cli import sources as sources_cli
from redline.cli.main import app
from redline.devstack.fakes.engines import EngineMetrics
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


def _page(profile: str, buckets: tuple[float, ...] | None = None) -> str:
    """A fake engine's exposition; with `buckets`, vLLM's latency histogram rebucketed."""
    engine = EngineMetrics(profile)
    engine.observe(0.4, count=5)
    text = engine.render().decode()
    if buckets is None:
        return text
    registry = CollectorRegistry()
    Histogram(
        "vllm:e2e_request_latency_seconds", "e2e", ["model_name"], buckets=buckets,
        registry=registry,
    ).labels(model_name="chat").observe(0.4)  # fmt: skip
    kept = [line for line in text.splitlines() if "vllm:e2e_request_latency" not in line]
    return "\n".join(kept) + "\n" + generate_latest(registry).decode()


def test_detect_prints_the_engine_and_the_block_to_paste(tmp_path: Path) -> None:
    page = tmp_path / "tgi.prom"
    page.write_text(_page("tgi"))
    code, output = _run("detect", "--file", str(page))
    assert code == 0, output
    assert f"{page}: {PROFILES['tgi'].title} (profile tgi, by tgi_request_duration)" in output
    assert "(the tgi profile's own)" in output
    block = yaml.safe_load(output.split("# paste into the spec:\n", 1)[1])
    assert block == {"sources": {"profile": "tgi", "model": "<the model this engine serves>"}}


def _spec_on(profile: str) -> str:
    """The smallest spec reading `profile`'s series."""
    return f"version: v1\nservice: chat\nregions: [primary]\nsources:\n  profile: {profile}\n"


def test_detect_checks_a_spec_against_the_served_buckets(tmp_path: Path) -> None:
    page = tmp_path / "vllm.prom"
    page.write_text(_page("vllm", (0.25, 0.5, 1.0, 4.0)))
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec_on("vllm"))
    code, output = _run("detect", "--file", str(page), "--spec", str(spec))
    assert code == 2, output
    assert yaml.safe_load(
        output.split("# paste into the spec:\n", 1)[1].split("\n" + str(spec))[0]
    )["sources"]["histogram_buckets"] == [0.25, 0.5, 1.0, 4.0]
    assert "error: sources.histogram_buckets: the engine serves 0.25, 0.5, 1, 4" in output
    # The red line's 0.8 s is no served bucket: counted at 0.5 s, said so.
    assert "0.8 s is not a bucket" in output
    spec.write_text(_spec_on("sglang"))
    code, output = _run("detect", "--file", str(page), "--spec", str(spec))
    assert code == 2 and "sources.profile is 'sglang', the engine is 'vllm'" in output


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ("garbage here\n", 4, "not a Prometheus exposition"),
        ("# TYPE x counter\nx_total 1\n", 5, "no known engine"),
    ],
)
def test_detect_bad_input_has_its_own_exit_code(
    tmp_path: Path, body: str, code: int, message: str
) -> None:
    page = tmp_path / "page.txt"
    page.write_text(body)
    got, output = _run("detect", "--file", str(page))
    assert got == code and f"{page}: {message}" in output


def test_detect_needs_exactly_one_source(tmp_path: Path) -> None:
    code, output = _run("detect")
    assert code == 2 and "give one of --metrics-url URL and --file F" in output
    code, output = _run("detect", "--file", str(tmp_path / "absent.prom"))
    assert code == 2 and "absent.prom: cannot be read" in output
    code, output = _run("vllm", "--file", str(tmp_path / "x"))
    assert code == 2 and "go with `redline sources detect`" in output
