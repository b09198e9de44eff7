"""Redaction of prompts and answers before they are logged: pure functions over text.

Built-in kinds, applied in this order after the user's own patterns (so a user pattern can claim
text a built-in would otherwise label):

- `card`: 13-19 digits (single spaces or dashes between groups allowed) starting 2-6 and passing
  the Luhn check, so order numbers and other long digit runs stay (about one random 16-digit
  number in ten passes Luhn: such an order number is redacted too);
- `api_key`: well-known key prefixes: `sk-` (OpenAI, Anthropic), `ghp_`/`gho_`/`ghu_`/`ghs_`/
  `ghr_` and `github_pat_` (GitHub), `AKIA`/`ASIA` (AWS access key ids), `AIza` (Google),
  `xox?-` (Slack), `sk_live_`/`pk_test_`... (Stripe), JSON Web Tokens;
- `bearer`: the token after `Bearer ` (the word is kept);
- `secret`: any other run of 32+ token characters with upper case, lower case and digits and at
  least 4 bits of Shannon entropy per character (random keys; never hex digests, paths or words);
- `email`; `phone`: international (`+<country> ...`), parenthesised area codes, NANP-style
  `415-555-0132`, and Chinese mobile numbers (`1[3-9]` + 9 digits); bare digit runs are not
  phones;
- `ip` (off unless asked for): dotted IPv4 addresses with every octet <= 255.

Each match becomes `[REDACTED:<kind>]`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

PLACEHOLDER = "[REDACTED:{kind}]"
BUILTIN_KINDS = ("card", "api_key", "bearer", "secret", "email", "phone", "ip")
DEFAULT_KINDS = frozenset(BUILTIN_KINDS) - {"ip"}
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class RedactionError(Exception):
    """A redaction setting cannot be used (an unknown kind, a bad pattern name or regex)."""


_CARD = re.compile(r"(?<![\w-])[2-6]\d{3}(?:[ -]?\d){9,15}(?![\w-])", re.ASCII)
_API_KEY = re.compile(
    r"(?<![\w-])(?:"
    r"sk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{22,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r")(?![\w-])",
    re.ASCII,
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/-]{8,}=*)")
_SECRET = re.compile(r"(?<![\w+/=-])[A-Za-z0-9+/_=-]{32,}(?![\w+/=-])", re.ASCII)
_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b", re.ASCII
)
_PHONE = re.compile(
    r"(?<![\w+])(?:"
    r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}"
    r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}"
    r"|\d{3}[.-]\d{3}[.-]\d{4}"
    r"|1[3-9]\d{9}"
    r")(?![\w-])",
    re.ASCII,
)
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])", re.ASCII)


def luhn_ok(digits: str) -> bool:
    """True when the digit string passes the Luhn checksum (payment card numbers do)."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def shannon_entropy(text: str) -> float:
    """Bits per character of `text`'s character distribution."""
    if not text:
        return 0.0
    size = len(text)
    return -sum(n / size * math.log2(n / size) for n in Counter(text).values())


def _is_card(match: re.Match[str]) -> bool:
    digits = re.sub(r"[ -]", "", match.group(0))
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


def _is_secret(match: re.Match[str]) -> bool:
    token = match.group(0)
    has_classes = (
        any(c.isupper() for c in token)
        and any(c.islower() for c in token)
        and any(c.isdigit() for c in token)
    )
    return has_classes and shannon_entropy(token) >= 4.0


def _is_phone(match: re.Match[str]) -> bool:
    digits = sum(c.isdigit() for c in match.group(0))
    return 7 <= digits <= 15


def _is_ipv4(match: re.Match[str]) -> bool:
    return all(int(octet) <= 255 for octet in match.group(0).split("."))


@dataclass(frozen=True)
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    accept: Callable[[re.Match[str]], bool] | None = None
    group: int = 0  # the group replaced (0: the whole match)


_BUILTIN: dict[str, _Rule] = {
    "card": _Rule("card", _CARD, _is_card),
    "api_key": _Rule("api_key", _API_KEY),
    "bearer": _Rule("bearer", _BEARER, None, 2),
    "secret": _Rule("secret", _SECRET, _is_secret),
    "email": _Rule("email", _EMAIL),
    "phone": _Rule("phone", _PHONE, _is_phone),
    "ip": _Rule("ip", _IPV4, _is_ipv4),
}


@dataclass(frozen=True)
class Redacted:
    """Redacted text and how many matches of each kind were replaced."""

    text: str
    counts: Mapping[str, int] = field(default_factory=dict)


def _apply(rule: _Rule, text: str, counts: Counter[str]) -> str:
    replacement = PLACEHOLDER.format(kind=rule.kind)

    def substitute(match: re.Match[str]) -> str:
        if rule.accept is not None and not rule.accept(match):
            return match.group(0)
        counts[rule.kind] += 1
        if rule.group == 0:
            return replacement
        start, end = match.span(rule.group)
        whole_start = match.start()
        whole = match.group(0)
        return whole[: start - whole_start] + replacement + whole[end - whole_start :]

    return rule.pattern.sub(substitute, text)


@dataclass(frozen=True)
class Redactor:
    """A configured redaction: the user's named patterns, then the enabled built-in kinds."""

    rules: tuple[_Rule, ...]

    def redact(self, text: str) -> Redacted:
        """`text` with every match replaced by `[REDACTED:<kind>]`, and the counts."""
        counts: Counter[str] = Counter()
        for rule in self.rules:
            text = _apply(rule, text, counts)
        return Redacted(text, dict(counts))


def build_redactor(
    kinds: frozenset[str] | set[str] = DEFAULT_KINDS,
    patterns: Mapping[str, str] | None = None,
) -> Redactor:
    """A redactor for the built-in `kinds` and the user's `patterns` (name -> regex);
    RedactionError naming an unknown kind, a bad name or a regex that does not compile."""
    unknown = sorted(set(kinds) - set(BUILTIN_KINDS))
    if unknown:
        raise RedactionError(
            f"unknown redaction kinds {unknown}; known: {', '.join(BUILTIN_KINDS)}"
        )
    rules: list[_Rule] = []
    for name, regex in (patterns or {}).items():
        if not _NAME.match(name) or name in BUILTIN_KINDS:
            raise RedactionError(
                f"pattern name {name!r}: use lowercase letters, digits, '_' or '-' (at most 32), "
                f"not a built-in kind ({', '.join(BUILTIN_KINDS)})"
            )
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise RedactionError(f"pattern {name}: {regex!r} is not a valid regex: {exc}") from None
        if compiled.match(""):
            raise RedactionError(f"pattern {name}: {regex!r} matches the empty string")
        rules.append(_Rule(name, compiled))
    rules.extend(_BUILTIN[kind] for kind in BUILTIN_KINDS if kind in kinds)
    return Redactor(tuple(rules))
