"""Request intent classification (design notes 4.2): which quota a request draws from.

`IntentClassifier` is the contract: `classify(payload) -> intent`, one of the spec's
`INTENT_NAMES`. The default, `RulesAndBayes`, needs no model download: high-precision rules over
the messages first (a `SELECT ... FROM`, "translate", "summarise", a code fence), then a
multinomial naive Bayes over word unigrams and bigrams trained when it is built, deterministically,
from the labelled examples shipped in `redline/gateway/data/intents.jsonl` (a few hundred prompts).
Building it takes a few milliseconds; classifying a request a few microseconds per word of the
part of the prompt it reads (the system message and the first and last characters of the last
user message, so a long document to summarise costs no more than a short one).

A user's own classifier is named by the gateway's `intent_classifier` setting as
`module:attribute`: an object with `classify(payload)` or a plain callable taking the payload.
Its answers outside the known intents fall back to the default's (and are logged once).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, runtime_checkable

from redline.slo.spec import INTENT_NAMES

log = logging.getLogger(__name__)

DATA_FILE = "intents.jsonl"
"""The shipped labelled examples (package data of `redline.gateway`, under data/)."""
HOLDOUT_EVERY = 5
"""Every 5th example (by line) is held out of training when measuring accuracy."""
HEAD_CHARS = 600
TAIL_CHARS = 300
_WORD = re.compile(r"[a-z0-9_]+|[^\sa-z0-9_]", re.IGNORECASE)


class IntentConfigError(Exception):
    """The intent classifier cannot be built (a bad `module:attribute`, a bad example file)."""


@runtime_checkable
class IntentClassifier(Protocol):
    """Anything that names the intent of an OpenAI-style request body."""

    def classify(self, payload: Mapping[str, Any]) -> str:
        """The request's intent: one of `INTENT_NAMES`."""
        ...


@dataclass(frozen=True)
class Example:
    """One labelled prompt."""

    intent: str
    text: str


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def prompt_parts(payload: Mapping[str, Any]) -> tuple[str, str]:
    """(system text, last user text) of a chat request; ("", prompt) of a completion."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        system, user = [], ""
        for message in messages:
            if not isinstance(message, dict):
                continue
            text = _content_text(message.get("content"))
            if message.get("role") == "system":
                system.append(text)
            elif message.get("role") == "user":
                user = text
        return " ".join(system), user
    prompt = payload.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return "", prompt if isinstance(prompt, str) else ""


def focus(text: str) -> str:
    """The part of a prompt the classifier reads: its head and its tail."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + " " + text[-TAIL_CHARS:]


def features(text: str) -> list[str]:
    """Lower-cased word unigrams and bigrams (punctuation marks are words of their own)."""
    words = [w.lower() for w in _WORD.findall(text)]
    return words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]


# Checked in order, first match wins; each is precise enough to skip the model.
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("sql", re.compile(r"\bselect\b[\s\S]+\bfrom\b|\bsql\b|\bpostgres|\bmysql\b", re.I)),
    ("translate", re.compile(r"\btranslat(e|ion|ing)\b|\blocali[sz]e\b", re.I)),
    ("summarise", re.compile(r"\bsummar(y|ise|ize|ies)\b|\btl;?dr\b|\babstract for\b", re.I)),
    ("extraction", re.compile(r"\bextract\b|\bpull out\b|\bas a json array\b", re.I)),
    (
        "code",
        re.compile(
            r"```|\b(write|implement|refactor) (a |an |my )?\w+ (function|class|script)\b", re.I
        ),
    ),
)


def rule_intent(system: str, user: str) -> str | None:
    """The first rule matching the system message or the head of the user message; or None."""
    head = user[:HEAD_CHARS]
    for intent, pattern in RULES:
        if pattern.search(system) or pattern.search(head):
            return intent
    return None


class NaiveBayes:
    """Multinomial naive Bayes over `features`, additive smoothing `alpha`."""

    def __init__(self, examples: Iterable[Example], alpha: float = 0.5) -> None:
        counts: dict[str, Counter[str]] = {intent: Counter() for intent in INTENT_NAMES}
        docs: Counter[str] = Counter()
        for example in examples:
            counts[example.intent].update(features(example.text))
            docs[example.intent] += 1
        total_docs = sum(docs.values())
        if total_docs == 0:
            raise IntentConfigError("no labelled examples to train the intent classifier on")
        vocabulary = set().union(*counts.values())
        size = len(vocabulary) + 1
        self.priors: dict[str, float] = {}
        self.unseen: dict[str, float] = {}
        self.log_probs: dict[str, dict[str, float]] = {}
        for intent in INTENT_NAMES:
            denominator = sum(counts[intent].values()) + alpha * size
            self.priors[intent] = math.log((docs[intent] + alpha) / (total_docs + alpha * 6))
            self.unseen[intent] = math.log(alpha / denominator)
            self.log_probs[intent] = {
                term: math.log((n + alpha) / denominator) for term, n in counts[intent].items()
            }
        self.vocabulary = frozenset(vocabulary)
        # One row of per-intent log probabilities per term: a prediction is one lookup and
        # six additions per term.
        self.rows: dict[str, tuple[float, ...]] = {
            term: tuple(
                self.log_probs[intent].get(term, self.unseen[intent]) for intent in INTENT_NAMES
            )
            for term in vocabulary
        }

    def scores(self, text: str) -> dict[str, float]:
        """Log-posterior (up to a constant) of every intent."""
        totals = [self.priors[intent] for intent in INTENT_NAMES]
        rows = self.rows
        for term in features(text):
            row = rows.get(term)
            if row is not None:
                for index, value in enumerate(row):
                    totals[index] += value
        return dict(zip(INTENT_NAMES, totals, strict=True))

    def predict(self, text: str) -> str:
        """The most probable intent (ties: the first in INTENT_NAMES)."""
        scores = self.scores(text)
        return max(INTENT_NAMES, key=lambda intent: scores[intent])


