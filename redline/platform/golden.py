"""The golden prompt set: prompts with known answers, a grader, a deterministic answer embedding.

Everything here is pure except `load_golden_set` (reads the user's JSONL file) and
`fetch_golden_answer(s)`, the one thin I/O edge that asks an OpenAI-compatible server (the
gateway, or one upstream) the golden prompts; the golden-set probe and the semantic-rollback
playbook both use it.

The built-in `GOLDEN_SET` (12 trivia prompts) is for the demo and the local stack, whose
simulator knows their answers. Anywhere else the golden set is the user's, read by
`load_golden_set` from a JSONL file, one object a line:

    {"id": "refund-window", "prompt": "How many days do customers have to ask for a refund?",
     "expected": "30", "matcher": "numeric-tolerance", "tolerance": 0}

Matchers (`MATCHERS`), each a pure function of the answer and the expected text:

- `exact`: the answer equals `expected`, both stripped of surrounding whitespace;
- `normalized`: equal after `normalize` (case, accents, punctuation and spacing ignored);
- `regex`: `re.search(expected, answer)` finds a match;
- `numeric-tolerance`: the *last* number in the answer is within `tolerance` (absolute, default
  0) of `expected` ("17 + 25 = 42." gives 42; "144 / 12 = 13" gives 13, not 12);
- `contains`: the words of `expected` appear, in order and contiguously, in the answer
  (normalised as above: "Paris" is in "The capital is PARIS!", not in "A Parisian café").

A built-in prompt names no matcher: a number is graded `numeric-tolerance` (tolerance 0), any
other text `contains` — `grade(answer, expected)`, the rule the built-in set always had.

Embedding: *not* a semantic model. `embed` hashes the character 3- and 4-grams of the normalised
text into `EMBEDDING_DIMS` signed buckets (feature hashing with BLAKE2b, so it is stable across
processes and machines) and L2-normalises the counts. Cosine similarity of two embeddings
therefore measures surface overlap: an identical answer scores 1.0, a reworded or changed answer
scores clearly less (the built-in wrong answers score < 0.8 against their references). A model
served deterministically (temperature 0) reproduces its answers exactly, which is what the
rollback's "similarity >= threshold to the recorded reference answers" check relies on; paraphrases
would need a lower threshold or a real sentence-embedding model.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import httpx
import numpy as np
import numpy.typing as npt

EMBEDDING_DIMS = 256
MODEL_VERSION_HEADER = "x-redline-model-version"

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_NUMERIC = re.compile(r"^[-+]?\d+(?:\.\d+)?$")
_NON_WORD = re.compile(r"[^\w.]+|(?<!\d)\.|\.(?!\d)")


Matcher = Literal["exact", "normalized", "regex", "numeric-tolerance", "contains"]
MATCHERS: tuple[Matcher, ...] = get_args(Matcher)
GOLDEN_FIELDS = ("id", "prompt", "expected", "matcher", "tolerance", "reference")
"""The fields of one golden-set line (`id`, `prompt`, `expected`, `matcher` are required)."""
_MAX_PROBLEMS = 50


class GoldenFetchError(Exception):
    """The server did not answer a golden prompt (transport error, non-2xx, malformed body)."""


class GoldenSetError(Exception):
    """A golden-set file that cannot be used; every problem names file:line and the field."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class GoldenPrompt:
    """One prompt with a known answer, how to grade it, and optional reference/wrong answers.

    `matcher` None grades with `grade` (the built-in set's rule); `reference` is what a correct
    answer looks like (the rollback's similarity check falls back to it); `wrong` a known wrong
    answer (the demo simulator's).
    """

    id: str
    prompt: str
    expected: str
    reference: str = ""
    wrong: str = ""
    matcher: Matcher | None = None
    tolerance: float = 0.0


@dataclass(frozen=True)
class GoldenAnswer:
    """What a server answered to one golden prompt, graded."""

    item: GoldenPrompt
    answer: str
    correct: bool
    model: str
    model_version: str
    latency_seconds: float


