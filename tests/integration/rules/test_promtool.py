"""The generated rules, tests and configs against the real promtool, amtool, Prometheus and
Alertmanager binaries."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from redline.devstack.processes import start_alertmanager, start_prometheus
from redline.generate.outputs import (
    ALERTMANAGER_FILE,
    PROMETHEUS_RULE_FILE,
    RULE_FILE,
    RULES_DIR,
    TEST_FILE,
    build_outputs,
    write_outputs,
)
from redline.generate.promtool import RuleTestResult, run_rule_tests
from redline.generate.toolcheck import run_checks
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import ErrorsSli, Slo, SlowRequestsSli, Spec

pytestmark = pytest.mark.integration


def _generate(spec: Spec, root: Path) -> Path:
    write_outputs(root, build_outputs(spec, "spec.yaml"))
    return root / RULES_DIR


def _promtool_test(directory: Path) -> RuleTestResult:
    return run_rule_tests(directory, TEST_FILE)


def test_default_output_passes_every_check(tmp_path: Path) -> None:
    directory = _generate(load_spec().spec, tmp_path)
    results = run_checks(directory)
    assert [r.name for r in results] == [
        "promtool check rules",
        "promtool test rules",
        "amtool check-config",
    ]
    for result in results:
        assert result.ok, result.output


def test_local_profile_output_passes_every_check(tmp_path: Path) -> None:
    directory = _generate(apply_profile(load_spec().spec, "local"), tmp_path)
    assert all(r.ok for r in run_checks(directory))


@pytest.mark.parametrize(
    ("original", "broken", "failing_case"),
    [
        # drop the min_samples leg of the gate: the under-min_samples case must now fail
        (">= 2000", ">= 0", "both signals under min_samples"),
        # compare accuracy with >= instead of >: the exact-boundary case must now fail
        ("> 0.008 + 1e-09", "> 0.008 - 1e-09", "accuracy down exactly"),
        # make the gate a single signal
        (
            "and on (model, model_version)\n      (\n        max by",
            "or on (model, model_version)\n      (\n        max by",
            "latency up alone",
        ),
        # no minimum-traffic guard on the burn-rate alerts
        (
            f'{catalog.slo_events_record("1h")}{{slo="latency"}} >= 100',
            f'{catalog.slo_events_record("1h")}{{slo="latency"}} >= 0',
            "fewer than min_events",
        ),
        # no minimum number of accuracy verdicts
        (
            f"{catalog.eval_verdicts_record('5m')} >= 100",
            f"{catalog.eval_verdicts_record('5m')} >= 0",
            "under min_eval_samples verdicts",
        ),
        # the accuracy leg on the point value instead of the Wilson bound
        (
            f"on (model, model_version) {catalog.accuracy_upper_bound_record('5m')}",
            f"on (model, model_version) {catalog.accuracy_record('5m')}",
            "one wrong answer out of 120",
        ),
        # a `for` on the burn-rate page: it no longer fires at the outage's first evaluation
        (
            "  - alert: AvailabilityErrorBudgetBurn\n    expr:",
            "  - alert: AvailabilityErrorBudgetBurn\n    for: 2m\n    expr:",
            "availability SLO: an outage pages and tickets at the first evaluation",
        ),
        # the latency red line at the wrong threshold
        ("p99_5m > 0.8", "p99_5m > 1.5", "latency red line"),
        # the staleness red line inclusive of the boundary
        (
            f"{catalog.VECTORDB_INDEX_STALENESS_SECONDS}) > 12",
            f"{catalog.VECTORDB_INDEX_STALENESS_SECONDS}) >= 12",
            "index staleness",
        ),
    ],
)
def test_the_promtool_tests_catch_a_broken_rule(
    tmp_path: Path, original: str, broken: str, failing_case: str
) -> None:
    directory = _generate(load_spec().spec, tmp_path)
    rules = directory / RULE_FILE
    text = rules.read_text()
    assert original in text, f"mutation target {original!r} not in the rules"
    rules.write_text(text.replace(original, broken, 1))
    # Run only the cases about the mutated rule: the whole file takes seconds per run.
    tests_file = directory / TEST_FILE
    tests = yaml.safe_load(tests_file.read_text())
    tests["tests"] = [t for t in tests["tests"] if failing_case in t["name"]]
    assert tests["tests"], f"no promtool case is named {failing_case!r}"
    tests_file.write_text(yaml.safe_dump(tests))
    result = _promtool_test(directory)
    assert not result.ok
    assert failing_case in result.output


def test_a_spec_with_200_slos_generates_valid_rules(tmp_path: Path) -> None:
    base = load_spec().spec
    slos = tuple(
        Slo(
            name=f"tenant_{i}",
            objective=0.99 if i % 2 else 0.999,
            sli=SlowRequestsSli(threshold_seconds=0.8, selector={"model": f"m{i}"})
            if i % 2
            else ErrorsSli(selector={"model": f"m{i}"}),
        )
        for i in range(200)
    )
    directory = _generate(base.model_copy(update={"slos": slos}), tmp_path)
    check = subprocess.run(
        ["promtool", "check", "rules", RULE_FILE], cwd=directory, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    written = yaml.safe_load((directory / RULE_FILE).read_text())["groups"]
    count = sum(len(group["rules"]) for group in written)
    assert count > 3000
    assert f"SUCCESS: {count} rules found" in check.stdout  # thousands of rules, every one parsed


def test_prometheus_rule_groups_are_valid_rule_groups(tmp_path: Path) -> None:
    directory = _generate(load_spec().spec, tmp_path)
    manifest = yaml.safe_load((directory / PROMETHEUS_RULE_FILE).read_text())
    extracted = tmp_path / "from-manifest.yml"
    extracted.write_text(yaml.safe_dump({"groups": manifest["spec"]["groups"]}))
    check = subprocess.run(["promtool", "check", "rules", str(extracted)], capture_output=True)
    assert check.returncode == 0, check.stdout


def test_real_prometheus_loads_the_rules_and_real_alertmanager_the_config(tmp_path: Path) -> None:
    directory = _generate(apply_profile(load_spec().spec, "local"), tmp_path)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(directory / RULE_FILE)],
            }
        )
    )
    prometheus = start_prometheus(tmp_path / "prom", config)
    alertmanager = start_alertmanager(tmp_path / "am", directory / ALERTMANAGER_FILE)
    try:
        groups = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        assert len(rules) == len(
            [
                r
                for g in yaml.safe_load((directory / RULE_FILE).read_text())["groups"]
                for r in g["rules"]
            ]
        )
        assert all(rule["health"] in {"ok", "unknown"} for rule in rules)
        status = httpx.get(f"{alertmanager.url}/api/v2/status", timeout=5).json()
        assert "redline-remediation" in status["config"]["original"]
    finally:
        prometheus.stop()
        alertmanager.stop()


def test_check_reports_missing_binaries(tmp_path: Path) -> None:
    directory = _generate(load_spec().spec, tmp_path)
    redline = shutil.which("redline") or str(Path(__file__).parents[3] / ".venv/bin/redline")
    result = subprocess.run(
        [redline, "check", "--dir", str(directory)],
        capture_output=True,
        text=True,
        env={"PATH": str(Path(redline).parent)},
    )
    assert result.returncode == 3
    assert (
        "promtool not found on PATH; install it with: apt-get update && apt-get install -y "
        "prometheus" in result.stderr
    )
