"""The user's golden set: JSONL loading (every bad line named), matchers, their properties."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redline.platform.golden import (
    GOLDEN_SET,
    MATCHERS,
    GoldenPrompt,
    GoldenSetError,
    golden_lines,
    grade,
    grade_item,
    load_golden_set,
    match,
    normalize,
)

GOOD = [
    {"id": "refund", "prompt": "Refund window in days?", "expected": 30,
     "matcher": "numeric-tolerance"},
    {"id": "pi", "prompt": "Pi to two decimals?", "expected": "3.14",
     "matcher": "numeric-tolerance", "tolerance": 0.01},
    {"id": "ticket", "prompt": "Ticket id format?", "expected": r"\bTCK-\d{6}\b",
     "matcher": "regex"},
    {"id": "yes", "prompt": "Is it open on Sunday?", "expected": "No", "matcher": "exact"},
    {"id": "city", "prompt": "Head office?", "expected": "São Paulo", "matcher": "normalized",
     "reference": "Sao Paulo"},
    {"id": "plan", "prompt": "Which plan has SSO?", "expected": "Enterprise plan",
     "matcher": "contains"},
]  # fmt: skip


def write(path: Path, lines: list[object] | str) -> Path:
    if isinstance(lines, str):
        path.write_text(lines, "utf-8")
    else:
        path.write_text("".join(json.dumps(line) + "\n" for line in lines), "utf-8")
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(GoldenSetError) as caught:
        load_golden_set(path)
    assert str(caught.value) == "\n".join(caught.value.problems)
    return list(caught.value.problems)


def test_a_good_file_loads_every_line(tmp_path: Path) -> None:
    path = write(tmp_path / "golden.jsonl", GOOD)
    items = load_golden_set(path)
    assert [item.id for item in items] == [line["id"] for line in GOOD]
    refund, pi, ticket, yes, city, plan = items
    assert (refund.expected, refund.matcher, refund.tolerance) == ("30", "numeric-tolerance", 0.0)
    assert (pi.expected, pi.tolerance) == ("3.14", 0.01)
    assert city.reference == "Sao Paulo" and plan.reference == ""
    assert grade_item("Customers have 30 days.", refund)
    assert not grade_item("Customers have 31 days.", refund)
    assert grade_item("It is 3.141", pi) and not grade_item("It is 3.16", pi)
    assert grade_item("Use TCK-123456 please", ticket) and not grade_item("TCK-12345", ticket)
    assert grade_item("  No\n", yes) and not grade_item("no", yes)
    assert grade_item("sao paulo!", city) and not grade_item("Sao Paulo, Brazil", city)
    assert grade_item("Only the Enterprise Plan.", plan) and not grade_item(
        "Plan: Enterprise", plan
    )


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path: Path) -> None:
    text = "\n" + json.dumps(GOOD[0]) + "\n\n   \n" + '{"id": "x"}\n'
    problems = problems_of(write(tmp_path / "g.jsonl", text))
    where = f"{tmp_path / 'g.jsonl'}:5"
    assert problems == [
        f"{where}: prompt: required",
        f"{where}: matcher: required; one of {', '.join(MATCHERS)}",
        f"{where}: expected: required",
    ]


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ({**GOOD[3], "matcher": "fuzzy"}, "matcher",
         "'fuzzy' is not one of exact, normalized, regex, numeric-tolerance, contains"),
        ({**GOOD[3], "colour": "red"}, "colour",
         "unknown field (allowed: id, prompt, expected, matcher, tolerance, reference)"),
        ({**GOOD[3], "id": ""}, "id", "must be a non-empty string, got ''"),
        ({**GOOD[3], "prompt": 7}, "prompt", "must be a non-empty string, got 7"),
        ({**GOOD[3], "expected": True}, "expected", "must be a string or a number, got True"),
        ({**GOOD[3], "expected": "  "}, "expected", "must not be empty"),
        ({**GOOD[3], "tolerance": 1}, "tolerance",
         "only matcher numeric-tolerance takes a tolerance"),
        ({**GOOD[0], "tolerance": -1}, "tolerance", "must be a number >= 0, got -1"),
        ({**GOOD[0], "expected": "thirty"}, "expected",
         "'thirty' is not a number (matcher numeric-tolerance; e.g. 42 or -3.5)"),
        ({**GOOD[2], "expected": "(unclosed"}, "expected",
         "not a valid regular expression: missing ), unterminated subpattern at position 0"),
        ({**GOOD[4], "reference": ["x"]}, "reference", "must be a string, got ['x']"),
        (["not", "an", "object"], "(line)", "expected a JSON object, got list"),
    ],
)  # fmt: skip
def test_a_bad_line_is_named_with_its_field(
    tmp_path: Path, line: object, field: str, message: str
) -> None:
    path = write(tmp_path / "golden.jsonl", [GOOD[0], line, GOOD[1]])
    assert problems_of(path) == [f"{path}:2: {field}: {message}"]


def test_every_bad_line_is_reported_and_nothing_is_loaded(tmp_path: Path) -> None:
    path = write(
        tmp_path / "golden.jsonl",
        json.dumps(GOOD[0]) + "\n{not json\n" + json.dumps(GOOD[0]) + "\n"
        + json.dumps({**GOOD[1], "matcher": "close"}) + "\n",
    )  # fmt: skip
    problems = problems_of(path)
    assert problems[0].startswith(f"{path}:2: not valid JSON: ")
    assert problems[1] == f"{path}:3: id: 'refund' is already used on line 1"
    assert problems[2].startswith(f"{path}:4: matcher: 'close' is not one of exact,")
    assert len(problems) == 3


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_file_is_refused(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "empty.jsonl", text)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: no golden prompts: the file is empty")


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    assert problems_of(missing) == [
        f"{missing}: cannot read the golden set: No such file or directory"
    ]
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"id": "\xff"}\n')
    (problem,) = problems_of(binary)
    assert problem.startswith(f"{binary}: not UTF-8 text: ")


def test_a_flood_of_problems_is_capped(tmp_path: Path) -> None:
    path = write(tmp_path / "golden.jsonl", "nope\n" * 80)
    problems = problems_of(path)
    assert len(problems) == 51 and problems[-1] == "... and 30 more"


def test_the_built_in_set_grades_as_it_always_did() -> None:
    for item in GOLDEN_SET:
        assert item.matcher is None
        for answer in (item.reference, item.wrong, f"{item.reference} or {item.wrong}"):
            assert grade_item(answer, item) is grade(answer, item.expected)


def test_written_lines_load_back(tmp_path: Path) -> None:
    items = load_golden_set(write(tmp_path / "a.jsonl", GOOD))
    again = load_golden_set(write(tmp_path / "b.jsonl", golden_lines(items)))
    assert again == items
    with pytest.raises(ValueError, match="no file form"):
        golden_lines(GOLDEN_SET[:1])


# ---- properties of the matchers -----------------------------------------------------------

ASCII_WORD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
words = st.text(alphabet=ASCII_WORD, min_size=1, max_size=8)
texts = st.text(max_size=40)
numbers = st.decimals(
    min_value=-(10**6), max_value=10**6, places=3, allow_nan=False, allow_infinity=False
)
tolerances = st.decimals(min_value=0, max_value=1000, places=2)


@given(texts)
def test_exact_ignores_only_surrounding_whitespace(text: str) -> None:
    assert match(f" \t{text}\n", text, "exact")
    assert not match(text + "x", text, "exact")


@given(texts, texts)
def test_normalized_is_equality_of_normal_forms(answer: str, expected: str) -> None:
    assert match(answer, expected, "normalized") is (normalize(answer) == normalize(expected))
    assert match(f"  {expected}?!", expected, "normalized") is (
        normalize(f"{expected}?!") == normalize(expected)
    )


@given(st.lists(words, min_size=1, max_size=4), texts, texts)
def test_contains_finds_the_words_anywhere_in_order(
    phrase: list[str], before: str, after: str
) -> None:
    expected = " ".join(phrase)
    assert match(f"{before} {expected.upper()}, {after}", expected, "contains")
    # Distinct as the match sees them: it compares normal forms (case folded), so "J j" is one
    # word twice and reads the same backwards.
    if len(phrase) > 1 and len({normalize(word) for word in phrase}) == len(phrase):
        backwards = " ".join(reversed(phrase))
        assert not match(backwards, expected, "contains")


@given(texts)
def test_regex_is_re_search(answer: str) -> None:
    for pattern in (r"\d+", r"^a", r"(?i)yes"):
        assert match(answer, pattern, "regex") is (re.search(pattern, answer) is not None)
    assert match(answer, re.escape(answer), "regex")


@given(numbers, numbers, tolerances)
def test_numeric_tolerance_reads_the_last_number(first: object, last: object, tol: object) -> None:
    tolerance = float(str(tol))
    expected = str(last)
    assert match(f"First {first}, finally {last}.", expected, "numeric-tolerance", tolerance)
    beyond = float(expected) + tolerance + 0.5
    assert not match(f"{last} then {beyond:.3f}", expected, "numeric-tolerance", tolerance)


@given(numbers, tolerances)
def test_numeric_tolerance_is_symmetric_and_inclusive(value: object, tol: object) -> None:
    tolerance = float(str(tol))
    centre = float(str(value))
    for answer in (centre - tolerance, centre + tolerance):
        assert match(f"about {answer:.4f}", str(value), "numeric-tolerance", tolerance)
    assert not match("no number at all", str(value), "numeric-tolerance", tolerance)


def test_a_prompt_with_a_matcher_uses_it() -> None:
    item = GoldenPrompt("x", "What is 12 / 1?", "12", matcher="contains")
    assert grade_item("144 / 12 = 13", item)  # contains: the word 12 is there
    assert not grade("144 / 12 = 13", "12")  # the built-in rule reads the last number
