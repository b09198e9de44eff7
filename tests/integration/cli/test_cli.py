"""The `redline` console script: exit codes and messages of validate, generate and check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from redline.generate.outputs import TEST_FILE
from redline.slo import catalog

REDLINE = shutil.which("redline") or str(Path(sys.executable).with_name("redline"))


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REDLINE, *args], capture_output=True, text=True, cwd=cwd, check=False)


def test_every_command_has_help() -> None:
    top = run("--help")
    assert top.returncode == 0
    for command in ("validate", "generate", "check", "demo"):
        assert command in top.stdout
        result = run(command, "--help")
        assert result.returncode == 0, command
        assert "Usage" in result.stdout


def test_validate_default_spec_exits_0_and_prints_the_warning() -> None:
    result = run("validate")
    assert result.returncode == 0
    assert "ok: spec v1 for genai-chat" in result.stdout
    assert "rpo.lora_adapter.checkpoint_interval_seconds: warning:" in result.stderr


HEAD = "version: v1\nservice: x\nregions: [a]\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (HEAD + "colour: red\n", "bad.yaml: colour: unknown field"),
        (HEAD + "rollback: {playbook: nope}\n", "bad.yaml: rollback.playbook: Input should be"),
        (HEAD + "rollback: {min_samples: -1}\n", "bad.yaml: rollback.min_samples: Input should be"),
        ("version: v1\nservice: [\n", "bad.yaml: line 3, column 1: malformed YAML"),
    ],
)
def test_validate_bad_spec_exits_2_with_one_line_per_problem(
    tmp_path: Path, content: str, expected: str
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(content)
    result = run("validate", str(spec))
    assert result.returncode == 2
    assert any(line.startswith(f"{tmp_path}/{expected}") for line in result.stderr.splitlines()), (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_validate_missing_file_exits_2(tmp_path: Path) -> None:
    result = run("validate", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"{tmp_path}/absent.yaml: (file): no such file"


def test_generate_then_check_is_clean_and_detects_edits(tmp_path: Path) -> None:
    assert run("generate", "--out", str(tmp_path)).returncode == 0
    clean = run("generate", "--out", str(tmp_path), "--check")
    assert clean.returncode == 0, clean.stderr
    rules = tmp_path / "rules/generated/redline.rules.yml"
    rules.write_text(rules.read_text().replace("> 12", "> 13"))
    dirty = run("generate", "--out", str(tmp_path), "--check")
    assert dirty.returncode == 1
    assert "rules/generated/redline.rules.yml: differs from the spec" in dirty.stderr
    staleness = catalog.VECTORDB_INDEX_STALENESS_SECONDS
    assert f"-    expr: max by (collection, replica) ({staleness}) > 13" in dirty.stderr


def test_generate_with_unknown_profile_exits_2(tmp_path: Path) -> None:
    result = run("generate", "--out", str(tmp_path), "--profile", "prod")
    assert result.returncode == 2
    assert "unknown profile 'prod'; allowed: local" in result.stderr


def test_check_runs_the_real_tools(tmp_path: Path) -> None:
    assert run("generate", "--out", str(tmp_path)).returncode == 0
    rules = tmp_path / "rules/generated"
    # A few cases are enough to show the command runs promtool (the whole file takes a minute
    # and is run by tests/integration/rules/test_promtool.py).
    tests_file = rules / TEST_FILE
    cases = yaml.safe_load(tests_file.read_text("utf-8"))
    cases["tests"] = cases["tests"][:3]
    tests_file.write_text(yaml.safe_dump(cases, sort_keys=False), "utf-8")
    result = run("check", "--dir", str(rules))
    assert result.returncode == 0, result.stdout
    assert "promtool test rules: ok" in result.stdout
    assert "amtool check-config: ok" in result.stdout


def test_dashboards_check_bad_input_is_clear(tmp_path: Path) -> None:
    missing = run("dashboards", "check", "--prometheus", "http://127.0.0.1:9", "--dir",
                  str(tmp_path / "nope"))  # fmt: skip
    assert missing.returncode == 2 and "not a directory of dashboard JSON" in missing.stderr
    (tmp_path / "broken.json").write_text("{", "utf-8")
    broken = run("dashboards", "check", "--prometheus", "http://127.0.0.1:9", "--dir",
                 str(tmp_path))  # fmt: skip
    assert broken.returncode == 2 and "broken.json: not readable JSON" in broken.stderr
    (tmp_path / "broken.json").write_text('{"title": "x"}', "utf-8")
    shapeless = run("dashboards", "check", "--prometheus", "http://127.0.0.1:9", "--dir",
                    str(tmp_path))  # fmt: skip
    assert shapeless.returncode == 2 and "broken.json: panels:" in shapeless.stderr
    profile = run("dashboards", "check", "--prometheus", "http://127.0.0.1:9",
                  "--profile", "nope")  # fmt: skip
    assert profile.returncode == 2 and "unknown profile 'nope'" in profile.stderr


def test_dashboards_check_without_prometheus_exits_3() -> None:
    from redline.devstack.processes import free_port

    result = run("dashboards", "check", "--prometheus", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 3 and "Prometheus unreachable" in result.stderr
