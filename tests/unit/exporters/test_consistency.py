"""The consistency probe's maths, prompts and configuration (no network)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from redline.core.settings import SettingsError
from redline.exporters.app import ProbeConfigError, build_probes
from redline.exporters.consistency import (
    ConsistencyProbe,
    ConsistencySettings,
    answer_hash,
    build_consistency_probes,
    compare_answers,
    load_canary_prompts,
)
from redline.exporters.settings import ExporterSettings, load_exporter_settings
from redline.platform.golden import GOLDEN_SET, GoldenSetError, embed
from redline.slo.load import load_spec

UPSTREAMS = {"primary": "http://127.0.0.1:1", "secondary": "http://127.0.0.1:2"}
REGIONS = ("primary", "secondary")


def test_hash_ignores_case_punctuation_and_spacing_only() -> None:
    assert answer_hash("The capital of France is Paris.") == answer_hash(
        "the capital  of france IS paris"
    )
    assert answer_hash("17 + 25 = 42.") != answer_hash("17 + 25 = 43.")


def test_identical_answers_agree_fully() -> None:
    answers = [item.reference for item in GOLDEN_SET]
    figures = compare_answers(answers, list(answers))
    assert (figures.prompts, figures.agreement_ratio) == (12, 1.0)
    assert figures.similarity_mean == 1.0 and figures.similarity_min == 1.0


def test_wrong_answers_lower_agreement_and_similarity() -> None:
    primary = [item.reference for item in GOLDEN_SET]
    backup = [item.wrong if i < 3 else item.reference for i, item in enumerate(GOLDEN_SET)]
    figures = compare_answers(primary, backup)
    assert figures.agreement_ratio == pytest.approx(9 / 12)
    wrong = [
        float(np.dot(embed(a), embed(b))) for a, b in zip(primary[:3], backup[:3], strict=True)
    ]
    assert figures.similarity_min == pytest.approx(min(wrong))
    assert figures.similarity_mean == pytest.approx((9 + sum(wrong)) / 12)
    assert figures.similarity_mean < 0.97


def test_given_vectors_are_used_for_differing_answers_only() -> None:
    a, b = np.array([1.0, 0.0]), np.array([0.6, 0.8])
    figures = compare_answers(["x", "Same!"], ["y", "same"], [a, a], [b, b])
    # The first pair differs (cosine 0.6 of the vectors given); the second is equal once
    # normalised, so it scores 1.0 whatever its vectors say.
    assert figures.similarity_min == pytest.approx(0.6)
    assert figures.similarity_mean == pytest.approx(0.8)
    assert figures.agreement_ratio == 0.5


def test_compare_refuses_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="same non-zero number"):
        compare_answers(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="same non-zero number"):
        compare_answers([], [])
    with pytest.raises(ValueError, match="both regions"):
        compare_answers(["a"], ["b"], [np.ones(2)], None)


def test_canary_prompts_from_text_and_jsonl(tmp_path: Path) -> None:
    text = tmp_path / "canaries.txt"
    text.write_text("# canaries\nWhat is 2 + 2?\n\n  Name a prime.  \n", "utf-8")
    assert [p.prompt for p in load_canary_prompts(text)] == ["What is 2 + 2?", "Name a prime."]
    jsonl = tmp_path / "golden.jsonl"
    jsonl.write_text('{"id": "a", "prompt": "Q?", "expected": "A", "matcher": "exact"}\n', "utf-8")
    assert [p.prompt for p in load_canary_prompts(jsonl)] == ["Q?"]
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n", "utf-8")
    with pytest.raises(GoldenSetError, match="no canary prompts"):
        load_canary_prompts(empty)


def test_probes_per_model_primary_first_backups_after() -> None:
    settings = ConsistencySettings(enabled=True, models=("a", "b"))
    probes = build_consistency_probes(settings, REGIONS, UPSTREAMS)
    try:
        assert [p.name for p in probes] == ["llm_consistency_a", "llm_consistency_b"]
        assert probes[0].primary == ("primary", UPSTREAMS["primary"])
        assert probes[0].backups == (("secondary", UPSTREAMS["secondary"]),)
        assert probes[0].embeddings is None and len(probes[0].items) == len(GOLDEN_SET)
    finally:
        for probe in probes:
            probe.close()


def test_off_by_default_and_configuration_errors() -> None:
    assert build_consistency_probes(ConsistencySettings(), REGIONS, UPSTREAMS) == []
    on = ConsistencySettings(enabled=True)
    with pytest.raises(ValueError, match="primary region 'primary'"):
        build_consistency_probes(on, REGIONS, {"secondary": UPSTREAMS["secondary"]})
    with pytest.raises(ValueError, match="no upstream for any backup"):
        build_consistency_probes(on, REGIONS, {"primary": UPSTREAMS["primary"]})
    with pytest.raises(ValueError, match="not in the spec's regions"):
        build_consistency_probes(on, REGIONS, {**UPSTREAMS, "mars": "http://127.0.0.1:3"})


def test_exporter_builds_it_from_its_section(tmp_path: Path) -> None:
    spec = load_spec(None).spec
    config = tmp_path / "exporters.yaml"
    config.write_text(
        "consistency:\n  enabled: true\n  models: [chat]\n  embeddings:\n"
        "    url: http://127.0.0.1:9\n    api_key_file: " + str(tmp_path / "missing") + "\n",
        "utf-8",
    )
    settings = load_exporter_settings(config)
    settings = settings.model_copy(
        update={"endpoints": settings.endpoints.model_copy(update={"upstreams": UPSTREAMS})}
    )
    with pytest.raises(ProbeConfigError, match="consistency.embeddings.api_key_file"):
        build_probes(_only_consistency(settings), spec)
    key = tmp_path / "key"
    key.write_text("sk-test\n", "utf-8")
    embeddings = settings.consistency.embeddings.model_copy(update={"api_key_file": key})
    settings = settings.model_copy(
        update={"consistency": settings.consistency.model_copy(update={"embeddings": embeddings})}
    )
    probes = build_probes(_only_consistency(settings), spec)
    try:
        (probe,) = probes
        assert isinstance(probe, ConsistencyProbe) and probe.name == "llm_consistency_chat"
        assert probe.embeddings is not None
        assert probe.embeddings.url == "http://127.0.0.1:9/v1/embeddings"
    finally:
        for built in probes:
            assert isinstance(built, ConsistencyProbe)
            built.close()


def _only_consistency(settings: ExporterSettings) -> ExporterSettings:
    off = {"enabled": False}
    return settings.model_copy(
        update={
            name: getattr(settings, name).model_copy(update=off)
            for name in ("models", "index_staleness", "session_rpo", "keepalive", "drift")
        }
        | {"endpoints": settings.endpoints.model_copy(update=off)}
    )


def test_bad_section_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "exporters.yaml"
    config.write_text("consistency:\n  max_tokens: 0\n", "utf-8")
    with pytest.raises(SettingsError, match="consistency.max_tokens"):
        load_exporter_settings(config)
