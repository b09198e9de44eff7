"""Every source profile's generated rules and promtool cases against the real promtool: the cases
write each engine's own raw series (names, labels, matchers satisfied) and the registry's
`model_active_info`, so the mirror, the label mapping and the version join are proven end to end.
And `redline validate` on each example spec prints what its profile cannot provide."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from redline.generate.outputs import RULE_FILE, RULES_DIR, TEST_FILE, build_outputs, write_outputs
from redline.generate.promtool import run_rule_tests
from redline.generate.toolcheck import run_checks
from redline.slo.load import load_spec
from redline.slo.sources import PROFILE_NAMES, PROFILES
from redline.slo.spec import Sources, Spec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "slo" / "specs" / "examples"
ENGINE_PROFILES = [name for name in PROFILE_NAMES if name != "redline-gateway"]


def profile_spec(profile: str) -> Spec:
    """The default spec with its sources replaced by `profile` (TGI's series name no model)."""
    sources = Sources(profile=profile, model="chat" if profile == "tgi" else None)  # type: ignore[arg-type]
    return load_spec().spec.model_copy(update={"sources": sources})


def _generate(spec: Spec, root: Path) -> Path:
    write_outputs(root, build_outputs(spec, "spec.yaml"))
    return root / RULES_DIR


# The redline-gateway profile's rules and cases are the default spec's, which
# tests/integration/rules/test_promtool.py runs through promtool already.
@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_every_engine_profile_passes_promtool(tmp_path: Path, profile: str) -> None:
    directory = _generate(profile_spec(profile), tmp_path)
    results = {result.name: result for result in run_checks(directory)}
    for name in ("promtool check rules", "promtool test rules"):
        assert results[name].ok, results[name].output
    tests = yaml.safe_load((directory / TEST_FILE).read_text())["tests"]
    inputs = " ".join(s["series"] for case in tests for s in case["input_series"])
    # The cases fed the engine's own series, not the catalog's.
    for name in PROFILES[profile].series["request_duration"].names:
        assert f"{name}_bucket{{" in inputs


@pytest.mark.parametrize(
    ("profile", "original", "broken"),
    [
        # the model read from the wrong engine label: the version join finds no active version
        ("vllm", '"model", "$1", "model_name", "(.*)"', '"model", "$1", "served_model", "(.*)"'),
        # another constant model than the registry's
        ("tgi", '"model", "chat", "", ""', '"model", "other", "", ""'),
    ],
)
def test_a_broken_mapping_fails_the_profile_cases(
    tmp_path: Path, profile: str, original: str, broken: str
) -> None:
    """The per-profile cases can fail: a wrong model mapping breaks the raw-series gate case."""
    directory = _generate(profile_spec(profile), tmp_path)
    rules = directory / RULE_FILE
    text = rules.read_text()
    assert original in text
    rules.write_text(text.replace(original, broken))
    tests_file = directory / TEST_FILE
    tests = yaml.safe_load(tests_file.read_text())
    failing = "raw series of a regressed version fire"
    tests["tests"] = [t for t in tests["tests"] if failing in t["name"]]
    assert tests["tests"]
    tests_file.write_text(yaml.safe_dump(tests))
    result = run_rule_tests(directory, TEST_FILE)
    assert not result.ok
    assert failing in result.output


EXPECTED_WARNINGS = {
    "vllm": ["red_lines.latency_p99.includes_reroute", "sources.profile"],
    "sglang": ["red_lines.latency_p99.includes_reroute"],
    "tgi": [
        "red_lines.latency_p99.threshold_seconds",
        "slos[0].sli.threshold_seconds: warning: 0.8 s is not a bucket",
        "requests over 0.748183 s count as slow",
        "sources.series.time_to_first_token: warning: not available from tgi",
        "red_lines.latency_p99.includes_reroute",
    ],
    "nim": ["red_lines.latency_p99.includes_reroute", "sources.profile"],
    "otel-genai": [
        "slos[0].sli.threshold_seconds: warning: 0.8 s is not a bucket",
        "requests over 0.64 s count as slow",
        "red_lines.latency_p99.includes_reroute",
    ],
}


@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_validate_prints_what_an_example_profile_cannot_provide(profile: str) -> None:
    redline = shutil.which("redline") or str(ROOT / ".venv/bin/redline")
    spec = EXAMPLES / f"{profile}.yaml"
    result = subprocess.run(
        [redline, "validate", str(spec)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert f"{spec}: ok: spec v1" in result.stdout
    for expected in EXPECTED_WARNINGS[profile]:
        assert expected in result.stderr, result.stderr
    assert "P99 including reroute needs redline's gateway" in result.stderr
