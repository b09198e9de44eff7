"""The output-mutation probe's pure parts: normalisation and each false-positive control, the
Myers diff, the score, the diff label, the canary file's errors, and acceptance over a store."""

from __future__ import annotations

import difflib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from redline.exporters.canary_file import (
    DEFAULT_CANARIES,
    CanaryFileError,
    load_canaries,
    parse_canaries,
)
from redline.exporters.mutation import AcceptedStore, MutationSettings, build_mutation_probes, judge
from redline.exporters.mutation_diff import (
    Normaliser,
    compare,
    edit_distance,
    mutation_score,
    myers_diff,
    normalise,
    render_diff,
)
from redline.platform.golden import GOLDEN_SET, find_golden

REFERENCE = "The capital of France is Paris."


# ---- each false-positive control, alone ----------------------------------------------------


def test_punctuation_case_and_whitespace_are_ignored() -> None:
    assert compare(REFERENCE, "  the CAPITAL of france,  is PARIS!!", Normaliser()).changes == 0
    # ...and without the control the texts differ
    assert REFERENCE.split() != "  the CAPITAL of france,  is PARIS!!".split()


def test_a_real_change_is_not_hidden_by_the_normalisation() -> None:
    assert compare(REFERENCE, "The capital of France is Lyon.", Normaliser()).changes == 2


@pytest.mark.parametrize(
    ("field", "old", "new"),
    [
        (
            "timestamp",
            "Generated 2024-08-01T14:22:07Z ok",
            "Generated 2025-01-31 09:00:01.5+02:00 ok",
        ),
        (
            "uuid",
            "id 123e4567-e89b-12d3-a456-426614174000",
            "id 9f1c0d2e-0000-4a4a-8b8b-abcdefabcdef",
        ),
        ("number", "You have 3 items costing 4.50", "You have 12 items costing 1,299.99"),
        ("date", "due 2024-08-01", "due 12/31/2025"),
        ("re:order-[0-9]+", "see order-1234 now", "see order-98 now"),
    ],
)
def test_each_whitelisted_field_is_masked(field: str, old: str, new: str) -> None:
    assert compare(old, new, Normaliser((field,))).changes == 0
    assert compare(old, new, Normaliser()).changes > 0, "the control is what hides the change"


def test_a_whitelisted_field_masks_only_its_kind() -> None:
    uuid = "id 123e4567-e89b-12d3-a456-426614174000 at 10:00"
    other = "id 9f1c0d2e-0000-4a4a-8b8b-abcdefabcdef at 11:00"
    assert compare(uuid, other, Normaliser(("uuid",))).changes == 2  # the time still counts


def test_equivalent_spellings_are_mapped() -> None:
    table = (("6", "six"), ("usa", "united states", "u s a"))
    old, new = "A hexagon has six sides in the United States.", "a hexagon has 6 sides in the USA"
    assert compare(old, new, Normaliser((), table)).changes == 0
    assert compare(old, new, Normaliser()).changes > 0, "the control is what hides the change"
    tokens = normalise("the U.S.A. and the united states", (), table)
    assert tokens == ["the", "usa", "and", "the", "usa"]


def test_an_equivalence_does_not_swallow_a_different_word() -> None:
    assert compare("six sides", "seven sides", Normaliser((), (("6", "six"),))).changes == 2


def test_a_bad_whitelist_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="not a built-in field"):
        Normaliser(("timestamps",))
    with pytest.raises(ValueError, match="not a regular expression"):
        Normaliser(("re:(",))


# ---- diff, score, label --------------------------------------------------------------------


def _lcs(a: list[str], b: list[str]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = (
                table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
            )
    return table[len(a)][len(b)]


def test_the_myers_script_is_minimal_and_rebuilds_both_sides() -> None:
    rng = random.Random(3)
    for _ in range(500):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 12))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 12))]
        script = myers_diff(a, b)
        assert [e.token for e in script if e.op != "+"] == a
        assert [e.token for e in script if e.op != "-"] == b
        assert edit_distance(script) == len(a) + len(b) - 2 * _lcs(a, b)


def test_sequence_matcher_can_overcount_where_myers_does_not() -> None:
    """Why Myers: SequenceMatcher's junk heuristic on repeated tokens is not minimal."""
    a = ["x"] + ["the"] * 250 + ["y"]
    b = ["the"] * 250
    matched = sum(m.size for m in difflib.SequenceMatcher(None, a, b).get_matching_blocks())
    assert edit_distance(myers_diff(a, b)) == 2
    assert len(a) + len(b) - 2 * matched > 2


def test_the_score_weighs_short_answers_fully_and_damps_long_ones() -> None:
    assert mutation_score(0, 6, 6) == 0.0
    assert mutation_score(9, 6, 5) == pytest.approx(9 / 11)
    short = mutation_score(4, 8, 8)
    long = mutation_score(4 * 16, 128, 128)  # the same ratio in an answer 16x longer
    assert short == pytest.approx(0.25) and long == pytest.approx(0.25 * 0.5)
    assert mutation_score(3, 500, 500) < 0.01


def test_the_diff_label_is_short_and_word_only() -> None:
    script = myers_diff(normalise(REFERENCE), normalise("I believe it is Lyon."))
    assert render_diff(script) == "-the capital of france +i believe it | -paris +lyon"
    long = render_diff(myers_diff(["a"] * 200, ["b"] * 200), limit=40)
    assert len(long) <= 40 and long.endswith("…")
    weird = render_diff(myers_diff([], normalise('he said "}\n{" \\ ok')))
    assert all(c.isalnum() or c in " +-|_" for c in weird)


