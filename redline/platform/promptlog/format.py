"""The prompt log's record and segment format (pure): records, their content hash and segment
lines, batches with their trees and anchors, and the head of the root chain.

A record is one canonical JSON line of its segment file, batch after batch: `{b, i, ts,
session, request, prompt, answer, content_hash}` (`b` the batch, `i` the leaf index;
`truncated: true` added to a streamed answer the client or the upstream cut short);
`content_hash` is SHA-256(0x02 | request | prompt | answer [| the truncation mark]), fields
length-prefixed. A batch's anchor (`BatchEntry`) is `{batch, count, segment, root, first_ts,
last_ts, records_offset, records_length, records_digest, tree_offset, prev, chain}` (offsets
within the batch's segment), where `prev` is the previous entry's `chain` (64 zeros first) and
`chain` the SHA-256 of the canonical JSON of the rest: each root commits to every root before
it, and `records_digest` (SHA-256 of the batch's bytes) seals the bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from redline.platform.promptlog.errors import PromptLogError
from redline.platform.promptlog.merkle import build_levels, leaf_hash, level_sizes
from redline.platform.redaction import Redactor

GENESIS = "0" * 64
RECORD_FIELDS = frozenset(
    {"b", "i", "ts", "session", "request", "prompt", "answer", "content_hash"}
)
TRUNCATED = "truncated"  # the optional record field of an answer cut short
ENTRY_FIELDS = (
    "batch",
    "count",
    "segment",
    "root",
    "first_ts",
    "last_ts",
    "records_offset",
    "records_length",
    "records_digest",
    "tree_offset",
    "prev",
    "chain",
)
_ENTRY_NUMBERS = frozenset(
    {"batch", "count", "segment", "records_offset", "records_length", "tree_offset"}
)
_CONTENT = b"\x02"
_TRUNCATION = len(TRUNCATED).to_bytes(4, "big") + TRUNCATED.encode()
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, non-ASCII kept."""
    return _CANONICAL.encode(value)


def sha256_hex(text: str) -> str:
    """SHA-256 (hex) of UTF-8 `text`."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_hash(
    request: str, prompt: str | None, answer: str | None, truncated: bool = False
) -> str:
    """The hash a record's content must match: H(0x02 | request | prompt | answer), each field
    framed (a missing text is framed apart from an empty one); a truncated answer adds a fourth
    framed field, so the mark cannot be removed or added without changing the hash."""
    data = bytearray(_CONTENT)
    for part in (request, prompt, answer):
        if part is None:
            data += b"\xff\xff\xff\xff"
        else:
            encoded = part.encode("utf-8")
            data += len(encoded).to_bytes(4, "big") + encoded
    if truncated:
        data += _TRUNCATION
    return hashlib.sha256(data).hexdigest()


def parse_record(raw: bytes | str) -> dict[str, Any] | None:
    """A segment line as a record (None when it is not one: unparsable, fields missing or
    extra, a `truncated` member that is not `true`)."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    fields = set(record)
    if fields == RECORD_FIELDS:
        return record
    if fields == RECORD_FIELDS | {TRUNCATED} and record[TRUNCATED] is True:
        return record
    return None


def record_content_hash(record: Mapping[str, Any]) -> str:
    """The content hash a parsed record's fields give (to compare with its `content_hash`)."""
    return content_hash(
        record["request"], record["prompt"], record["answer"], record.get(TRUNCATED) is True
    )


@dataclass(frozen=True)
class PromptRecord:
    """What is logged of one request (already redacted, or hashed)."""

    ts: str
    session: str
    request: str
    prompt: str | None
    answer: str | None
    truncated: bool = False


