"""Maturity level 2 from a real Prometheus: met while the regions answer alike, not met when the
backup's answers drift below the spec's similarity bar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from redline.devstack.samples.report import backfill, build_sample, ts, write_openmetrics
from redline.reporting.run import generate_report
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.report import Window
from tests.support.report import sample_prometheus

pytestmark = pytest.mark.integration

DAY = 86400
FIRST = Window(ts("2025-03-01T00:00"), ts("2025-03-02T00:00"))
SECOND = Window(ts("2025-03-02T00:00"), ts("2025-03-03T00:00"))


def test_level_2_follows_the_cross_region_similarity(tmp_path: Path) -> None:
    sample = build_sample(days=2)
    day2 = sample.times >= SECOND.start
    for name, value in (
        (catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY, 0.9),
        (catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN, 0.55),
        (catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO, 0.5),
    ):
        ((_, values),) = sample.series[name.name]
        values[day2] = value
    # A verified rollback on each day, so the similarity is all that tells the days apart.
    runs = np.zeros(sample.count)
    for at in (ts("2025-03-01T12:00"), ts("2025-03-02T12:00")):
        runs[sample.times >= at] += 1
    sample.add(
        catalog.REDLINE_REMEDIATION_RUNS_TOTAL,
        {"playbook": "semantic_rollback", "outcome": "succeeded"},
        runs,
    )
    backfill(write_openmetrics(sample, tmp_path / "two-days.om"), tmp_path / "blocks")
    spec = load_spec(None).spec
    with sample_prometheus(tmp_path / "blocks", tmp_path / "prom") as service:
        first = generate_report(service.url, spec, "default", FIRST, step=60).report.maturity
        second = generate_report(service.url, spec, "default", SECOND, step=60).report.maturity
    level2 = {c.id: c for c in first.checks if c.level == 2}
    assert {c.status for c in level2.values()} == {"met"}, level2
    # The day's mean similarity, computed from the injected values.
    ((_, similarity),) = sample.series[catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY.name]
    mean = float(np.mean(similarity[(sample.times > FIRST.start) & (sample.times <= FIRST.end)]))
    assert (
        f"chat primary vs secondary {mean:.3f} >= 0.97" in level2["embedding_similarity"].evidence
    )
    assert first.level == 2 and first.levels[1].holds

    failing = {c.id: c for c in second.checks if c.level == 2}
    assert failing["output_hash"].status == "met"
    assert "50.0% of answers identical" in failing["output_hash"].evidence
    assert failing["embedding_similarity"].status == "not_met"
    assert "0.900 < 0.97; lowest single answer 0.550" in failing["embedding_similarity"].evidence
    assert failing["golden_set"].status == "met" and failing["rollback_verified"].status == "met"
    assert second.level == 1 and second.next_level == 2
    assert any("0.900 < 0.97" in item for item in second.missing_for_next)
