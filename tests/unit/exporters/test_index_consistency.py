"""The consistency-level probe without Milvus: level names, staleness bounds, what it publishes,
when it logs, how a failing copy fails the run, and how the exporter builds it."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from redline.exporters.app import _index_probes
from redline.exporters.index_consistency import (
    MILVUS_GRACEFUL_TIME_SECONDS,
    UNKNOWN,
    IndexConsistencyError,
    IndexConsistencyProbe,
    level_name,
    read_level,
    staleness_bound,
)
from redline.exporters.index_staleness import IndexStalenessProbe
from redline.exporters.probe import ProbeCache
from redline.exporters.settings import ExporterSettings, IndexStalenessSection
from redline.platform.index import IndexConfig, TargetSpec
from redline.slo import catalog
from redline.slo.load import load_spec

LOGGER = "redline.exporters.index_consistency"
LEVEL = catalog.VECTORDB_INDEX_CONSISTENCY_LEVEL.family
BOUND = catalog.VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS.family


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (0, "Strong"),
        (1, "Session"),
        (2, "Bounded"),
        (3, "Eventually"),
        (4, "Customized"),
        ("Eventually", "Eventually"),
        ("bounded", "Bounded"),
        ("3", "Eventually"),
        (9, UNKNOWN),
        (-1, UNKNOWN),
        ("Linearizable", UNKNOWN),
        (None, UNKNOWN),
        (True, UNKNOWN),
    ],
)
def test_level_names_come_from_numbers_or_names(raw: object, name: str) -> None:
    assert level_name(raw) == name


def test_read_level_prefers_the_number_then_the_name() -> None:
    assert read_level({"consistency_level": 3, "consistency_level_name": "Strong"}) == "Eventually"
    assert read_level({"consistency_level_name": "Bounded"}) == "Bounded"
    assert read_level({}) == UNKNOWN


def test_bounds_by_level() -> None:
    assert MILVUS_GRACEFUL_TIME_SECONDS == 5.0  # milvus.yaml common.gracefulTime: 5000 ms
    assert staleness_bound("Strong") == 0.0
    assert staleness_bound("Bounded") == MILVUS_GRACEFUL_TIME_SECONDS
    assert staleness_bound("Bounded", 20.0) == 20.0
    for level in ("Session", "Eventually", "Customized", UNKNOWN):
        assert math.isinf(staleness_bound(level))


class FakeClient:
    """describe_collection answers from a dict; a missing collection raises."""

    def __init__(self, levels: dict[str, object]) -> None:
        self.levels = levels
        self.closed = False

    def describe_collection(self, name: str, timeout: float | None = None) -> dict[str, Any]:
        if name not in self.levels:
            raise RuntimeError(f"collection not found[collection={name}]")
        return {"collection_name": name, "consistency_level": self.levels[name]}

    def close(self) -> None:
        self.closed = True


def _config(primary: str = "docs_p", replica: str = "docs_r") -> IndexConfig:
    return IndexConfig(
        collection="docs",
        dim=8,
        primary=TargetSpec("http://127.0.0.1:19530", primary, "primary"),
        replica=TargetSpec("http://127.0.0.1:19531", replica, "replica"),
    )


def _probe(levels: dict[str, object], **kwargs: Any) -> tuple[IndexConsistencyProbe, FakeClient]:
    client = FakeClient(levels)

    def connect(target: TargetSpec, timeout_seconds: float) -> Any:
        return client

    return IndexConsistencyProbe(_config(), 12.0, connect=connect, **kwargs), client


def _values(samples: list[Any]) -> dict[tuple[str, str, str], float]:
    return {
        (s.name, s.labels[catalog.LABEL_TARGET], s.labels.get(catalog.LABEL_LEVEL, "")): s.value
        for s in samples
    }


def test_each_copy_publishes_its_level_and_bound() -> None:
    probe, _ = _probe({"docs_p": 0, "docs_r": 2}, bounded_staleness_seconds=8.0)
    samples = probe.run()
    assert _values(samples) == {
        (LEVEL, "primary", "Strong"): 1.0,
        (BOUND, "primary", ""): 0.0,
        (LEVEL, "replica", "Bounded"): 1.0,
        (BOUND, "replica", ""): 8.0,
    }
    assert all(s.labels[catalog.LABEL_COLLECTION] == "docs" for s in samples)
    cache = ProbeCache([probe])  # the families and labels the cache accepts
    cache.run(probe.name)
    assert cache.status()[probe.name]["success"]


def test_the_first_run_warns_about_a_weak_collection_and_later_runs_only_on_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    levels: dict[str, object] = {"docs_p": "Strong", "docs_r": "Eventually"}
    probe, _ = _probe(levels)
    caplog.set_level(logging.INFO, logger=LOGGER)
    probe.run()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "docs_r" in warnings[0] and "Eventually" in warnings[0] and "12 s" in warnings[0]
    caplog.clear()
    probe.run()
    assert not caplog.records
    levels["docs_r"] = "Strong"
    probe.run()
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "docs_r" in caplog.records[0].getMessage()


def test_bounded_over_the_red_line_warns_at_the_red_line_does_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    _probe({"docs_p": "Bounded", "docs_r": "Bounded"}, bounded_staleness_seconds=12.0)[0].run()
    assert not caplog.records
    _probe({"docs_p": "Bounded", "docs_r": "Strong"}, bounded_staleness_seconds=12.5)[0].run()
    assert len(caplog.records) == 1 and "docs_p" in caplog.records[0].getMessage()


def test_a_copy_that_cannot_be_described_fails_the_run_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe, client = _probe({"docs_p": "Eventually"})
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with pytest.raises(IndexConsistencyError, match=r"replica \(collection docs_r\)"):
        probe.run()
    # the copy that answered is still logged
    assert any("docs_p" in r.getMessage() for r in caplog.records)
    cache = ProbeCache([probe])
    cache.run(probe.name)
    assert not cache.status()[probe.name]["success"]
    probe.close()
    assert client.closed


def test_the_exporter_builds_it_beside_the_staleness_probe() -> None:
    spec = load_spec().spec
    section = IndexStalenessSection(bounded_staleness_seconds=3.0, consistency_interval_seconds=30)
    settings = ExporterSettings(index_staleness=section)
    probes = _index_probes(settings, spec)
    try:
        assert [type(p) for p in probes] == [IndexStalenessProbe, IndexConsistencyProbe]
        consistency = probes[1]
        assert isinstance(consistency, IndexConsistencyProbe)
        assert consistency.name == "index_consistency"
        assert consistency.interval_seconds == 30
        assert consistency.bounded_staleness_seconds == 3.0
        assert (
            consistency.red_line_seconds == spec.red_lines.index_consistency.max_staleness_seconds
        )
        assert not consistency.writes_canaries
    finally:
        for probe in probes:
            assert isinstance(probe, IndexStalenessProbe | IndexConsistencyProbe)
            probe.close()
    off = ExporterSettings(index_staleness=IndexStalenessSection(consistency_check=False))
    only = _index_probes(off, spec)
    try:
        assert [type(p) for p in only] == [IndexStalenessProbe]
    finally:
        for probe in only:
            assert isinstance(probe, IndexStalenessProbe)
            probe.close()
