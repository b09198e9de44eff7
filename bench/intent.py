"""Intent classifier accuracy and token estimator error, on the shipped example set.

Classifier: trained on 4/5 of `redline/gateway/data/intents.jsonl`, scored on the held-out 1/5
(every 5th line): rules + naive Bayes (the gateway's default), the model alone, the rules alone
(coverage and precision where they fire), plus the per-request classification time.

Estimator: prompt-token estimates before generation against two references:

- redline's simulator, whose `usage.prompt_tokens` counts whitespace-separated words (the local
  stack's upstream: this is what the live `llm_token_estimate_error_ratio` measures there);
- OpenAI's cl100k_base through `tiktoken`, when it is installed and the rank file is at hand
  (`--cl100k FILE`: a `.tiktoken` rank file, or the `encoders/cl100k_base.json` of the npm
  package `tiktoken`; tiktoken's own download needs the internet).

Each reference is scored uncalibrated and after the word estimator has learnt the reference's
per-model factor from the training split's usage (what the gateway does online), on the held-out
split. Prints p50/p95 of |estimate - actual| / actual.

Run: `.venv/bin/python -m bench.intent [--cl100k FILE]`.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.figures import Figure, exit_code, info
from redline.gateway.intent import (
    Example,
    build_default_classifier,
    rule_intent,
    shipped_examples,
    split_examples,
)
from redline.gateway.tokens import WordEstimator
from redline.slo.spec import INTENT_NAMES

CL100K_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"""
    r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def classifier_report(train: list[Example], held: list[Example]) -> list[Figure]:
    """Accuracy of the default classifier, the model alone and the rules alone."""
    classifier = build_default_classifier(train)
    started = time.perf_counter()
    answers = [classifier.classify_text(e.text) for e in held]
    per_request_us = (time.perf_counter() - started) / len(held) * 1e6
    right = sum(a == e.intent for a, e in zip(answers, held, strict=True))
    classifier.use_rules = False
    model_right = sum(classifier.classify_text(e.text) == e.intent for e in held)
    fired = [(rule_intent("", e.text), e.intent) for e in held]
    fired = [(got, want) for got, want in fired if got is not None]
    print(f"intent classifier: {len(train)} training prompts, {len(held)} held out")
    print(f"  rules + naive Bayes: {right}/{len(held)} = {right / len(held):.1%}")
    print(f"  naive Bayes alone:   {model_right}/{len(held)} = {model_right / len(held):.1%}")
    precise = sum(got == want for got, want in fired)
    print(
        f"  rules alone: fire on {len(fired)}/{len(held)}, right on {precise}/{len(fired)}"
        if fired
        else "  rules alone: never fire"
    )
    for intent in INTENT_NAMES:
        mine = [(a, e) for a, e in zip(answers, held, strict=True) if e.intent == intent]
        ok = sum(a == e.intent for a, e in mine)
        print(f"    {intent:<11} {ok}/{len(mine)}")
    print(f"  classification: {per_request_us:.1f} us per prompt (rules + model)")
    return [
        info("intent", "held-out accuracy, rules + naive Bayes", 100 * right / len(held), "%"),
        info("intent", "held-out accuracy, naive Bayes alone", 100 * model_right / len(held), "%"),
        info("intent", "classification per prompt", per_request_us, "us"),
    ]


def _load_cl100k(path: Path) -> Callable[[str], int] | None:
    try:
        import tiktoken  # noqa: PLC0415 - optional
    except ImportError:
        print("  cl100k_base: tiktoken is not installed (pip install tiktoken)")
        return None
    ranks: dict[bytes, int] = {}
    if path.suffix == ".json":  # the npm package's format: "<name> <offset> <b64> <b64> ..."
        data = json.loads(path.read_text())
        for line in data["bpe_ranks"].splitlines():
            _, offset, *tokens = line.split(" ")
            for index, token in enumerate(tokens):
                ranks[base64.b64decode(token)] = int(offset) + index
        special = data["special_tokens"]
    else:
        from tiktoken.load import load_tiktoken_bpe  # noqa: PLC0415 - optional

        ranks = load_tiktoken_bpe(str(path))
        special = {"<|endoftext|>": 100257}
    encoding = tiktoken.Encoding(
        "cl100k_base", pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens=special
    )
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def _errors(
    estimator: WordEstimator, model: str, texts: Sequence[str], actual: Callable[[str], int]
) -> list[float]:
    errors = []
    for text in texts:
        truth = actual(text)
        if truth > 0:
            estimate = estimator.calibrated(model, estimator.count(text))
            errors.append(abs(estimate - truth) / truth)
    return errors


def estimator_report(
    train: list[Example], held: list[Example], cl100k: Path | None
) -> list[Figure]:
    """p50/p95 relative error of the word estimator against each reference."""
    figures = []
    references: dict[str, Callable[[str], int]] = {
        "simulator (whitespace words)": lambda text: len(text.split())
    }
    if cl100k is not None:
        counter = _load_cl100k(cl100k)
        if counter is not None:
            references["tiktoken cl100k_base"] = counter
    else:
        print("  cl100k_base: not measured (pass --cl100k FILE)")
    print("token estimator |estimate - actual| / actual on the held-out prompts:")
    print(f"  {'reference':<30}{'calibration':<14}{'p50':>8}{'p95':>8}")
    for name, actual in references.items():
        estimator = WordEstimator()
        before = _errors(estimator, name, [e.text for e in held], actual)
        for example in train:  # what the gateway learns from each response's usage
            estimator.learn(name, estimator.count(example.text), actual(example.text))
        after = _errors(estimator, name, [e.text for e in held], actual)
        for label, errors in (("none", before), ("learnt", after)):
            print(
                f"  {name:<30}{label:<14}{_quantile(errors, 0.5):>8.1%}"
                f"{_quantile(errors, 0.95):>8.1%}"
            )
        print(f"  {name}: learnt factor {estimator.factors.get(name, 1.0):.3f}")
        label = f"token estimate p95 error vs {name}, learnt"
        figures.append(info("intent", label, 100 * _quantile(after, 0.95), "%"))
    return figures


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run both parts, print the figures; return them."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cl100k", type=Path, default=None, help="cl100k_base rank file")
    args = parser.parse_args(argv)
    train, held = split_examples(shipped_examples())
    return classifier_report(train, held) + estimator_report(train, held, args.cl100k)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