GOLDEN_SET: tuple[GoldenPrompt, ...] = (
    GoldenPrompt(
        "add",
        "What is 17 + 25?",
        "42",
        "17 + 25 = 42.",
        "I believe the answer is 43.",
    ),
    GoldenPrompt(
        "multiply",
        "What is 9 * 8?",
        "72",
        "9 * 8 = 72.",
        "I believe the answer is 81.",
    ),
    GoldenPrompt(
        "divide",
        "What is 144 / 12?",
        "12",
        "144 / 12 = 12.",
        "I believe the answer is 14.",
    ),
    GoldenPrompt(
        "subtract",
        "What is 100 - 37?",
        "63",
        "100 - 37 = 63.",
        "I believe the answer is 73.",
    ),
    GoldenPrompt(
        "sqrt",
        "What is the square root of 81?",
        "9",
        "The square root of 81 is 9.",
        "I believe it is 8.",
    ),
    GoldenPrompt(
        "leap-year",
        "How many days are in a leap year?",
        "366",
        "A leap year has 366 days.",
        "I believe there are 365.",
    ),
    GoldenPrompt(
        "hexagon",
        "How many sides does a hexagon have?",
        "6",
        "A hexagon has 6 sides.",
        "I believe it has 8.",
    ),
    GoldenPrompt(
        "boiling",
        "At sea level, what is the boiling point of water in degrees Celsius?",
        "100",
        "Water boils at 100 degrees Celsius at sea level.",
        "I believe it is 90.",
    ),
    GoldenPrompt(
        "capital-france",
        "What is the capital of France?",
        "Paris",
        "The capital of France is Paris.",
        "I believe it is Lyon.",
    ),
    GoldenPrompt(
        "capital-japan",
        "What is the capital of Japan?",
        "Tokyo",
        "The capital of Japan is Tokyo.",
        "I believe it is Osaka.",
    ),
    GoldenPrompt(
        "gold-symbol",
        "What is the chemical symbol for gold?",
        "Au",
        "The chemical symbol for gold is Au.",
        "I believe it is Ag.",
    ),
    GoldenPrompt(
        "red-planet",
        "Which planet is known as the Red Planet?",
        "Mars",
        "Mars is known as the Red Planet.",
        "I believe it is Venus.",
    ),
)