# ---- the canary file -----------------------------------------------------------------------


def test_a_canary_file_parses(tmp_path: Path) -> None:
    path = tmp_path / "canaries.jsonl"
    path.write_text(
        "# canaries\n\n"
        + json.dumps({"id": "a", "prompt": "hi", "whitelist": ["uuid"], "max_tokens": 8})
        + "\n"
        + json.dumps(
            {
                "id": "b",
                "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
                "equivalents": [["6", "six"]],
            }
        )
        + "\n"
    )
    a, b = load_canaries(path)
    assert a.request("m") == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": False,
    }
    assert b.messages == (("system", "x"), ("user", "y")) and b.equivalents == (("6", "six"),)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ('{"id": "a"}', "messages: required"),
        ('{"id": "a", "prompt": "p", "messages": []}', "messages: give messages or prompt"),
        ('{"prompt": "p"}', "id: required"),
        ('{"id": "a", "prompt": "p", "max_tokens": 0}', "max_tokens: must be a positive"),
        ('{"id": "a", "prompt": "p", "whitelist": ["uuids"]}', "whitelist: 'uuids' is not"),
        ('{"id": "a", "prompt": "p", "equivalents": [["six"]]}', "equivalents[0]: must list"),
        ('{"id": "a", "prompt": "p", "colour": 1}', "colour: unknown field"),
        ('{"id": "a", "messages": [{"role": "bot", "content": "x"}]}', "messages[0].role"),
    ],
)
def test_a_bad_line_names_file_line_and_field(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "canaries.jsonl"
    path.write_text('{"id": "ok", "prompt": "fine"}\n' + line + "\n")
    with pytest.raises(CanaryFileError) as caught:
        load_canaries(path)
    assert caught.value.problems[0].startswith(f"{path}:2: ")
    assert problem in caught.value.problems[0]


def test_a_repeated_id_an_empty_file_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CanaryFileError, match=r"f:2: id: 'a' repeats line 1"):
        parse_canaries('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', "f")
    with pytest.raises(CanaryFileError, match="no canary prompts"):
        parse_canaries("# nothing\n", "f")
    with pytest.raises(CanaryFileError, match="cannot read"):
        load_canaries(tmp_path / "missing.jsonl")


def test_building_the_probes_fails_on_a_bad_file_before_opening_anything(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("[1]\n")
    settings = MutationSettings(enabled=True, upstreams={"primary": "http://x"}, path=path)
    with pytest.raises(CanaryFileError, match=r"c.jsonl:1: line: must be a JSON object"):
        build_mutation_probes(settings, "redis://127.0.0.1:1/0")
    assert build_mutation_probes(MutationSettings(), "redis://127.0.0.1:1/0") == []


def test_the_built_in_canaries_are_golden_prompts_the_simulator_answers() -> None:
    for canary in DEFAULT_CANARIES:
        assert find_golden(canary.messages[-1][1]) in GOLDEN_SET


# ---- acceptance ----------------------------------------------------------------------------


class _Hashes:
    """The few hash commands AcceptedStore uses, over dicts (the real Redis: integration)."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, str]] = {}

    def hget(self, key: str, field: str) -> str | None:
        return self.data.get(key, {}).get(field)

    def hset(self, key: str, field: str, value: str) -> None:
        self.data.setdefault(key, {})[field] = value

    def hdel(self, key: str, field: str) -> None:
        self.data.get(key, {}).pop(field, None)

    def pipeline(self, transaction: bool = True) -> _Hashes:
        return self

    def execute(self) -> None:
        return None


def _judge(store: AcceptedStore, version: str, answer: str, accept_after: int = 0) -> Any:
    key = ("m", version, "primary", "capital")
    return judge(store, key, answer, Normaliser(), accept_after=accept_after, short_tokens=32,
                 diff_chars=120, now=1.0)  # fmt: skip


def test_the_first_answer_is_accepted_and_a_change_is_kept_until_accepted() -> None:
    store = AcceptedStore(_Hashes())  # type: ignore[arg-type]
    assert _judge(store, "v1", REFERENCE).accepted
    for _ in range(3):
        verdict = _judge(store, "v1", "I believe it is Lyon.")
        assert not verdict.accepted and verdict.comparison.changes == 9
    assert _judge(store, "v1", "the capital of france is paris").comparison.changes == 0
    accepted = store.accepted("m", "v1", "primary", "capital")
    assert accepted is not None and accepted.text == REFERENCE


def test_a_new_version_is_compared_with_the_previous_versions_answer() -> None:
    store = AcceptedStore(_Hashes())  # type: ignore[arg-type]
    _judge(store, "v1", REFERENCE)
    mutated = _judge(store, "v2", "I believe it is Lyon.")
    assert mutated.baseline_version == "v1" and mutated.comparison.changes == 9
    assert store.accepted("m", "v2", "primary", "capital") is None
    same = _judge(store, "v3", "The capital of France is PARIS")
    assert same.accepted and same.comparison.changes == 0


def test_accept_after_settles_a_stable_change_but_not_a_flapping_one() -> None:
    store = AcceptedStore(_Hashes())  # type: ignore[arg-type]
    _judge(store, "v1", REFERENCE)
    flapping = ["Lyon it is.", "Marseille it is.", "Lyon it is.", "Marseille it is."]
    assert not any(_judge(store, "v1", a, accept_after=2).accepted for a in flapping)
    assert not _judge(store, "v1", "Nice it is.", accept_after=2).accepted
    assert _judge(store, "v1", "Nice it is!", accept_after=2).accepted
    assert _judge(store, "v1", "nice IT is", accept_after=2).comparison.changes == 0
