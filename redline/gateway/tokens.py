"""Token estimation before generation (design notes 4.2): what a request will cost.

Prompt tokens come from, in order of preference:

- `tiktoken`, when it is installed and the gateway's `tokenizer` setting names an encoding
  (`tiktoken:cl100k_base`); tiktoken fetches its rank file once, so an air-gapped gateway needs
  its cache (`TIKTOKEN_CACHE_DIR`) filled beforehand;
- a HuggingFace `tokenizers` file (`tokenizer_file`, the model's `tokenizer.json`), when the
  package is installed;
- else `WordEstimator`: words, CJK characters and punctuation runs weighed by a calibration
  that the gateway keeps learning per model from the usage upstreams report (an exponentially
  weighted ratio of reported to estimated prompt tokens), so it converges on whatever tokenizer
  the upstream runs. A tokenizer's counts are used as they are (no per-model factor).

Expected completion tokens: the `completion_quantile` of the intent's recent completions (a ring
of the last `WINDOW` per intent, re-sorted every `RESORT_EVERY` samples), capped by the
request's `max_tokens`; `default_completion_tokens` (capped likewise) until an intent has
`MIN_SAMPLES`.

A configured tokenizer that fails to load stops the gateway with a `TokenizerConfigError` naming
the setting and the file.
"""

from __future__ import annotations

import importlib
import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from redline.gateway.intent import prompt_parts

WINDOW = 512
RESORT_EVERY = 16
MIN_SAMPLES = 8
MESSAGE_OVERHEAD = 4
"""Tokens a chat template adds per message (role markers) when a tokenizer counts the text."""
_WORDS = re.compile(r"[A-Za-z0-9_']+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_PUNCT = re.compile(r"[^\sA-Za-z0-9_'\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]+")


class TokenizerConfigError(Exception):
    """The configured tokenizer cannot be loaded (missing package, unreadable file)."""


class TokenCounter(Protocol):
    """Counts the tokens of a text."""

    def count(self, text: str) -> int:
        """Tokens in `text`."""
        ...


@dataclass
class WordEstimator:
    """Tokens from the text's shape: words x `per_word` + CJK characters x `per_cjk` +
    punctuation runs x `per_punct`; `calibrated` multiplies in a learnt per-model factor."""

    per_word: float = 1.0
    per_cjk: float = 1.0
    per_punct: float = 0.5
    learn_rate: float = 0.1
    factors: dict[str, float] = field(default_factory=dict)

    def count(self, text: str) -> int:
        """The uncalibrated estimate."""
        raw = (
            len(_WORDS.findall(text)) * self.per_word
            + len(_CJK.findall(text)) * self.per_cjk
            + len(_PUNCT.findall(text)) * self.per_punct
        )
        return max(1, round(raw)) if text else 0

    def calibrated(self, model: str, raw: int) -> int:
        """`raw` times the model's learnt factor."""
        return max(0, round(raw * self.factors.get(model, 1.0)))

    def learn(self, model: str, raw: int, actual: int) -> None:
        """Move the model's factor toward actual / raw (bounded to [0.25, 4])."""
        if raw <= 0 or actual <= 0:
            return
        ratio = min(4.0, max(0.25, actual / raw))
        old = self.factors.get(model)
        self.factors[model] = ratio if old is None else old + self.learn_rate * (ratio - old)


class _Tiktoken:
    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding

    def count(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=()))


class _HfTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_tokenizer(tokenizer: str | None, tokenizer_file: Path | None) -> TokenCounter | None:
    """The tokenizer the settings name (None: the word estimator); TokenizerConfigError naming
    the setting and file when it cannot be loaded."""
    if tokenizer_file is not None:
        try:
            module = importlib.import_module("tokenizers")
        except ImportError:
            raise TokenizerConfigError(
                f"tokenizer_file: {tokenizer_file}: the 'tokenizers' package is not installed "
                "(pip install tokenizers), or unset tokenizer_file to use the word estimator"
            ) from None
        try:
            return _HfTokenizer(module.Tokenizer.from_file(str(tokenizer_file)))
        except Exception as exc:  # noqa: BLE001 - the Rust binding raises bare Exception
            raise TokenizerConfigError(
                f"tokenizer_file: {tokenizer_file}: cannot load a tokenizers JSON file: {exc}"
            ) from None
    if tokenizer is None:
        return None
    kind, _, name = tokenizer.partition(":")
    if kind != "tiktoken" or not name:
        raise TokenizerConfigError(
            f"tokenizer: {tokenizer!r} is not 'tiktoken:<encoding>' (e.g. tiktoken:cl100k_base)"
        )
    try:
        module = importlib.import_module("tiktoken")
    except ImportError:
        raise TokenizerConfigError(
            f"tokenizer: {tokenizer}: the 'tiktoken' package is not installed"
        ) from None
    try:
        return _Tiktoken(module.get_encoding(name))
    except Exception as exc:  # noqa: BLE001 - unknown name (ValueError) or a failed download
        raise TokenizerConfigError(f"tokenizer: {tokenizer}: cannot load: {exc}") from None


def prompt_text(payload: Mapping[str, Any]) -> tuple[str, int]:
    """Every message's text joined, and the number of messages (a completion's prompt: 1)."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        texts = []
        for message in messages:
            if isinstance(message, dict):
                content = message.get("content")
                if isinstance(content, str):
                    texts.append(content)
                elif isinstance(content, list):
                    texts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return "\n".join(texts), len(messages)
    return prompt_parts(payload)[1], 1


class CompletionQuantiles:
    """The running `quantile` of recent completion lengths, per intent."""

    def __init__(self, quantile: float, default: int) -> None:
        self.quantile = quantile
        self.default = default
        self._recent: dict[str, deque[int]] = {}
        self._since_sort: dict[str, int] = {}
        self._value: dict[str, int] = {}

    def observe(self, intent: str, tokens: int) -> None:
        """Add one finished request's completion tokens."""
        ring = self._recent.setdefault(intent, deque(maxlen=WINDOW))
        ring.append(tokens)
        since = self._since_sort.get(intent, RESORT_EVERY) + 1
        if since >= RESORT_EVERY or intent not in self._value:
            ordered = sorted(ring)
            self._value[intent] = ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]
            since = 0
        self._since_sort[intent] = since

    def expected(self, intent: str, max_tokens: int | None) -> int:
        """The expected completion of a request of `intent`, capped by its max_tokens."""
        ring = self._recent.get(intent)
        value = self._value.get(intent) if ring is not None and len(ring) >= MIN_SAMPLES else None
        guess = self.default if value is None else value
        return guess if max_tokens is None else min(guess, max_tokens)


