"""`redline report schedule` as real processes: Redis job store, restarts, failures, retention."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from redline.devstack.processes import Service, free_port, start_prometheus
from redline.devstack.samples.report import backfill, build_sample, write_openmetrics
from redline.reporting.run import floor_hour
from redline.reporting.schedule import report_folders
from redline.slo import catalog
from tests.support.report import sample_prometheus

pytestmark = pytest.mark.integration

EVERY_2S = "*/2 * * * * *"


@pytest.fixture(scope="module")
def recent_blocks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two days of sample series ending at the current hour (the scheduled period is 1 day)."""
    root = tmp_path_factory.mktemp("recent")
    sample = build_sample(start=floor_hour(time.time()) - 2 * 86400, days=2)
    backfill(write_openmetrics(sample, root / "recent.om"), root / "blocks")
    return root / "blocks"


@pytest.fixture(scope="module")
def prometheus(recent_blocks: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with sample_prometheus(recent_blocks, tmp_path_factory.mktemp("prom")) as service:
        yield service


class Scheduler:
    """A `redline report schedule` process with its log and metrics port."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "redline.cli",
                    "report",
                    "schedule",
                    "--port",
                    str(self.port),
                    *args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def runs(self, outcome: str) -> float:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return 0.0
        runs = catalog.REDLINE_REPORT_RUNS_TOTAL
        found = re.search(rf'{runs}{{outcome="{outcome}",[^}}]*}} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


@pytest.fixture()
def schedulers(tmp_path: Path) -> Iterator[list[Scheduler]]:
    started: list[Scheduler] = []
    yield started
    for scheduler in started:
        scheduler.stop()


def _args(prometheus_url: str, out: Path, redis_url: str, name: str, keep: int = 2) -> list[str]:
    return [
        "--cron", EVERY_2S, "--prometheus", prometheus_url, "--period", "1d",
        "--format", "md,json", "--out", str(out), "--keep", str(keep),
        "--redis-url", redis_url, "--name", name, "--step", "60",
    ]  # fmt: skip


def test_publishes_dated_folders_keeps_n_and_survives_restarts_without_double_runs(
    prometheus: Service, redis_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    out = tmp_path / "reports"
    args = _args(prometheus.url, out, redis_url, "weekly")
    first = Scheduler(args, tmp_path / "a.log")
    schedulers.append(first)
    wait_for(lambda: first.runs("success") >= 3, timeout=45)
    folders = sorted(p.name for p in out.iterdir() if re.match(r"^\d{8}T\d{6}Z$", p.name))
    assert len(folders) == 2  # --keep 2
    index = (out / "index.html").read_text()
    for name in folders:
        assert f'href="{name}/slo-report.md"' in index
        assert (out / name / "slo-report.json").exists()
    assert not list(out.glob(".partial-*"))

    # Restart: the schedule stays in Redis and the stored job is kept, not replaced.
    first.stop()
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hexists("redline:report:weekly:jobs", "redline-report-weekly")
        second = Scheduler(args, tmp_path / "b.log")
        third = Scheduler(args, tmp_path / "c.log")  # a second scheduler on the same store
        schedulers += [second, third]
        wait_for(lambda: second.runs("success") + third.runs("success") >= 4, timeout=45)
        failures = second.runs("failure") + third.runs("failure")
        second.stop()
        third.stop()
        assert failures == 0
        # Publications are counted from the logs once every scheduler has stopped: a run still
        # going when the metrics were read would finish during the graceful shutdown.
        logs = "".join((tmp_path / f"{n}.log").read_text() for n in ("a", "b", "c"))
        published = len(re.findall(r"report weekly published ", logs))
        assert "(kept)" in (tmp_path / "b.log").read_text() + (tmp_path / "c.log").read_text()
        done = [client.get(k) or b"" for k in client.scan_iter("redline:report:weekly:tick:*")]
        # Each publication claimed its own tick: two schedulers never ran one tick twice.
        assert published == sum(1 for v in done if v.startswith(b"ok"))
        assert len(report_folders(out)) == 2
    finally:
        client.close()


def test_a_failed_run_is_logged_counted_and_retried_at_the_next_tick(
    recent_blocks: Path, redis_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    port = free_port()
    out = tmp_path / "reports"
    scheduler = Scheduler(
        _args(f"http://127.0.0.1:{port}", out, redis_url, "retry"), tmp_path / "s.log"
    )
    schedulers.append(scheduler)
    wait_for(lambda: scheduler.runs("failure") >= 1, timeout=45)
    log = (tmp_path / "s.log").read_text()
    assert "report retry failed" in log and "is not reachable" in log
    assert "Traceback" not in log
    assert not out.exists() or not [p for p in out.iterdir() if p.is_dir()]
    # Prometheus comes up on that port: the next tick publishes.
    workdir = tmp_path / "prom"
    import shutil

    shutil.copytree(recent_blocks, workdir / "data")
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    service = start_prometheus(workdir, config, port=port)
    try:
        wait_for(lambda: scheduler.runs("success") >= 1, timeout=45)
    finally:
        scheduler.stop()
        service.stop()
    assert len([p for p in out.iterdir() if re.match(r"^\d{8}T\d{6}Z$", p.name)]) >= 1
