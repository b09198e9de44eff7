"""Evaluation verdicts: validation against a real snapshot registry, and the shared tally."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from redline.exporters.app import ProbeConfigError, build_probes
from redline.exporters.evaluations import (
    EvalTally,
    EvaluationConfigError,
    EvaluationsSettings,
    Verdict,
    build_evaluations_router,
    build_verdicts,
)
from redline.exporters.llm_probes import GoldenSetProbe, GoldenSetSettings, golden_items
from redline.exporters.settings import ExporterSettings
from redline.platform.golden import GOLDEN_SET, GoldenSetError
from redline.platform.snapshots import ActiveVersions, SnapshotRegistry
from redline.slo import catalog
from redline.slo.load import load_spec
from tests.support.snapshots import MODEL, make_artifacts

REQUESTS = catalog.LLM_EVAL_REQUESTS_TOTAL.name
CORRECT = catalog.LLM_EVAL_CORRECT_TOTAL.name


@pytest.fixture()
def versions(tmp_path: Path) -> ActiveVersions:
    """MODEL with v1 and v2 recorded and v2 active; `other` with a snapshot but none active."""
    registry = SnapshotRegistry(tmp_path / "registry")
    ids = {}
    for version in ("v1", "v2"):
        weights, config = make_artifacts(tmp_path, version)
        ids[version] = registry.create(MODEL, version, weights, config).snapshot_id
    registry.activate(MODEL, ids["v2"])
    weights, config = make_artifacts(tmp_path / "other", "o1")
    registry.create("other", "o1", weights, config)
    return ActiveVersions(registry, ttl_seconds=0.0)


def test_a_verdict_defaults_to_the_active_version(versions: ActiveVersions) -> None:
    verdicts, problems = build_verdicts({"model": MODEL, "correct": True}, versions, 10)
    assert problems == [] and verdicts == [Verdict(MODEL, "v2", True)]
    verdicts, problems = build_verdicts(
        {"model": MODEL, "version": "v1", "correct": False, "score": 0.25}, versions, 10
    )
    assert problems == [] and verdicts == [Verdict(MODEL, "v1", False, 0.25)]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"model": "nope", "correct": True},
         "model: unknown model 'nope': not in the snapshot registry at {root} "
         "(known: org/chat-7b, other)"),
        ({"model": MODEL, "version": "v9", "correct": True},
         "version: unknown version 'v9' of 'org/chat-7b': neither the active one (v2) nor a "
         "snapshot in the registry (known: v1, v2)"),
        ({"model": "other", "correct": True},
         "version: model 'other' has no active snapshot; name the version the verdict is on"),
        ({"model": MODEL}, "correct: required, true or false; got None"),
        ({"model": MODEL, "correct": 1}, "correct: required, true or false; got 1"),
        ({"correct": True}, "model: required, a non-empty string; got None"),
        ({"model": MODEL, "correct": True, "version": ""},
         "version: must be a non-empty string; got ''"),
        ({"model": MODEL, "correct": True, "score": 1.5},
         "score: must be a number in [0, 1]; got 1.5"),
        ({"model": MODEL, "correct": True, "score": True},
         "score: must be a number in [0, 1]; got True"),
        ({"model": MODEL, "correct": True, "judge": "gpt"},
         "judge: unknown field (allowed: model, version, correct, score)"),
        ("yes", "body: expected a JSON object with model and correct"),
        ([], "body: an empty list holds no verdict"),
    ],
)  # fmt: skip
def test_a_bad_verdict_names_its_field(
    versions: ActiveVersions, body: object, problem: str
) -> None:
    verdicts, problems = build_verdicts(body, versions, 10)
    assert problems == [problem.format(root=versions.registry.root)]
    assert verdicts == [] or isinstance(body, list)


def test_a_batch_names_the_index_of_each_bad_verdict(versions: ActiveVersions) -> None:
    body = [
        {"model": MODEL, "correct": True},
        {"model": MODEL, "version": "v0", "correct": True},
        "x",
        {"model": MODEL, "version": "v1", "correct": False},
    ]
    verdicts, problems = build_verdicts(body, versions, 10)
    assert [p.split(":")[0] for p in problems] == ["[1].version", "[2]"]
    assert len(verdicts) == 2  # the caller applies nothing when there are problems
    _, problems = build_verdicts(body, versions, 3)
    assert problems == ["body: 4 verdicts; at most 3 per request"]


def test_the_tally_publishes_cumulative_counters() -> None:
    tally = EvalTally()
    registry = CollectorRegistry()
    registry.register(tally)
    assert registry.get_sample_value(REQUESTS, {"model": "m", "model_version": "v"}) is None
    tally.add("m", "v", 12, 11)
    tally.add_many([("m", "v", 1, 0), ("m", "w", 2, 2), ("n", "v", 1, 1)])
    assert registry.get_sample_value(REQUESTS, {"model": "m", "model_version": "v"}) == 13
    assert registry.get_sample_value(CORRECT, {"model": "m", "model_version": "v"}) == 11
    assert registry.get_sample_value(CORRECT, {"model": "m", "model_version": "w"}) == 2
    assert [s.labels["model"] for s in tally.samples("n")] == ["n", "n"]
    assert tally.totals()[("m", "v")] == (13, 11)


def test_a_golden_probe_on_a_shared_tally_publishes_nothing_itself() -> None:
    tally = EvalTally()
    shared = GoldenSetProbe("http://127.0.0.1:1", "m", tally=tally)
    alone = GoldenSetProbe("http://127.0.0.1:1", "m")
    try:
        assert shared.metrics == () and shared.samples() == []
        assert {m.name for m in alone.metrics} == {
            catalog.LLM_EVAL_REQUESTS_TOTAL.family,
            catalog.LLM_EVAL_CORRECT_TOTAL.family,
        }
        alone.tally.add("m", "v1", 2, 1)
        assert [s.value for s in alone.samples()] == [2.0, 1.0]
    finally:
        shared.close()
        alone.close()


def test_an_unreadable_token_file_stops_the_endpoint(
    versions: ActiveVersions, tmp_path: Path
) -> None:
    settings = EvaluationsSettings(token_file=tmp_path / "missing-token")
    with pytest.raises(EvaluationConfigError, match="evaluations.token_file: cannot read"):
        build_evaluations_router(settings, versions, EvalTally())


def test_opening_the_endpoint_without_a_token_is_logged(
    versions: ActiveVersions, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        build_evaluations_router(EvaluationsSettings(), versions, EvalTally())
        assert "WITHOUT a token" not in caplog.text
        build_evaluations_router(
            EvaluationsSettings(allow_unauthenticated=True), versions, EvalTally()
        )
        assert "accepts verdicts WITHOUT a token" in caplog.text


# ---- the golden set a probe uses ----------------------------------------------------------


def test_the_golden_file_replaces_the_built_in_set(tmp_path: Path) -> None:
    path = tmp_path / "golden.jsonl"
    path.write_text('{"id": "a", "prompt": "p?", "expected": "x", "matcher": "exact"}\n')
    items = golden_items(GoldenSetSettings(gateway_url="http://10.0.0.5:8080", path=path))
    assert [item.id for item in items] == ["a"]


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://127.0.0.1:8080", False),
        ("http://localhost:8080", False),
        ("http://[::1]:8080", False),
        ("http://gateway.prod.internal:8080", True),
        ("http://10.0.0.5:8080", True),
    ],
)
def test_the_built_in_set_outside_the_demo_is_warned_about(
    url: str, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert golden_items(GoldenSetSettings(gateway_url=url)) == GOLDEN_SET
    assert ("golden_set.path is not set" in caplog.text) is warned


def _only_golden(tmp_path: Path, path: Path) -> ExporterSettings:
    sections = ("models", "endpoints", "index_staleness", "session_rpo", "keepalive", "drift")
    return ExporterSettings.model_validate(
        {
            **{section: {"enabled": False} for section in sections},
            "golden_set": {"gateway_url": "http://127.0.0.1:1", "path": str(path)},
            "models": {"enabled": False, "root": str(tmp_path / "registry")},
        }
    )


def test_a_bad_golden_file_stops_the_exporter_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "golden.jsonl"
    path.write_text('{"id": "a", "prompt": "p?", "expected": "x", "matcher": "fuzzy"}\n')
    with pytest.raises(ProbeConfigError, match=rf"{path}:1: matcher: 'fuzzy' is not one of exact"):
        build_probes(_only_golden(tmp_path, path), load_spec().spec)
    with pytest.raises(GoldenSetError):
        golden_items(GoldenSetSettings(gateway_url="http://127.0.0.1:1", path=path))


def test_golden_probes_share_the_exporters_tally_and_versions(tmp_path: Path) -> None:
    path = tmp_path / "golden.jsonl"
    path.write_text('{"id": "a", "prompt": "p?", "expected": "x", "matcher": "exact"}\n')
    (probe,) = build_probes(_only_golden(tmp_path, path), load_spec().spec)
    try:
        assert isinstance(probe, GoldenSetProbe)
        assert probe.versions is not None and probe.versions.registry.root == (
            tmp_path / "registry"
        )
        assert not probe.publishes and [item.id for item in probe.items] == ["a"]
    finally:
        probe.close()  # type: ignore[attr-defined]