@dataclass(frozen=True)
class BatchEntry:
    """One batch's anchor: its root, where its bytes are and their seal, chained to the last."""

    batch: int
    count: int
    segment: int
    root: str
    first_ts: str
    last_ts: str
    records_offset: int
    records_length: int
    records_digest: str
    tree_offset: int
    prev: str
    chain: str

    def body(self) -> dict[str, Any]:
        """The fields the chain hash covers."""
        return {k: getattr(self, k) for k in ENTRY_FIELDS if k != "chain"}

    def expected_chain(self) -> str:
        """The chain hash these fields should carry."""
        return sha256_hex(canonical_json(self.body()))

    def render(self) -> str:
        """The canonical JSON line stored in Redis and in `roots.jsonl`."""
        return canonical_json({**self.body(), "chain": self.chain})

    @property
    def records_end(self) -> int:
        """Byte offset in the batch's segment file just past the batch."""
        return self.records_offset + self.records_length

    @property
    def tree_end(self) -> int:
        """Byte offset in the batch's tree file just past the batch's tree."""
        return self.tree_offset + 32 * sum(level_sizes(self.count))

    @classmethod
    def parse(cls, text: str) -> BatchEntry:
        """An entry from its JSON line (PromptLogError when it is not one)."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or set(data) != set(ENTRY_FIELDS):
                raise ValueError(f"fields are not {', '.join(ENTRY_FIELDS)}")
            # Numbers locate bytes in files: a forged entry must not pass a string for one.
            wrong = [
                k
                for k, v in data.items()
                if not isinstance(v, int | str)
                or isinstance(v, bool)
                or isinstance(v, int) != (k in _ENTRY_NUMBERS)
                or (isinstance(v, int) and v < 0)
            ]
            if wrong:
                raise ValueError(f"{', '.join(sorted(wrong))} of the wrong type")
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise PromptLogError(f"not a batch entry: {exc}") from None


@dataclass(frozen=True)
class Head:
    """The end of the chain: the number of batches and the last chain hash."""

    count: int
    chain: str

    def render(self) -> str:
        """`<count>:<chain>`."""
        return f"{self.count}:{self.chain}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """Parse `<count>:<chain>`."""
        count, _, chain = text.partition(":")
        return cls(int(count), chain)


EMPTY_HEAD = Head(0, GENESIS)


@dataclass(frozen=True)
class BuiltBatch:
    """A batch ready to write: segment bytes, tree bytes, its anchor, its index entries."""

    records: bytes
    tree: bytes
    entry: BatchEntry
    index: dict[str, list[str]]


def record_line(batch: int, leaf: int, record: PromptRecord) -> tuple[str, str]:
    """The segment line of a record and its content hash."""
    digest = content_hash(record.request, record.prompt, record.answer, record.truncated)
    fields: dict[str, Any] = {
        "b": batch,
        "i": leaf,
        "ts": record.ts,
        "session": record.session,
        "request": record.request,
        "prompt": record.prompt,
        "answer": record.answer,
        "content_hash": digest,
    }
    if record.truncated:
        fields[TRUNCATED] = True
    return canonical_json(fields), digest


def build_record(
    ts: float,
    request_id: str,
    session: str,
    prompt: str | None,
    answer: str | None,
    redactor: Redactor,
    store: Literal["text", "hashes"],
    truncated: bool = False,
) -> PromptRecord:
    """The record logged for one request: redacted text, or the hashes of the redacted text;
    `truncated` when the answer is what a stream had sent before it was cut short."""
    texts = [None if t is None else redactor.redact(t).text for t in (prompt, answer)]
    if store == "hashes":
        texts = [None if t is None else "sha256:" + sha256_hex(t) for t in texts]
    stamp = datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")
    return PromptRecord(stamp, session, request_id, texts[0], texts[1], truncated)


def build_batch(
    records: Sequence[PromptRecord],
    batch: int,
    prev: str,
    records_offset: int,
    tree_offset: int,
    segment: int = 0,
) -> BuiltBatch:
    """Serialize `records` as batch `batch` after the chain hash `prev`, at these offsets of
    segment `segment`'s files."""
    if not records:
        raise PromptLogError("an empty batch cannot be appended")
    parts: list[bytes] = []
    leaves: list[bytes] = []
    index: dict[str, list[str]] = {}
    offset = records_offset
    for leaf, record in enumerate(records):
        line, digest = record_line(batch, leaf, record)
        data = (line + "\n").encode("utf-8")
        parts.append(data)
        leaves.append(leaf_hash(record.ts, record.session, digest))
        index.setdefault(record.session, []).append(f"{batch}:{leaf}:{offset}:{len(data)}")
        offset += len(data)
    body = b"".join(parts)
    levels = build_levels(leaves)
    fields: dict[str, Any] = {
        "batch": batch,
        "count": len(records),
        "segment": segment,
        "root": levels[-1][0].hex(),
        "first_ts": records[0].ts,
        "last_ts": records[-1].ts,
        "records_offset": records_offset,
        "records_length": len(body),
        "records_digest": hashlib.sha256(body).hexdigest(),
        "tree_offset": tree_offset,
        "prev": prev,
    }
    entry = BatchEntry(**fields, chain=sha256_hex(canonical_json(fields)))
    tree = b"".join(node for level in levels for node in level)
    return BuiltBatch(body, tree, entry, index)
