"""The output-mutation probe's canary prompts: the JSONL canary file and the built-in set.

Canary file (`canaries.path`, JSONL, one object a line, `#` comments and blank lines skipped):

    {"id": "capital-france", "messages": [{"role": "user", "content": "Capital of France?"}],
     "max_tokens": 32, "whitelist": ["timestamp", "uuid", "re:order-[0-9]+"],
     "equivalents": [["paris", "paris france"]]}

`prompt` (a string) may stand for a single user message. Problems raise `CanaryFileError`, each
naming file:line and the field. Unset: the built-in `DEFAULT_CANARIES` (golden prompts the local
stack's simulator answers), for the demo and local stack only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.exporters.mutation_diff import WORD, compile_whitelist

CANARY_FIELDS = ("id", "messages", "prompt", "max_tokens", "whitelist", "equivalents")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_MAX_PROBLEMS = 50


class CanaryFileError(Exception):
    """A canary file that cannot be used; every problem names file:line and the field."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Canary:
    """One canary prompt: the messages sent, `max_tokens`, template fields to mask (built-in
    names or `re:` regexes) and groups of equivalent spellings."""

    id: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int = 32
    whitelist: tuple[str, ...] = ()
    equivalents: tuple[tuple[str, ...], ...] = ()

    def request(self, model: str) -> dict[str, Any]:
        """The deterministic chat-completions body asking this canary of `model`."""
        return {
            "model": model,
            "messages": [{"role": role, "content": content} for role, content in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": False,
        }


DEFAULT_CANARIES: tuple[Canary, ...] = (
    Canary("capital-france", (("user", "What is the capital of France?"),)),
    Canary("hexagon", (("user", "How many sides does a hexagon have?"),), 32, (), (("6", "six"),)),
    Canary("leap-year", (("user", "How many days are in a leap year?"),)),
    Canary("red-planet", (("user", "Which planet is known as the Red Planet?"),)),
)
"""Golden prompts the local stack's simulator answers (demo and local stack only)."""


def _messages(data: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    if "messages" in data and "prompt" in data:
        raise ValueError("messages: give messages or prompt, not both")
    if "prompt" in data:
        prompt = data["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt: must be a non-empty string")
        return (("user", prompt),)
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ValueError("messages: required, a non-empty list of {role, content}")
    out = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}]: must be an object {{role, content}}")
        role, content = message.get("role"), message.get("content")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"messages[{index}].role: must be system, user or assistant")
        if not isinstance(content, str):
            raise ValueError(f"messages[{index}].content: must be a string")
        out.append((str(role), content))
    return tuple(out)


def _equivalents(raw: object) -> tuple[tuple[str, ...], ...]:
    if not isinstance(raw, list):
        raise ValueError("equivalents: must be a list of lists of spellings")
    groups = []
    for index, group in enumerate(raw):
        if (
            not isinstance(group, list)
            or len(group) < 2
            or not all(isinstance(s, str) and WORD.search(s) for s in group)
        ):
            raise ValueError(
                f"equivalents[{index}]: must list at least two spellings, each with a word"
            )
        groups.append(tuple(group))
    return tuple(groups)


def parse_canary(data: object) -> Canary:
    """One canary from a decoded JSONL line; ValueError naming the field."""
    if not isinstance(data, dict):
        raise ValueError("line: must be a JSON object")
    unknown = sorted(set(data) - set(CANARY_FIELDS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (allowed: {', '.join(CANARY_FIELDS)})")
    ident = data.get("id")
    if not isinstance(ident, str) or not _ID.match(ident):
        raise ValueError("id: required, 1-64 characters of letters, digits, _ . : -")
    max_tokens = data.get("max_tokens", 32)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens:
        raise ValueError("max_tokens: must be a positive integer")
    whitelist = data.get("whitelist", [])
    if not isinstance(whitelist, list) or not all(isinstance(w, str) for w in whitelist):
        raise ValueError("whitelist: must be a list of strings")
    try:
        compile_whitelist(whitelist)
    except ValueError as exc:
        raise ValueError(f"whitelist: {exc}") from None
    return Canary(
        ident,
        _messages(data),
        max_tokens,
        tuple(whitelist),
        _equivalents(data.get("equivalents", [])),
    )


def parse_canaries(text: str, source: str) -> tuple[Canary, ...]:
    """Every canary of a JSONL text; CanaryFileError listing each bad line as source:line."""
    canaries: list[Canary] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            problems.append(f"{source}:{number}: not JSON: {exc}")
            continue
        try:
            canary = parse_canary(data)
        except ValueError as exc:
            problems.append(f"{source}:{number}: {exc}")
            continue
        if canary.id in seen:
            problems.append(f"{source}:{number}: id: {canary.id!r} repeats line {seen[canary.id]}")
            continue
        seen[canary.id] = number
        canaries.append(canary)
        if len(problems) >= _MAX_PROBLEMS:
            break
    if not problems and not canaries:
        problems.append(f"{source}: no canary prompts (one JSON object a line)")
    if problems:
        raise CanaryFileError(problems)
    return tuple(canaries)


def load_canaries(path: Path) -> tuple[Canary, ...]:
    """The canaries of a JSONL file; CanaryFileError (unreadable file, bad lines)."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CanaryFileError([f"{path}: cannot read the canary file: {exc}"]) from None
    return parse_canaries(text, str(path))
