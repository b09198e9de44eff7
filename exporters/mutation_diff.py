"""The output-mutation probe's comparison (pure): an answer normalised into comparable tokens,
a Myers O(ND) diff against the accepted answer, its size, score and rendered hunks.

Normalisation applies the false-positive controls in order: whitelisted template fields are
masked (built-in names or `re:` regexes, each match one placeholder token such as `__uuid__`);
case is folded (NFKC, `casefold`) and punctuation and whitespace ignored (tokens are runs of word
characters); equivalent spellings map to the first spelling of their group (phrases, the longest
first).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

WHITELIST_PATTERNS: dict[str, str] = {
    # ISO 8601 and the common "2024-08-01 14:22:07" form, with fractions and a zone.
    "timestamp": r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
    r"(?:Z|[+-]\d{2}:?\d{2})?\b",
    "date": r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b",
    "time": r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?\b",
    "uuid": r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
    "hex": r"\b(?:0x)?[0-9a-fA-F]{8,}\b",
    "number": r"[-+]?\b\d+(?:[.,]\d+)*\b",
}
"""Built-in template fields a canary may whitelist by name (masked before comparison); the order
is the masking order, so a timestamp is masked whole before its numbers could be."""
WORD = re.compile(r"\w+")
"""A token: a run of word characters."""
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]+")


def compile_whitelist(names: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """The patterns of whitelist entries (built-in names, `re:` regexes); ValueError if bad."""
    patterns = []
    for name in names:
        if name.startswith("re:"):
            try:
                patterns.append(re.compile(name[3:]))
            except re.error as exc:
                raise ValueError(f"{name!r}: not a regular expression: {exc}") from None
        elif name in WHITELIST_PATTERNS:
            patterns.append(re.compile(WHITELIST_PATTERNS[name]))
        else:
            allowed = ", ".join(WHITELIST_PATTERNS)
            raise ValueError(f"{name!r} is not a built-in field ({allowed}) nor re:<regex>")
    return tuple(patterns)


def _tokens(text: str) -> list[str]:
    return WORD.findall(unicodedata.normalize("NFKC", text).casefold())


@dataclass(frozen=True, eq=False)
class Normaliser:
    """Masks whitelisted fields, folds case, drops punctuation and whitespace, maps equivalent
    spellings to the first of their group (phrases, longest first)."""

    whitelist: tuple[str, ...] = ()
    equivalents: tuple[tuple[str, ...], ...] = ()
    _patterns: tuple[tuple[str, re.Pattern[str]], ...] = field(init=False, repr=False)
    _table: dict[tuple[str, ...], tuple[str, ...]] = field(init=False, repr=False)
    _longest: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        patterns = compile_whitelist(self.whitelist)
        names = [
            _UNSAFE.sub("_", name[3:] if name.startswith("re:") else name).strip("_") or "field"
            for name in self.whitelist
        ]
        table: dict[tuple[str, ...], tuple[str, ...]] = {}
        for group in self.equivalents:
            canonical = tuple(_tokens(group[0]))
            for spelling in group:
                table.setdefault(tuple(_tokens(spelling)), canonical)
        object.__setattr__(self, "_patterns", tuple(zip(names, patterns, strict=True)))
        object.__setattr__(self, "_table", table)
        object.__setattr__(self, "_longest", max((len(k) for k in table), default=0))

    def __call__(self, text: str) -> list[str]:
        """The comparable tokens of `text`."""
        for name, pattern in self._patterns:
            # Spaces around the placeholder keep it one token whatever surrounded the field.
            text = pattern.sub(f" __{name}__ ", text)
        tokens = _tokens(text)
        if not self._table:
            return tokens
        out: list[str] = []
        i = 0
        while i < len(tokens):
            for size in range(min(self._longest, len(tokens) - i), 0, -1):
                canonical = self._table.get(tuple(tokens[i : i + size]))
                if canonical is not None:
                    out.extend(canonical)
                    i += size
                    break
            else:
                out.append(tokens[i])
                i += 1
        return out


def normalise(
    text: str, whitelist: Sequence[str] = (), equivalents: Sequence[Sequence[str]] = ()
) -> list[str]:
    """The comparable tokens of `text` (see `Normaliser`)."""
    return Normaliser(tuple(whitelist), tuple(tuple(g) for g in equivalents))(text)


Op = Literal["=", "-", "+"]


@dataclass(frozen=True)
class Edit:
    """One token of an edit script: kept (`=`), deleted from the old (`-`), inserted (`+`)."""

    op: Op
    token: str


def myers_diff(old: Sequence[str], new: Sequence[str]) -> list[Edit]:
    """The shortest edit script from `old` to `new` (Myers 1986, O((N+M)·D) time).

    Chosen over difflib.SequenceMatcher because Myers' script is minimal, so the number of
    edits is a distance (0 exactly when equal, symmetric); SequenceMatcher's junk heuristics
    and longest-block matching can report more changes than there are.
    """
    n, m = len(old), len(new)
    offset = n + m + 1
    v = [0] * (2 * offset + 1)
    trace: list[list[int]] = []
    for d in range(n + m + 1):
        trace.append(v.copy())
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]  # down: insert new[y]
            else:
                x = v[offset + k - 1] + 1  # right: delete old[x]
            y = x - k
            while x < n and y < m and old[x] == new[y]:
                x, y = x + 1, y + 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _backtrack(old, new, trace, offset)
    raise AssertionError("unreachable: D <= N + M")


def _backtrack(
    old: Sequence[str], new: Sequence[str], trace: list[list[int]], offset: int
) -> list[Edit]:
    x, y = len(old), len(new)
    script: list[Edit] = []
    for d in range(len(trace) - 1, -1, -1):
        v = trace[d]
        k = x - y
        if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
            prev_k = k + 1
        else:
            prev_k = k - 1
        prev_x = v[offset + prev_k]
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x, y = x - 1, y - 1
            script.append(Edit("=", old[x]))
        if d > 0:
            if x == prev_x:
                script.append(Edit("+", new[prev_y]))
            else:
                script.append(Edit("-", old[prev_x]))
        x, y = prev_x, prev_y
    script.reverse()
    return script


def edit_distance(script: Sequence[Edit]) -> int:
    """Tokens inserted plus tokens deleted."""
    return sum(1 for edit in script if edit.op != "=")


def mutation_score(changes: int, old_len: int, new_len: int, short_tokens: int = 32) -> float:
    """Changed-token ratio D / (n + m), times min(1, sqrt(short_tokens / max(n, m))): full
    weight for short answers, damped for long ones."""
    total = old_len + new_len
    if changes <= 0 or total == 0:
        return 0.0
    weight = min(1.0, math.sqrt(short_tokens / max(old_len, new_len, 1)))
    return round(min(1.0, changes / total) * weight, 6)


def render_diff(script: Sequence[Edit], limit: int = 120) -> str:
    """The hunks of an edit script as `-old words +new words`, joined by ` | `, truncated to
    `limit` characters (an ellipsis marks a cut)."""
    hunks: list[str] = []
    deleted: list[str] = []
    inserted: list[str] = []

    def close() -> None:
        if deleted or inserted:
            parts = ([f"-{' '.join(deleted)}"] if deleted else []) + (
                [f"+{' '.join(inserted)}"] if inserted else []
            )
            hunks.append(" ".join(parts))
            deleted.clear()
            inserted.clear()

    for edit in script:
        if edit.op == "=":
            close()
        elif edit.op == "-":
            deleted.append(edit.token)
        else:
            inserted.append(edit.token)
    close()
    text = " | ".join(hunks)
    if len(text) > limit:
        return text[: max(0, limit - 1)].rstrip() + "…"
    return text


@dataclass(frozen=True)
class Comparison:
    """One answer against its baseline: the edit count, the score and the rendered diff."""

    changes: int
    score: float
    diff: str


def compare(
    baseline: str,
    answer: str,
    normaliser: Normaliser,
    short_tokens: int = 32,
    diff_chars: int = 120,
) -> Comparison:
    """Normalise both texts, diff them, score the diff."""
    old, new = normaliser(baseline), normaliser(answer)
    script = myers_diff(old, new)
    changes = edit_distance(script)
    score = mutation_score(changes, len(old), len(new), short_tokens)
    return Comparison(changes, score, render_diff(script, diff_chars) if changes else "")