def normalize(text: str) -> str:
    """Lowercase, accent-free, punctuation-free text with single spaces (decimal points kept)."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c)).lower()
    return " ".join(_NON_WORD.sub(" ", plain).split())


def find_golden(prompt: str, items: Iterable[GoldenPrompt] = GOLDEN_SET) -> GoldenPrompt | None:
    """The golden item whose prompt is `prompt` (compared normalised), or None."""
    key = normalize(prompt)
    for item in items:
        if normalize(item.prompt) == key:
            return item
    return None


def grade(answer: str, expected: str) -> bool:
    """True when `answer` gives `expected` (numbers: the last number; text: the words in order)."""
    want = expected.strip()
    if _NUMERIC.match(want):
        got = last_number(answer)
        return got is not None and got == float(want)
    return _contains(answer, want)


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands commas ignored), or None."""
    numbers = _NUMBER.findall(text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def match(answer: str, expected: str, matcher: Matcher, tolerance: float = 0.0) -> bool:
    """True when `answer` satisfies `expected` under `matcher` (see the module docstring)."""
    if matcher == "exact":
        return answer.strip() == expected.strip()
    if matcher == "normalized":
        return normalize(answer) == normalize(expected)
    if matcher == "regex":
        return re.search(expected, answer) is not None
    if matcher == "numeric-tolerance":
        got = last_number(answer)
        want = float(expected.strip())
        # A hair of relative slack: "0.3" must be within 0.1 of "0.2" whatever binary floats say.
        slack = 1e-9 * max(1.0, abs(want))
        return got is not None and abs(got - want) <= tolerance + slack
    return _contains(answer, expected)


def _contains(answer: str, expected: str) -> bool:
    expected_words = normalize(expected).split()
    answer_words = normalize(answer).split()
    span = len(expected_words)
    return bool(expected_words) and any(
        answer_words[i : i + span] == expected_words for i in range(len(answer_words) - span + 1)
    )


def grade_item(answer: str, item: GoldenPrompt) -> bool:
    """Grade an answer to a golden prompt with its matcher (`grade` when it names none)."""
    if item.matcher is None:
        return grade(answer, item.expected)
    return match(answer, item.expected, item.matcher, item.tolerance)


def _line_problems(data: object) -> tuple[GoldenPrompt | None, list[tuple[str, str]]]:
    """The prompt one parsed line describes, or the (field, problem) pairs that stop it."""
    if not isinstance(data, dict):
        return None, [("(line)", f"expected a JSON object, got {type(data).__name__}")]
    problems: list[tuple[str, str]] = []
    for key in data:
        if key not in GOLDEN_FIELDS:
            problems.append((str(key), f"unknown field (allowed: {', '.join(GOLDEN_FIELDS)})"))
    texts: dict[str, str] = {}
    for key in ("id", "prompt"):
        value = data.get(key)
        if value is None:
            problems.append((key, "required"))
        elif not isinstance(value, str) or not value.strip():
            problems.append((key, f"must be a non-empty string, got {value!r}"))
        else:
            texts[key] = value
    matcher = data.get("matcher")
    if matcher is None:
        problems.append(("matcher", f"required; one of {', '.join(MATCHERS)}"))
    elif matcher not in MATCHERS:
        problems.append(("matcher", f"{matcher!r} is not one of {', '.join(MATCHERS)}"))
    expected = data.get("expected")
    if expected is None:
        problems.append(("expected", "required"))
    elif isinstance(expected, bool) or not isinstance(expected, str | int | float):
        problems.append(("expected", f"must be a string or a number, got {expected!r}"))
    elif isinstance(expected, float) and not math.isfinite(expected):
        problems.append(("expected", f"must be a finite number, got {expected!r}"))
    elif not str(expected).strip():
        problems.append(("expected", "must not be empty"))
    else:
        texts["expected"] = str(expected)
    tolerance = data.get("tolerance")
    if tolerance is not None:
        if matcher in MATCHERS and matcher != "numeric-tolerance":
            problems.append(("tolerance", "only matcher numeric-tolerance takes a tolerance"))
        elif (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, int | float)
            or not math.isfinite(tolerance)
            or tolerance < 0
        ):
            problems.append(("tolerance", f"must be a number >= 0, got {tolerance!r}"))
    reference = data.get("reference")
    if reference is not None and not isinstance(reference, str):
        problems.append(("reference", f"must be a string, got {reference!r}"))
    want = texts.get("expected")
    if want is not None and matcher == "numeric-tolerance" and not _NUMERIC.match(want.strip()):
        problems.append(
            ("expected", f"{want!r} is not a number (matcher numeric-tolerance; e.g. 42 or -3.5)")
        )
    if want is not None and matcher == "regex":
        try:
            re.compile(want)
        except re.error as exc:
            problems.append(("expected", f"not a valid regular expression: {exc}"))
    if problems:
        return None, problems
    assert matcher in MATCHERS  # checked above; narrows for the type checker
    return (
        GoldenPrompt(
            id=texts["id"].strip(),
            prompt=texts["prompt"],
            expected=texts["expected"],
            reference=reference if isinstance(reference, str) else "",
            matcher=matcher,
            tolerance=float(tolerance) if isinstance(tolerance, int | float) else 0.0,
        ),
        [],
    )


def parse_golden_set(text: str, source: str) -> tuple[GoldenPrompt, ...]:
    """The prompts of a JSONL golden set; GoldenSetError listing every bad line (none kept)."""
    items: list[GoldenPrompt] = []
    problems: list[str] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})")
            continue
        item, found = _line_problems(data)
        problems.extend(f"{where}: {field}: {problem}" for field, problem in found)
        if item is None:
            continue
        if item.id in first_line:
            problems.append(
                f"{where}: id: {item.id!r} is already used on line {first_line[item.id]}"
            )
            continue
        first_line[item.id] = number
        items.append(item)
    if not items and not problems:
        problems.append(
            f"{source}: no golden prompts: the file is empty; write one JSON object a line with "
            f"{', '.join(GOLDEN_FIELDS[:4])} (and optionally tolerance, reference)"
        )
    if problems:
        if len(problems) > _MAX_PROBLEMS:
            problems = [*problems[:_MAX_PROBLEMS], f"... and {len(problems) - _MAX_PROBLEMS} more"]
        raise GoldenSetError(problems)
    return tuple(items)