class RulesAndBayes:
    """The default classifier: `RULES`, then the naive Bayes model."""

    def __init__(self, model: NaiveBayes, use_rules: bool = True) -> None:
        self.model = model
        self.use_rules = use_rules

    def classify(self, payload: Mapping[str, Any]) -> str:
        """The request's intent."""
        system, user = prompt_parts(payload)
        return self.classify_text(user, system)

    def classify_text(self, user: str, system: str = "") -> str:
        """The intent of a prompt's text."""
        if self.use_rules:
            found = rule_intent(system, user)
            if found is not None:
                return found
        return self.model.predict(focus(user) + (" " + system if system else ""))


def parse_examples(lines: Iterable[str], source: str) -> list[Example]:
    """Examples from JSON lines `{"intent": ..., "text": ...}`; IntentConfigError naming the
    file, line and field otherwise."""
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise IntentConfigError(f"{source}: line {number}: not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise IntentConfigError(f"{source}: line {number}: expected an object")
        intent, text = row.get("intent"), row.get("text")
        if intent not in INTENT_NAMES:
            raise IntentConfigError(
                f"{source}: line {number}: intent: {intent!r} is not one of "
                f"{', '.join(INTENT_NAMES)}"
            )
        if not isinstance(text, str) or not text.strip():
            raise IntentConfigError(f"{source}: line {number}: text: must be a non-empty string")
        examples.append(Example(intent, text))
    return examples


def shipped_examples() -> list[Example]:
    """The labelled examples shipped with the package."""
    path = resources.files("redline.gateway").joinpath("data", DATA_FILE)
    return parse_examples(path.read_text("utf-8").splitlines(), f"redline/gateway/data/{DATA_FILE}")


def split_examples(examples: Sequence[Example]) -> tuple[list[Example], list[Example]]:
    """(training, held out): every `HOLDOUT_EVERY`-th example is held out."""
    train = [e for i, e in enumerate(examples) if i % HOLDOUT_EVERY != 0]
    held = [e for i, e in enumerate(examples) if i % HOLDOUT_EVERY == 0]
    return train, held


def build_default_classifier(examples: Sequence[Example] | None = None) -> RulesAndBayes:
    """Rules + naive Bayes trained on `examples` (the shipped set when None)."""
    return RulesAndBayes(NaiveBayes(shipped_examples() if examples is None else examples))


class _UserClassifier:
    """A user's classifier, its unknown answers replaced by the default's."""

    def __init__(self, name: str, call: Callable[[Mapping[str, Any]], Any]) -> None:
        self.name = name
        self.call = call
        self.fallback: RulesAndBayes | None = None
        self.warned = False

    def classify(self, payload: Mapping[str, Any]) -> str:
        """The user's answer when it is a known intent, else the default classifier's."""
        answer = self.call(payload)
        if isinstance(answer, str) and answer in INTENT_NAMES:
            return answer
        if not self.warned:
            self.warned = True
            log.warning(
                "intent classifier %s answered %r, not one of %s: using the default's answer",
                self.name,
                answer,
                ", ".join(INTENT_NAMES),
            )
        if self.fallback is None:
            self.fallback = build_default_classifier()
        return self.fallback.classify(payload)


def load_classifier(spec: str | None) -> IntentClassifier:
    """The classifier `module:attribute` names (the default when None); IntentConfigError when
    it cannot be imported or is neither a classifier nor a callable."""
    if spec is None:
        return build_default_classifier()
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise IntentConfigError(
            f"intent_classifier: {spec!r} is not 'module:attribute' (e.g. mypkg.intents:classify)"
        )
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise IntentConfigError(f"intent_classifier: cannot load {spec!r}: {exc}") from None
    if isinstance(target, IntentClassifier):
        return _UserClassifier(spec, target.classify)
    if callable(target):
        return _UserClassifier(spec, target)
    raise IntentConfigError(
        f"intent_classifier: {spec!r} is neither a callable nor an object with classify()"
    )
