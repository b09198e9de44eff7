"""`redline report --gamedays`: a day of sample series in a real Prometheus and two game-day
files, one in the period: the Game days section in every format, the other run left out."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from redline.devstack.samples.report import backfill, build_sample, ts, write_openmetrics
from tests.support.report import sample_prometheus

pytestmark = pytest.mark.integration


def _gameday(drill: str, fault_at: int) -> list[dict[str, object]]:
    """A `gameday.json` as `redline gameday run --out` writes it."""
    return [
        {
            "drill": drill,
            "experiment": {"kind": "NetworkChaos", "namespace": "redline", "name": drill},
            "expects": "RedLineLatencyP99",
            "fault_at": fault_at + 0.5,
            "ended_at": fault_at + 400.0,
            "detect_seconds": 31.5,
            "alertmanager_seconds": 33.0,
            "notify_seconds": 34.0,
            "playbook_start_seconds": 35.0,
            "remediate_seconds": 80.0,
            "rto_seconds": 95.0,
            "rpo_seconds": None,
            "failed_requests": 12.0,
            "red_lines_fired": {"RedLineLatencyP99": 31.5},
            "worst_error_ratio": 0.01,
            "job_id": "job-1",
            "budgets": {"detect_seconds": 120.0, "rto_seconds": 420.0, "rpo_seconds": None},
            "aborted": None,
            "error": None,
            "problems": [],
            "verdict": "pass",
        }
    ]


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "redline.cli", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_report_carries_the_period_s_game_days_in_every_format(tmp_path: Path) -> None:
    backfill(write_openmetrics(build_sample(days=1), tmp_path / "day.om"), tmp_path / "blocks")
    runs = tmp_path / "gamedays"
    for name, drill, at in (("in", "latency", "2025-03-01T10:00"), ("out", "partition",
                            "2025-02-20T10:00")):  # fmt: skip
        (runs / name).mkdir(parents=True)
        (runs / name / "gameday.json").write_text(json.dumps(_gameday(drill, ts(at))))
    out = tmp_path / "report"
    with sample_prometheus(tmp_path / "blocks", tmp_path / "prom") as service:
        period = ("--prometheus", service.url, "--from", "2025-03-01", "--to", "2025-03-02")
        done = _report(*period, "--format", "md,html,csv,json", "--out", str(out),
                       "--gamedays", str(runs))  # fmt: skip
        bad = runs / "in" / "gameday.json"
        bad.write_text(json.dumps([{**_gameday("latency", 0)[0], "budgets": "none"}]))
        refused = _report(*period, "--out", str(tmp_path / "no"), "--gamedays", str(bad))
    assert done.returncode == 0, done.stderr
    assert "1 game day(s)" in done.stdout
    markdown = (out / "slo-report.md").read_text()
    assert "| latency (NetworkChaos) | 95.0 s | n/a | 12 | pass |" in markdown
    assert "2025-03-01 10:00 UTC" in markdown and "partition (" not in markdown
    page = (out / "slo-report.html").read_text()
    assert '<section id="gamedays">' in page and "<td>latency (NetworkChaos)</td>" in page
    with (out / "csv" / "gamedays.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["drill"], r["fault_at"], r["rto_seconds"]) for r in rows] == [
        ("latency", "2025-03-01T10:00:00Z", "95.0")
    ]
    data = json.loads((out / "slo-report.json").read_text())
    assert [(g["drill"], g["verdict"]) for g in data["gamedays"]] == [("latency", "pass")]
    # A malformed file stops the report before Prometheus is read, naming the file and field.
    assert refused.returncode == 2
    assert f"{bad}: [0].budgets: " in refused.stderr and "Traceback" not in refused.stderr
