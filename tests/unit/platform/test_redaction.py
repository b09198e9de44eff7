"""Redaction on a corpus: for every kind, texts that must be redacted and texts that must not."""

from __future__ import annotations

import pytest

from redline.platform.redaction import (
    RedactionError,
    build_redactor,
    luhn_ok,
    shannon_entropy,
)

# (kind, text, the secret that must disappear)
POSITIVES = [
    ("email", "write to alice.smith+ops@example.co.uk today", "alice.smith+ops@example.co.uk"),
    ("email", "Contact: bob@mail.redline.io.", "bob@mail.redline.io"),
    ("phone", "call +1 415 555 0132 now", "+1 415 555 0132"),
    ("phone", "office (415) 555-0132", "(415) 555-0132"),
    ("phone", "desk 415-555-0132 ext", "415-555-0132"),
    ("phone", "London +44 20 7946 0958", "+44 20 7946 0958"),
    ("phone", "我的手机是13800138000谢谢", "13800138000"),
    ("phone", "mobile +86 138 0013 8000", "+86 138 0013 8000"),
    ("card", "card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
    ("card", "pay with 5500-0000-0000-0004", "5500-0000-0000-0004"),
    ("card", "amex 378282246310005.", "378282246310005"),
    ("card", "no spaces 4012888888881881", "4012888888881881"),
    ("api_key", "key sk-proj-abcDEF1234567890abcdefGHIJ ok", "sk-proj-abcDEF1234567890abcdefGHIJ"),
    (
        "api_key",
        "OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwxyz012345",
        "sk-abcdefghijklmnopqrstuvwxyz012345",
    ),
    (
        "api_key",
        "token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    ),
    ("api_key", "aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
    (
        "api_key",
        "google AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    ),
    ("api_key", "slack xoxb-1234567890-abcdefghij", "xoxb-1234567890-abcdefghij"),
    ("api_key", "stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    (
        "api_key",
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
        ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "eyJhbGciOiJIUzI1NiJ9",
    ),
    ("bearer", "Authorization: Bearer abc.def-ghi_jkl123", "abc.def-ghi_jkl123"),
    ("bearer", "use bearer 0123456789abcdef", "0123456789abcdef"),
    ("secret", "secret=Zx8Qp2Lm9Tr4Vb7Nc1Kd5Hf3Jg6Ws0Ya2Ue", "Zx8Qp2Lm9Tr4Vb7Nc1Kd5Hf3Jg6Ws0Ya2Ue"),
    ("ip", "server 192.168.10.254 down", "192.168.10.254"),
]

# (kind, text): nothing of that kind may be redacted in it
NEGATIVES = [
    ("email", "decorators like @property and user@localhost are fine"),
    ("email", "price 3@5 each"),
    ("phone", "order 12345678 shipped"),
    ("phone", "released 2024-08-01 at 14:22"),
    ("phone", "version 1.2.3 and 10.20.30"),
    ("phone", "1234567"),
    ("phone", "invoice 10000000001"),
    ("card", "order number 4111 1111 1111 1112"),
    ("card", "order ORD-4111111111111112"),
    ("card", "ticket 1234567890123456"),
    ("card", "timestamp 1722520927000"),
    ("api_key", "the sk- prefix means secret key"),
    ("api_key", "ghp_short is not a token"),
    ("api_key", "AKIA is an AWS prefix"),
    ("bearer", "a bearer of bad news"),
    ("secret", "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ("secret", "path /usr/local/lib/python3.11/site-packages/redline/platform"),
    ("secret", "internationalization_and_localization_are_long_words"),
    ("secret", "CONSTANT_NAME_WITH_MANY_WORDS_AND_NO_DIGITS"),
    ("ip", "version 10.2.300.1 is not an address"),
    ("ip", "semver 1.2.3"),
]

ALL = frozenset({"card", "api_key", "bearer", "secret", "email", "phone", "ip"})


@pytest.mark.parametrize(("kind", "text", "secret"), POSITIVES)
def test_positive(kind: str, text: str, secret: str) -> None:
    redacted = build_redactor(ALL).redact(text)
    assert secret not in redacted.text
    assert f"[REDACTED:{kind}]" in redacted.text
    assert redacted.counts.get(kind, 0) >= 1


@pytest.mark.parametrize(("kind", "text"), NEGATIVES)
def test_negative(kind: str, text: str) -> None:
    redacted = build_redactor(ALL).redact(text)
    assert f"[REDACTED:{kind}]" not in redacted.text, redacted.text
    assert kind not in redacted.counts


def test_clean_text_is_unchanged() -> None:
    text = "Summarise the Q3 report: revenue grew 12% to $4.1M across 3 regions (order 778812)."
    assert build_redactor(ALL).redact(text).text == text


def test_bearer_keeps_the_word() -> None:
    out = build_redactor().redact("Authorization: Bearer abcdefgh12345678").text
    assert out == "Authorization: Bearer [REDACTED:bearer]"


def test_several_kinds_in_one_text() -> None:
    text = "I am eve@corp.com, +1 415 555 0132, card 4111111111111111, key AKIAIOSFODNN7EXAMPLE"
    redacted = build_redactor().redact(text)
    assert redacted.counts == {"email": 1, "phone": 1, "card": 1, "api_key": 1}
    assert redacted.text == (
        "I am [REDACTED:email], [REDACTED:phone], card [REDACTED:card], key [REDACTED:api_key]"
    )


def test_ip_is_off_by_default() -> None:
    assert build_redactor().redact("host 10.0.0.1").text == "host 10.0.0.1"


def test_user_patterns_come_first_and_are_named() -> None:
    redactor = build_redactor(patterns={"employee_id": r"\bEMP-\d{6}\b", "ticket": r"JIRA-\d+"})
    out = redactor.redact("EMP-123456 filed JIRA-42 from eve@corp.com")
    assert out.text == "[REDACTED:employee_id] filed [REDACTED:ticket] from [REDACTED:email]"
    assert out.counts == {"employee_id": 1, "ticket": 1, "email": 1}


@pytest.mark.parametrize(
    ("kinds", "patterns", "message"),
    [
        ({"cards"}, {}, "unknown redaction kinds"),
        (set(), {"Bad Name": "x"}, "pattern name"),
        (set(), {"email": "x"}, "not a built-in kind"),
        (set(), {"broken": "(unclosed"}, "not a valid regex"),
        (set(), {"empty": "a*"}, "matches the empty string"),
    ],
)
def test_bad_settings_are_refused(kinds: set[str], patterns: dict[str, str], message: str) -> None:
    with pytest.raises(RedactionError, match=message):
        build_redactor(kinds, patterns)


def test_luhn_and_entropy() -> None:
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == 2.0
