"""The golden set's grader and answer embedding."""

from __future__ import annotations

import numpy as np
import pytest

from redline.platform.golden import (
    EMBEDDING_DIMS,
    GOLDEN_SET,
    GoldenPrompt,
    build_golden_request,
    cosine,
    embed,
    find_golden,
    grade,
    normalize,
    similarity,
)


def test_the_set_is_well_formed() -> None:
    ids = [item.id for item in GOLDEN_SET]
    assert len(ids) >= 10
    assert len(set(ids)) == len(ids)
    assert len({normalize(item.prompt) for item in GOLDEN_SET}) == len(GOLDEN_SET)


@pytest.mark.parametrize("item", GOLDEN_SET, ids=lambda item: item.id)
def test_reference_answers_pass_and_wrong_answers_fail(item: GoldenPrompt) -> None:
    assert grade(item.reference, item.expected)
    assert not grade(item.wrong, item.expected)
    # A wrong answer must also look different, or the similarity gate could not catch it.
    assert similarity(item.reference, item.wrong) < 0.8


@pytest.mark.parametrize(
    ("answer", "expected", "correct"),
    [
        ("144 / 12 = 12.", "12", True),
        ("144 / 12 = 13.", "12", False),  # contains 12, but the answer given is 13
        ("The answer is 12.0", "12", True),
        ("It is 1,000 exactly", "1000", True),
        ("no number here", "12", False),
        ("-3", "-3", True),
        ("The capital is PARIS!", "Paris", True),
        ("A Parisian café", "Paris", False),  # whole words only
        ("Romeo and Juliet was written by William Shakespeare.", "William Shakespeare", True),
        ("Shakespeare, William", "William Shakespeare", False),  # in order
        ("São Paulo is big", "Sao Paulo", True),  # accents ignored
        ("anything", "", False),
    ],
)
def test_grade(answer: str, expected: str, correct: bool) -> None:
    assert grade(answer, expected) is correct


def test_find_golden_ignores_case_and_punctuation() -> None:
    item = find_golden("  what is 17 + 25 ")
    assert item is not None and item.id == "add"
    assert find_golden("What is 17 + 26?") is None


def test_embedding_is_unit_length_and_deterministic() -> None:
    vector = embed("The capital of France is Paris.")
    assert vector.shape == (EMBEDDING_DIMS,)
    assert np.linalg.norm(vector) == pytest.approx(1.0)
    assert np.array_equal(vector, embed("the capital of france is paris"))
    assert not embed("").any()  # an empty text has no n-grams
    assert cosine(embed(""), vector) == 0.0


def test_similarity_orders_answers_by_surface_overlap() -> None:
    reference = "The capital of France is Paris."
    assert similarity(reference, reference) == 1.0
    assert similarity(reference, "the capital of france is paris") == 1.0
    near = similarity(reference, "The capital of France is Paris, of course.")
    far = similarity(reference, "I believe it is Lyon.")
    assert 0.8 < near < 1.0
    assert far < 0.5
    assert far < near


def test_embed_rejects_degenerate_dimensions() -> None:
    with pytest.raises(ValueError, match="dims"):
        embed("x", dims=1)


def test_golden_request_is_deterministic_chat_completion() -> None:
    body = build_golden_request(GOLDEN_SET[0], "chat", max_tokens=8)
    assert body["model"] == "chat"
    assert body["temperature"] == 0
    assert body["messages"] == [{"role": "user", "content": GOLDEN_SET[0].prompt}]