@dataclass(frozen=True)
class Estimate:
    """A request's estimated tokens before it runs."""

    prompt: int
    completion: int
    raw_prompt: int
    """The word estimator's uncalibrated count (what its calibration learns from); or the
    tokenizer's count."""

    @property
    def total(self) -> int:
        """Prompt + completion."""
        return self.prompt + self.completion


class TokenEstimator:
    """Prompt tokens (tokenizer or calibrated words) and expected completion tokens."""

    def __init__(
        self, counter: TokenCounter | None, quantile: float = 0.9, default_completion: int = 256
    ) -> None:
        self.counter = counter
        self.words = WordEstimator()
        self.completions = CompletionQuantiles(quantile, default_completion)

    def estimate(
        self, payload: Mapping[str, Any], model: str, intent: str, max_tokens: int | None
    ) -> Estimate:
        """The request's estimate."""
        text, messages = prompt_text(payload)
        if self.counter is not None:
            prompt = self.counter.count(text) + MESSAGE_OVERHEAD * messages
            raw = prompt
        else:
            raw = self.words.count(text)
            prompt = self.words.calibrated(model, raw)
        return Estimate(prompt, self.completions.expected(intent, max_tokens), raw)

    def learn(
        self,
        estimate: Estimate,
        model: str,
        intent: str,
        prompt: int | None,
        completion: int | None,
    ) -> None:
        """Feed the usage the upstream reported back into the calibration and the quantiles."""
        if prompt is not None and self.counter is None:
            self.words.learn(model, estimate.raw_prompt, prompt)
        if completion is not None:
            self.completions.observe(intent, completion)


def error_ratio(estimate: int, actual: int) -> float | None:
    """(estimate - actual) / actual; None when nothing was used."""
    if actual <= 0:
        return None
    ratio = (estimate - actual) / actual
    return ratio if math.isfinite(ratio) else None
