"""The golden prompt set: prompts with known answers, a grader, a deterministic answer embedding.

Everything here is pure except `fetch_golden_answer(s)`, the one thin I/O edge that asks an
OpenAI-compatible server (the gateway, or one upstream) the golden prompts; the golden-set probe
and the semantic-rollback playbook both use it.

Grading: an expected answer that is a number is correct when it equals the *last* number in the
answer ("17 + 25 = 42." is right, "144 / 12 = 13" is wrong even though it contains 12); any other
expected answer is correct when its words appear, in order and contiguously, in the answer
(case, accents and punctuation ignored).

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
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx
import numpy as np
import numpy.typing as npt

EMBEDDING_DIMS = 256
MODEL_VERSION_HEADER = "x-redline-model-version"

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_NUMERIC = re.compile(r"^[-+]?\d+(?:\.\d+)?$")
_NON_WORD = re.compile(r"[^\w.]+|(?<!\d)\.|\.(?!\d)")


class GoldenFetchError(Exception):
    """The server did not answer a golden prompt (transport error, non-2xx, malformed body)."""


@dataclass(frozen=True)
class GoldenPrompt:
    """One prompt with a known answer: the expected answer, a reference and a wrong answer."""

    id: str
    prompt: str
    expected: str
    reference: str
    wrong: str


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
        numbers = _NUMBER.findall(answer.replace(",", ""))
        return bool(numbers) and float(numbers[-1]) == float(want)
    expected_words = normalize(want).split()
    answer_words = normalize(answer).split()
    if not expected_words:
        return False
    span = len(expected_words)
    return any(
        answer_words[i : i + span] == expected_words for i in range(len(answer_words) - span + 1)
    )


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
        correct=grade(answer, item.expected),
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
