"""The default intent classifier: accuracy on the held-out part of the shipped examples, on
prompts written apart from them, the rules, and the user hook."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from redline.gateway.intent import (
    IntentConfigError,
    build_default_classifier,
    load_classifier,
    parse_examples,
    prompt_parts,
    rule_intent,
    shipped_examples,
    split_examples,
)
from redline.slo.spec import INTENT_NAMES

ACCURACY_BAR = 0.9
"""The default classifier's accuracy on the held-out split must reach this."""

# Written apart from the shipped set's templates (no phrase of it copied).
UNSEEN = [
    ("sql", "how many distinct customers placed an order in march? table orders(customer_id, ts)"),
    ("translate", "could you put 'good luck with the launch' into Portuguese"),
    ("summarise", "give me the three main conclusions of the report pasted below"),
    ("code", "my python loop over a dict raises RuntimeError: dictionary changed size"),
    ("chat", "what's a fun board game for four people?"),
    ("extraction", "list every email address that appears in this text: a@b.io, c@d.org"),
    ("chat", "good evening, how was your day?"),
    ("code", "write a go function that checks whether a string is a palindrome"),
    ("sql", "SELECT name FROM users WHERE created_at > now() - interval '7 days' is slow, why"),
    ("summarise", "tl;dr this thread for me"),
]


def _payload(text: str, system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {"model": "m", "messages": messages}


def test_the_shipped_set_covers_every_intent_with_a_few_hundred_prompts() -> None:
    examples = shipped_examples()
    assert len(examples) >= 300
    assert {e.intent for e in examples} == set(INTENT_NAMES)
    assert min(sum(e.intent == i for e in examples) for i in INTENT_NAMES) >= 50


def test_held_out_accuracy_reaches_the_bar() -> None:
    train, held = split_examples(shipped_examples())
    assert not {e.text for e in train} & {e.text for e in held}
    classifier = build_default_classifier(train)
    right = sum(classifier.classify_text(e.text) == e.intent for e in held)
    assert right / len(held) >= ACCURACY_BAR
    # The model alone (no rules) is held to the same bar.
    classifier.use_rules = False
    right = sum(classifier.classify_text(e.text) == e.intent for e in held)
    assert right / len(held) >= ACCURACY_BAR


def test_prompts_unlike_the_shipped_ones_are_mostly_right() -> None:
    classifier = build_default_classifier()
    right = sum(classifier.classify(_payload(text)) == intent for intent, text in UNSEEN)
    assert right >= 8, [(i, classifier.classify(_payload(t))) for i, t in UNSEEN]


def test_training_is_deterministic() -> None:
    one, two = build_default_classifier(), build_default_classifier()
    assert one.model.log_probs == two.model.log_probs


def test_rules_read_the_system_message_and_the_head_of_a_long_prompt() -> None:
    assert rule_intent("You write PostgreSQL for analysts.", "top customers?") == "sql"
    long_doc = "Summarise this:\n" + "the quick brown fox jumps. " * 2000
    assert build_default_classifier().classify(_payload(long_doc)) == "summarise"
    assert prompt_parts({"prompt": "translate this"}) == ("", "translate this")
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert prompt_parts(parts) == ("", "hi")


def test_a_bad_example_line_names_the_line_and_field() -> None:
    with pytest.raises(IntentConfigError, match=r"x.jsonl: line 2: intent: 'poetry'"):
        parse_examples(['{"intent": "chat", "text": "hi"}', '{"intent": "poetry", "text": "a"}'],
                       "x.jsonl")  # fmt: skip
    with pytest.raises(IntentConfigError, match="line 1: not JSON"):
        parse_examples(["{"], "x.jsonl")


@pytest.fixture()
def user_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("redline_test_intents")
    module.always_sql = lambda payload: "sql"  # type: ignore[attr-defined]
    module.nonsense = lambda payload: "poetry"  # type: ignore[attr-defined]
    module.not_callable = 3  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_the_user_hook_is_used_and_its_unknown_answers_fall_back(
    user_module: types.ModuleType,
) -> None:
    assert load_classifier("redline_test_intents:always_sql").classify(_payload("hi")) == "sql"
    fallback = load_classifier("redline_test_intents:nonsense")
    assert fallback.classify(_payload("translate 'hello' into German")) == "translate"
    with pytest.raises(IntentConfigError, match="neither a callable"):
        load_classifier("redline_test_intents:not_callable")
    with pytest.raises(IntentConfigError, match="cannot load"):
        load_classifier("redline_test_intents:missing")
    with pytest.raises(IntentConfigError, match="not 'module:attribute'"):
        load_classifier("redline_test_intents")