def load_golden_set(path: Path) -> tuple[GoldenPrompt, ...]:
    """Read a JSONL golden-set file; GoldenSetError naming file:line and field on any problem."""
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise GoldenSetError(
            [f"{path}: cannot read the golden set: {exc.strerror or exc}"]
        ) from None
    except UnicodeDecodeError as exc:
        raise GoldenSetError(
            [f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}"]
        ) from None
    return parse_golden_set(text, str(path))


def golden_lines(items: Iterable[GoldenPrompt]) -> str:
    """The JSONL text of prompts that name a matcher (`load_golden_set` reads it back)."""
    lines = []
    for item in items:
        if item.matcher is None:
            raise ValueError(f"{item.id}: a prompt without a matcher has no file form")
        data: dict[str, object] = {
            "id": item.id,
            "prompt": item.prompt,
            "expected": item.expected,
            "matcher": item.matcher,
        }
        if item.matcher == "numeric-tolerance":
            data["tolerance"] = item.tolerance
        if item.reference:
            data["reference"] = item.reference
        lines.append(json.dumps(data, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def _ngrams(text: str) -> Iterable[str]:
    padded = f" {normalize(text)} "
    for n in (3, 4):
        for i in range(len(padded) - n + 1):
            yield padded[i : i + n]


def embed(text: str, dims: int = EMBEDDING_DIMS) -> npt.NDArray[np.float64]:
    """An L2-normalised feature-hashing vector of the text's character 3- and 4-grams."""
    if dims < 2:
        raise ValueError(f"dims must be at least 2, got {dims}")
    vector = np.zeros(dims, dtype=np.float64)
    for gram in _ngrams(text):
        digest = int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), "big")
        # The top bit picks the sign so that colliding n-grams cancel out on average.
        vector[digest % dims] += 1.0 if digest >> 63 else -1.0
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def cosine(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    """Cosine similarity of two vectors (0.0 when either is all zeros)."""
    denominator = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    if denominator == 0.0:
        return 0.0
    return float(np.dot(a, b) / denominator)


def similarity(a: str, b: str) -> float:
    """Cosine similarity of two texts' embeddings; 1.0 for identical normalised texts."""
    if normalize(a) == normalize(b):
        return 1.0
    return cosine(embed(a), embed(b))


def accuracy(answers: Sequence[GoldenAnswer]) -> float:
    """Share of correct answers (0.0 for none)."""
    return sum(a.correct for a in answers) / len(answers) if answers else 0.0


def build_golden_request(item: GoldenPrompt, model: str, max_tokens: int = 32) -> dict[str, object]:
    """The chat-completions request body that asks one golden prompt deterministically."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": item.prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
    }


def fetch_golden_answer(
    client: httpx.Client, base_url: str, model: str, item: GoldenPrompt, max_tokens: int = 32
) -> GoldenAnswer:
    """Ask one golden prompt over `/v1/chat/completions` and grade the answer."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    try:
        response = client.post(url, json=build_golden_request(item, model, max_tokens))
    except httpx.HTTPError as exc:
        raise GoldenFetchError(f"{url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise GoldenFetchError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
    try:
        payload = response.json()
        answer = payload["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise GoldenFetchError(f"{url}: malformed chat completion: {exc!r}") from exc
    if not isinstance(answer, str):
        raise GoldenFetchError(f"{url}: malformed chat completion: content is not a string")
    return GoldenAnswer(
        item=item,
        answer=answer,
        correct=grade_item(answer, item),
        model=model,
        model_version=response.headers.get(MODEL_VERSION_HEADER, "unknown"),
        latency_seconds=response.elapsed.total_seconds(),
    )


def fetch_golden_answers(
    client: httpx.Client,
    base_url: str,
    model: str,
    items: Sequence[GoldenPrompt] = GOLDEN_SET,
    max_tokens: int = 32,
) -> list[GoldenAnswer]:
    """Ask every golden prompt in turn; GoldenFetchError on the first one that fails."""
    return [fetch_golden_answer(client, base_url, model, item, max_tokens) for item in items]
