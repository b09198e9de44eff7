"""Shared set-up of the report tests: a month of sample series backfilled into real Prometheus."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from redline.devstack.processes import Service, start_prometheus
from redline.devstack.samples.report import Sample, backfill, build_sample, write_openmetrics


def sample_blocks(factory: pytest.TempPathFactory) -> tuple[Sample, Path]:
    """The sample and its TSDB blocks, built once per test session (promtool backfill)."""
    root = factory.getbasetemp() / "report-sample"
    blocks = root / "blocks"
    sample = build_sample()
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        source = write_openmetrics(sample, root / "sample.om")
        backfill(source, blocks)
        source.unlink()
        (root / "done").touch()
    return sample, blocks


@contextmanager
def sample_prometheus(blocks: Path | None, workdir: Path) -> Iterator[Service]:
    """A real Prometheus over a copy of the blocks (or empty), scraping nothing."""
    workdir.mkdir(parents=True, exist_ok=True)
    if blocks is not None:
        shutil.copytree(blocks, workdir / "data")
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n", encoding="utf-8")
    service = start_prometheus(workdir, config)
    try:
        yield service
    finally:
        service.stop()
