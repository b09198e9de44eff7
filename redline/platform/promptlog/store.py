"""The tamper-evident prompt log: redacted records in batches, a Merkle tree per batch, roots
chained and anchored in two places, and a session index for trace-back without a scan.

Layout (one directory, one writer at a time: appends hold an exclusive `flock` on `lock`):

- `records-<segment>.seg` (`records-000000.seg`, ...): the records, one canonical JSON line
  each, batch after batch: `{b, i, ts, session, request, prompt, answer, content_hash}` (`b` the
  batch, `i` the leaf index; `truncated: true` added to a streamed answer the client or the
  upstream cut short); `content_hash` is SHA-256(0x02 | request | prompt | answer [| the
  truncation mark]), fields length-prefixed. A batch starts a new segment once the current one
  holds `segment_bytes`: closed segments are never written again, so a change to one is
  tampering, and re-checking the segment that changed costs the same at any log size.
- `tree-<segment>.bin`: each batch's Merkle tree, every level (leaves first) as raw 32-byte
  nodes. Leaf = SHA-256(0x00 | ts | session | content_hash) with each field length-prefixed;
  node = SHA-256(0x01 | left | right) (domain separation: a leaf can never pass for a node); an
  odd node at the end of a level moves up unchanged.
- `roots.jsonl` and, in Redis, the list `{prefix}:prompts:roots` with the head
  `{prefix}:prompts:head` (`<batches>:<last chain hash>`): one entry per batch,
  `{batch, count, segment, root, first_ts, last_ts, records_offset, records_length,
  records_digest, tree_offset, prev, chain}` (offsets within the batch's segment), where `prev`
  is the previous entry's `chain` (64 zeros first) and `chain` the SHA-256 of the canonical JSON
  of the rest: each root commits to every root before it, and `records_digest` (SHA-256 of the
  batch's bytes) seals the bytes.
- the session index in Redis: `{prefix}:prompts:s:<session>`, a list of
  `<batch>:<leaf>:<offset>:<length>`. It only locates records; everything `trace` returns is
  checked against the anchored root with an inclusion proof.

Why files for the records and Redis for the anchors and the index: a million records of a few
hundred bytes are a few hundred MB, which sequential files hold for free and Redis would hold
in RAM; the anchors (one small entry per batch) and the index (a short string per record) are
tens of MB, and Redis gives a second copy of the roots on another machine plus O(1) look-ups.

`verify` checks both copies of the chain (hashes, links, order, head), that they agree, and
each batch's sealed bytes (SHA-256 in threads: the fast path); batches whose bytes changed are
diagnosed record by record (content hash, leaf order, missing leaves, leaves against the stored
tree and the anchored root) to say where. `deep=True` recomputes every root. `check_segments`
is the same check for some segments only: what the watcher (`redline.platform.promptwatch`)
runs on the segment a change event names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

import redis
from pydantic import BaseModel, ConfigDict, Field, model_validator

from redline.core.redisconn import open_redis
from redline.platform.redaction import DEFAULT_KINDS, RedactionError, Redactor, build_redactor

log = logging.getLogger(__name__)

GENESIS = "0" * 64
SESSION_HEADER = "x-redline-session-id"
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
_LEAF = b"\x00"
_NODE = b"\x01"
_CONTENT = b"\x02"
_TRUNCATION = len(TRUNCATED).to_bytes(4, "big") + TRUNCATED.encode()
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class PromptLogError(Exception):
    """The prompt log cannot be appended to or read (its anchors are missing or contended)."""


class PromptLogSettings(BaseModel):
    """The `prompt_log:` section of the gateway's settings (off unless `enabled`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Append every answered request to the prompt log.")
    directory: Path = Field(Path("prompt-log"), description="Directory of the log's files.")
    redis_url: str | None = Field(
        None, description="Redis of the anchors and the session index (None: the service's)."
    )
    key_prefix: str = Field("redline", min_length=1, description="Redis key prefix.")
    store: Literal["text", "hashes"] = Field(
        "text", description="text: the redacted prompt and answer; hashes: their SHA-256 only."
    )
    redact: list[str] = Field(
        default_factory=lambda: sorted(DEFAULT_KINDS),
        description="Built-in redaction kinds (card, api_key, bearer, secret, email, phone, ip).",
    )
    patterns: dict[str, str] = Field(
        default_factory=dict, description="Extra redactions: name -> regex ([REDACTED:name])."
    )
    batch_size: int = Field(512, ge=1, le=65536, description="Most records per batch.")
    flush_seconds: float = Field(0.5, gt=0, description="Longest a record waits for its batch.")
    queue_size: int = Field(10000, ge=1, description="Records waiting at most (more: dropped).")
    fsync: bool = Field(True, description="fsync the files before anchoring each batch.")
    segment_bytes: int = Field(
        16 << 20,
        ge=4096,
        description="A batch starts a new segment file once the current one holds this much.",
    )

    def redactor(self) -> Redactor:
        """The configured redactor (RedactionError when a kind or pattern is unusable)."""
        return build_redactor(frozenset(self.redact), self.patterns)

    @model_validator(mode="after")
    def _check_redaction(self) -> PromptLogSettings:
        try:
            self.redactor()
        except RedactionError as exc:
            raise ValueError(str(exc)) from None
        return self


# --- hashing and the Merkle tree (pure) -------------------------------------------------------


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


def _framed(*parts: str) -> bytes:
    out = bytearray()
    for part in parts:
        data = part.encode("utf-8")
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)


def leaf_hash(ts: str, session: str, digest: str) -> bytes:
    """The Merkle leaf of a record: H(0x00 | ts | session | content hash), fields framed."""
    return hashlib.sha256(_LEAF + _framed(ts, session, digest)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """An inner node: H(0x01 | left | right)."""
    return hashlib.sha256(_NODE + left + right).digest()


def build_levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaves first, root last (an odd last node moves up as is)."""
    if not leaves:
        raise PromptLogError("a Merkle tree needs at least one leaf")
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        level = levels[-1]
        up = [node_hash(level[k], level[k + 1]) for k in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            up.append(level[-1])
        levels.append(up)
    return levels


def level_sizes(count: int) -> list[int]:
    """How many nodes each level of a tree over `count` leaves holds."""
    sizes = [count]
    while sizes[-1] > 1:
        sizes.append((sizes[-1] + 1) // 2)
    return sizes


def inclusion_proof(levels: Sequence[Sequence[bytes]], index: int) -> list[bytes]:
    """The sibling hashes from leaf `index` up to the root."""
    proof: list[bytes] = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            proof.append(level[sibling])
        index //= 2
    return proof


def root_from_proof(leaf: bytes, index: int, count: int, proof: Sequence[bytes]) -> bytes | None:
    """The root leaf `index` of `count` leads to with `proof` (None: the proof has the wrong
    length for that position). The sides come from the index, so a proof binds the position."""
    if not 0 <= index < count:
        return None
    node, size, steps = leaf, count, iter(proof)
    while size > 1:
        if index ^ 1 < size:
            sibling = next(steps, None)
            if sibling is None:
                return None
            node = node_hash(sibling, node) if index % 2 else node_hash(node, sibling)
        index //= 2
        size = (size + 1) // 2
    return None if next(steps, None) is not None else node


def verify_proof(leaf: bytes, index: int, count: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True when `proof` shows `leaf` at `index` of a `count`-leaf tree with `root`."""
    return root_from_proof(leaf, index, count, proof) == root


# --- records, batches and anchors (pure) ------------------------------------------------------


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


def split_levels(tree: bytes, count: int) -> list[list[bytes]]:
    """A stored tree's bytes back into levels (PromptLogError when the size is wrong)."""
    sizes = level_sizes(count)
    if len(tree) != 32 * sum(sizes):
        raise PromptLogError(f"tree of {count} leaves must be {32 * sum(sizes)} bytes")
    levels, at = [], 0
    for size in sizes:
        levels.append([tree[k : k + 32] for k in range(at, at + 32 * size, 32)])
        at += 32 * size
    return levels


# --- verification results (pure) --------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """Where the log does not verify: which copy, batch and leaf, and what it means."""

    where: str
    reason: str
    batch: int | None = None
    leaf: int | None = None

    def render(self) -> str:
        """One line for the CLI."""
        place = self.where
        if self.batch is not None:
            place += f" batch {self.batch}"
        if self.leaf is not None:
            place += f" leaf {self.leaf}"
        return f"{place}: {self.reason}"


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of `verify`: the problems found (none: intact) and what was checked."""

    problems: list[Problem]
    batches: int
    records: int
    seconds: float

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.problems


def check_chain(
    lines: Sequence[str], head: Head | None, where: str
) -> tuple[list[BatchEntry], list[Problem]]:
    """Parse a copy of the chain and check each entry's hash, its position and its link (and the
    head when given); the entries parsed (up to the first unparsable one) and the problems."""
    entries: list[BatchEntry] = []
    problems: list[Problem] = []
    prev = GENESIS
    for position, line in enumerate(lines):
        try:
            entry = BatchEntry.parse(line)
        except PromptLogError as exc:
            problems.append(Problem(where, str(exc), position))
            break
        entries.append(entry)
        if entry.chain != entry.expected_chain():
            problems.append(
                Problem(
                    where,
                    "entry does not match its chain hash: its root or seal was edited",
                    position,
                )
            )
        elif entry.batch != position:
            problems.append(
                Problem(
                    where,
                    f"entry of batch {entry.batch} at position {position}: "
                    "roots removed, inserted or reordered",
                    position,
                )
            )
        elif entry.prev != prev:
            problems.append(
                Problem(
                    where,
                    "prev does not match the previous entry's chain hash: "
                    "a root was edited, removed or reordered",
                    position,
                )
            )
        prev = entry.chain
    if head is not None and not problems and (head.count != len(entries) or head.chain != prev):
        problems.append(
            Problem(
                where,
                f"the chain holds {len(entries)} batches but the head says {head.count} "
                f"({head.chain[:16]}): roots removed from the end or the head edited",
            )
        )
    return entries, problems


def compare_copies(
    redis_entries: Sequence[BatchEntry], file_entries: Sequence[BatchEntry], file_name: str
) -> list[Problem]:
    """The roots file must hold the same entries as Redis (it may lag by the batch being
    mirrored right now, never differ)."""
    for position, (a, b) in enumerate(zip(redis_entries, file_entries, strict=False)):
        if a != b:
            what = "root" if a.root != b.root else "entry"
            return [
                Problem(
                    "roots",
                    f"the {what} in Redis and in {file_name} differ: one copy was edited",
                    position,
                )
            ]
    if len(file_entries) > len(redis_entries):
        return [
            Problem(
                "roots",
                f"{file_name} holds {len(file_entries)} batches, Redis {len(redis_entries)}: "
                "Redis lost roots",
            )
        ]
    if len(redis_entries) - len(file_entries) > 1:
        return [
            Problem(
                "roots",
                f"{file_name} holds {len(file_entries)} batches, Redis {len(redis_entries)}: "
                "roots removed from the file",
            )
        ]
    return []


def diagnose_batch(entry: BatchEntry, lines: Sequence[bytes], tree: bytes | None) -> list[Problem]:
    """Say which records of a batch whose bytes changed were edited, removed or reordered."""
    problems: list[Problem] = []
    where, b = "records", entry.batch
    leaves: list[bytes] = []
    seen: list[int] = []
    for position, raw in enumerate(lines):
        record = parse_record(raw)
        if record is None:
            problems.append(
                Problem(where, f"line {position} of the batch is not a record: {raw[:60]!r}", b)
            )
            continue
        leaf = record["i"]
        if record["b"] != b:
            problems.append(
                Problem(where, f"found among the records of batch {b}: moved", record["b"], leaf)
            )
            continue
        if record_content_hash(record) != record["content_hash"]:
            problems.append(
                Problem(
                    where,
                    f"request {record['request']}: content does not match its hash: edited",
                    b,
                    leaf,
                )
            )
        seen.append(leaf)
        leaves.append(
            leaf_hash(str(record["ts"]), str(record["session"]), str(record["content_hash"]))
        )
    for missing in sorted(set(range(entry.count)) - set(seen)):
        problems.append(Problem(where, "missing: the record was deleted", b, missing))
    extra = [leaf for leaf in seen if not 0 <= leaf < entry.count]
    for leaf in extra:
        problems.append(
            Problem(where, f"leaf index outside 0..{entry.count - 1}: inserted", b, leaf)
        )
    tally = Counter(seen)
    for leaf, times in sorted(tally.items()):
        if times > 1:
            problems.append(Problem(where, f"found {times} times: duplicated", b, leaf))
    for position, leaf in enumerate(seen):
        if leaf != position and tally[leaf] == 1 and len(seen) == entry.count:
            problems.append(Problem(where, f"found at position {position}: reordered", b, leaf))
    if problems or len(leaves) != entry.count:
        return problems or [Problem(where, f"{len(leaves)} records, {entry.count} anchored", b)]
    if build_levels(leaves)[-1][0].hex() == entry.root:
        return []
    stored: list[bytes] | None = None
    if tree is not None:
        with contextlib.suppress(PromptLogError):
            levels = split_levels(tree, entry.count)
            if levels[-1][0].hex() == entry.root:
                stored = levels[0]
    if stored is not None:
        for leaf, (now, then) in enumerate(zip(leaves, stored, strict=True)):
            if now != then:
                problems.append(
                    Problem(
                        where,
                        "ts, session or content_hash edited "
                        "(its leaf differs from the anchored tree)",
                        b,
                        leaf,
                    )
                )
        return problems
    return [
        Problem(
            where,
            "records do not hash to the anchored root (a record and the stored tree were edited)",
            b,
        )
    ]


# --- traces -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracedRecord:
    """One record of a session, its inclusion proof, the anchored root and whether it verifies."""

    batch: int
    leaf: int
    record: dict[str, Any]
    proof: list[str]
    root: str
    ok: bool
    problem: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "batch": self.batch,
            "leaf": self.leaf,
            "record": self.record,
            "proof": self.proof,
            "root": self.root,
            "verified": self.ok,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Trace:
    """A session's records in log order."""

    session: str
    records: list[TracedRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every record's proof verifies against its anchored root."""
        return all(r.ok for r in self.records)


# --- the log (I/O) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptLogKeys:
    """Redis keys of the log (hash-tagged so they share a cluster slot)."""

    roots: str
    head: str
    session_prefix: str

    @classmethod
    def for_prefix(cls, prefix: str) -> PromptLogKeys:
        """Keys under `{prefix}`."""
        return cls(
            f"{{{prefix}}}:prompts:roots", f"{{{prefix}}}:prompts:head", f"{{{prefix}}}:prompts:s:"
        )

    def session(self, session: str) -> str:
        """The index key of a session."""
        return self.session_prefix + session


_APPEND_LUA = """
local head = redis.call('GET', KEYS[2])
if not head then
  if redis.call('LLEN', KEYS[1]) > 0 then return {-1, 'prompt log head key missing'} end
  head = ARGV[4]
end
if head ~= ARGV[1] then return {0, head} end
redis.call('RPUSH', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[2])
for k = 3, #KEYS do
  for item in string.gmatch(ARGV[k + 2], '[^,]+') do redis.call('RPUSH', KEYS[k], item) end
end
return {1, ARGV[2]}
"""

SHIFTED = (
    "not at its indexed offset: bytes before it were edited, inserted or removed "
    "(redline prompts verify says where)"
)
RESEALED = "bytes differ from the sealed digest but every record verifies (reformatted)"
_SEGMENT_FILE = re.compile(r"^records-(\d{6,})\.seg$")


def _read_range(handle: BinaryIO, offset: int, length: int) -> bytes:
    return os.pread(handle.fileno(), length, offset)


def stored_proof(handle: BinaryIO, entry: BatchEntry, leaf: int) -> list[bytes]:
    """The inclusion proof of `leaf` read from the batch's stored tree: one 32-byte read per
    level (the tree is not trusted: the proof is checked against the anchored root)."""
    proof: list[bytes] = []
    level_at, index = entry.tree_offset, leaf
    for size in level_sizes(entry.count)[:-1]:
        sibling = index ^ 1
        if sibling < size:
            proof.append(os.pread(handle.fileno(), 32, level_at + 32 * sibling))
        level_at += 32 * size
        index //= 2
    return proof


def _sha256_at(fd: int, offset: int, length: int) -> str:
    # pread, not mmap: a file truncated under a mapping kills the reader with SIGBUS, and the
    # watcher must outlive exactly that kind of tampering.
    return hashlib.sha256(os.pread(fd, max(0, length), offset)).hexdigest()


def check_tree(entry: BatchEntry, tree: bytes | None) -> str | None:
    """Why a batch's stored tree cannot give proofs of its anchored root (None: it can): every
    level is rebuilt from the stored leaves and compared, the root against the anchor."""
    if tree is None:
        return "the stored tree cannot be read"
    try:
        levels = split_levels(tree, entry.count)
    except PromptLogError as exc:
        return f"the stored tree is cut or grown: {exc}"
    if build_levels(levels[0]) != levels:
        return "the stored tree was edited: its levels do not hash to each other"
    if levels[-1][0].hex() != entry.root:
        return "the stored tree was rebuilt over other leaves: it leads to another root"
    return None


def _leaf_of(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["i"])
    except (ValueError, KeyError, TypeError):
        return None


def _batch_of(line: bytes) -> int:
    try:
        return int(json.loads(line)["b"])
    except (ValueError, KeyError, TypeError):
        return -1


class PromptLog:
    """Append, trace and verify the prompt log of `directory`, anchored in Redis."""

    def __init__(
        self,
        client: redis.Redis,
        directory: Path,
        prefix: str = "redline",
        fsync: bool = True,
        segment_bytes: int = 16 << 20,
    ) -> None:
        self.client = client
        self.directory = directory
        self.keys = PromptLogKeys.for_prefix(prefix)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.roots_file = directory / "roots.jsonl"
        self._script = client.register_script(_APPEND_LUA)
        self._mirrored: int | None = None

    # files ---------------------------------------------------------------------------------

    def segment_path(self, segment: int) -> Path:
        """The records file of `segment`."""
        return self.directory / f"records-{segment:06d}.seg"

    def tree_path(self, segment: int) -> Path:
        """The Merkle trees file of `segment`."""
        return self.directory / f"tree-{segment:06d}.bin"

    def segment_files(self) -> dict[int, Path]:
        """The records files on disk, by segment number."""
        found: dict[int, Path] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in self.directory.iterdir():
                match = _SEGMENT_FILE.match(path.name)
                if match:
                    found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    # appends ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "lock").open("a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def head(self) -> Head:
        """The anchored head (the empty head when nothing was appended)."""
        raw = self.client.get(self.keys.head)
        return Head.parse(as_text(raw)) if raw else EMPTY_HEAD

    def entry(self, batch: int) -> BatchEntry | None:
        """The anchored entry of `batch` (None when there is none)."""
        raw = self.client.lindex(self.keys.roots, batch)
        return None if raw is None else BatchEntry.parse(as_text(raw))

    def anchored(self) -> tuple[list[str], Head | None]:
        """Every anchored entry line in Redis and the head (None when there is none), read at
        one instant."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(self.keys.roots, 0, -1)
            pipe.get(self.keys.head)
            raw_lines, raw_head = pipe.execute()
        return [as_text(x) for x in raw_lines], Head.parse(as_text(raw_head)) if raw_head else None

    def append(self, records: Sequence[PromptRecord]) -> BatchEntry:
        """Write `records` as one batch, anchor its root, mirror it; its entry."""
        with self._locked():
            head = self.head()
            last = self.entry(head.count - 1) if head.count else None
            if last is None:
                segment, records_at, tree_at = 0, 0, 0
            elif last.records_end >= self.segment_bytes:
                # The current segment is full: it is closed for good, the batch opens the next.
                self._cut(self.segment_path(last.segment), last.records_end)
                self._cut(self.tree_path(last.segment), last.tree_end)
                segment, records_at, tree_at = last.segment + 1, 0, 0
            else:
                segment, records_at, tree_at = last.segment, last.records_end, last.tree_end
            for stale in (self.segment_path(segment + 1), self.tree_path(segment + 1)):
                if stale.exists():
                    self._cut(stale, 0)
            built = build_batch(records, head.count, head.chain, records_at, tree_at, segment)
            self._write_at(self.segment_path(segment), records_at, built.records)
            self._write_at(self.tree_path(segment), tree_at, built.tree)
            sessions = list(built.index)
            reply = self._script(
                keys=[self.keys.roots, self.keys.head, *(self.keys.session(s) for s in sessions)],
                args=[
                    head.render(),
                    Head(head.count + 1, built.entry.chain).render(),
                    built.entry.render(),
                    EMPTY_HEAD.render(),
                    *(",".join(built.index[s]) for s in sessions),
                ],
            )
            status, value = int(reply[0]), as_text(reply[1])
            if status != 1:
                raise PromptLogError(f"anchoring batch {head.count} failed: {value}")
            self._mirror()
            return built.entry

    def _cut(self, path: Path, offset: int) -> None:
        # Bytes past the last anchored batch belong to an append that never anchored: they were
        # never part of the log, so they are cut before a batch takes their place.
        with contextlib.suppress(FileNotFoundError), path.open("r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size > offset:
                log.warning(
                    "%s: dropping %d unanchored bytes of an interrupted append", path, size - offset
                )
                handle.truncate(offset)

    def _write_at(self, path: Path, offset: int, data: bytes) -> None:
        with path.open("ab+") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size < offset:
                raise PromptLogError(
                    f"{path} holds {size} bytes, the anchored batches {offset}: it was truncated"
                )
            if size > offset:
                log.warning(
                    "%s: dropping %d unanchored bytes of an interrupted append", path, size - offset
                )
                handle.truncate(offset)
            handle.write(data)
            handle.flush()
            if self.fsync:
                os.fsync(handle.fileno())

    def _mirror(self) -> None:
        """Append to roots.jsonl the entries it lacks (it follows Redis, never leads)."""
        try:
            if self._mirrored is None:
                self._mirrored = len(read_lines(self.roots_file))
            lines = [
                as_text(x)
                for x in cast(list[Any], self.client.lrange(self.keys.roots, self._mirrored, -1))
            ]
            if lines:
                with self.roots_file.open("a", encoding="utf-8") as handle:
                    handle.write("".join(f"{line}\n" for line in lines))
                    handle.flush()
                    if self.fsync:
                        os.fsync(handle.fileno())
                self._mirrored += len(lines)
        except (OSError, redis.RedisError) as exc:
            self._mirrored = None
            log.error("prompt log roots mirror %s not updated: %s", self.roots_file, exc)

    # trace-back ----------------------------------------------------------------------------

    def trace(self, session: str) -> Trace:
        """The session's records from the index, each with its inclusion proof checked against
        the anchored root of its batch (no scan: one index read, then a read per record)."""
        raw = cast(list[Any], self.client.lrange(self.keys.session(session), 0, -1))
        located = []
        for item in raw:
            b, leaf, offset, length = (int(x) for x in as_text(item).split(":"))
            located.append((b, leaf, offset, length))
        if not located:
            return Trace(session)
        batches = sorted({b for b, *_ in located})
        with self.client.pipeline(transaction=False) as pipe:
            for b in batches:
                pipe.lindex(self.keys.roots, b)
            anchored = dict(zip(batches, pipe.execute(), strict=True))
        out: list[TracedRecord] = []
        with contextlib.ExitStack() as stack:
            files: dict[int, tuple[BinaryIO, BinaryIO] | OSError] = {}
            for b, leaf, offset, length in located:
                text = anchored.get(b)
                if text is None:
                    out.append(
                        TracedRecord(b, leaf, {}, [], "", False, "no anchored root for the batch")
                    )
                    continue
                entry = BatchEntry.parse(as_text(text))
                if entry.segment not in files:
                    try:
                        files[entry.segment] = (
                            stack.enter_context(self.segment_path(entry.segment).open("rb")),
                            stack.enter_context(self.tree_path(entry.segment).open("rb")),
                        )
                    except OSError as exc:
                        files[entry.segment] = exc
                opened = files[entry.segment]
                if isinstance(opened, OSError):
                    problem = f"segment {entry.segment} cannot be read: {opened.strerror}"
                    out.append(TracedRecord(b, leaf, {}, [], entry.root, False, problem))
                    continue
                seg, tree_handle = opened
                out.append(self._traced(entry, leaf, _read_range(seg, offset, length), tree_handle))
        return Trace(session, out)

    def _traced(
        self,
        entry: BatchEntry,
        leaf: int,
        raw: bytes,
        tree_handle: BinaryIO,
    ) -> TracedRecord:
        b = entry.batch
        record = parse_record(raw)
        if record is None or (record["b"], record["i"]) != (b, leaf):
            return TracedRecord(b, leaf, {}, [], entry.root, False, SHIFTED)
        proof = stored_proof(tree_handle, entry, leaf)
        problem = ""
        if record_content_hash(record) != record["content_hash"]:
            problem = "content does not match its hash: edited"
        else:
            node = leaf_hash(str(record["ts"]), str(record["session"]), str(record["content_hash"]))
            if not verify_proof(node, leaf, entry.count, proof, bytes.fromhex(entry.root)):
                problem = "the inclusion proof does not lead to the anchored root: edited"
        return TracedRecord(
            b, leaf, record, [p.hex() for p in proof], entry.root, not problem, problem
        )

    def scan(self, session: str) -> list[dict[str, Any]]:
        """The session's records by reading every record (what a log without an index does)."""
        found: list[dict[str, Any]] = []
        for path in self.segment_files().values():
            with path.open("rb") as handle:
                for line in handle:
                    record = json.loads(line)
                    if record.get("session") == session:
                        found.append(record)
        return found

    # verification --------------------------------------------------------------------------

    def verify(self, deep: bool = False, threads: int = 2) -> VerifyReport:
        """Check both copies of the chain, that they agree, and every batch's sealed bytes;
        diagnose the batches that changed. `deep`: recompute every Merkle root too."""
        started = time.perf_counter()
        raw_lines, head = self.anchored()
        redis_entries, problems = check_chain(raw_lines, head or EMPTY_HEAD, "redis")
        file_entries, file_problems = check_chain(
            read_lines(self.roots_file), None, str(self.roots_file.name)
        )
        problems += file_problems
        if not problems:
            problems += compare_copies(redis_entries, file_entries, self.roots_file.name)
        problems += self.check_segments(redis_entries, None, deep, threads)
        records = sum(e.count for e in redis_entries)
        return VerifyReport(problems, len(redis_entries), records, time.perf_counter() - started)

    def verify_batch(self, batch: int) -> VerifyReport:
        """The targeted check: one batch's anchored entry, its sealed bytes, its records."""
        started = time.perf_counter()
        entry = self.entry(batch)
        if entry is None:
            return VerifyReport(
                [Problem("redis", "no anchored entry", batch)], 0, 0, time.perf_counter() - started
            )
        problems: list[Problem] = []
        if entry.chain != entry.expected_chain():
            problems.append(Problem("redis", "entry does not match its chain hash: edited", batch))
        try:
            data = self._segment_range(entry.segment, entry.records_offset, entry.records_length)
        except FileNotFoundError:
            name = self.segment_path(entry.segment).name
            problems.append(Problem("records", f"{name} is missing: deleted", batch))
            return VerifyReport(problems, 1, entry.count, time.perf_counter() - started)
        if hashlib.sha256(data).hexdigest() != entry.records_digest:
            problems += diagnose_batch(entry, data.splitlines(), self.stored_tree(entry)) or [
                Problem("records", RESEALED, batch)
            ]
        return VerifyReport(problems, 1, entry.count, time.perf_counter() - started)

    def sealed(self, entry: BatchEntry) -> bool:
        """True when the batch's bytes are where its entry says and match their seal."""
        try:
            data = self._segment_range(entry.segment, entry.records_offset, entry.records_length)
        except OSError:
            return False
        return hashlib.sha256(data).hexdigest() == entry.records_digest

    def _segment_range(self, segment: int, offset: int, length: int) -> bytes:
        with self.segment_path(segment).open("rb") as handle:
            return _read_range(handle, offset, length)

    def stored_tree(self, entry: BatchEntry) -> bytes | None:
        """The bytes of a batch's stored tree (None when they cannot be read)."""
        try:
            with self.tree_path(entry.segment).open("rb") as handle:
                return _read_range(handle, entry.tree_offset, entry.tree_end - entry.tree_offset)
        except OSError:
            return None

    def check_trees(self, entries: Sequence[BatchEntry]) -> list[Problem]:
        """Check the stored trees of `entries` against their anchored roots (the records are
        not read: `trace` relies on these trees for its proofs)."""
        problems = []
        for entry in entries:
            reason = check_tree(entry, self.stored_tree(entry))
            if reason is not None:
                problems.append(Problem("tree", reason, entry.batch))
        return problems

    def check_segments(
        self,
        entries: Sequence[BatchEntry],
        segments: Iterable[int] | None = None,
        deep: bool = False,
        threads: int = 2,
        unanchored: bool = True,
    ) -> list[Problem]:
        """Check the sealed bytes of every batch of `segments` (None: all) against the anchored
        `entries` (the whole chain, trusted) and the files' sizes; diagnose the batches that
        changed. `deep`: diagnose every batch (recompute its root) even when its bytes are
        intact. `unanchored`: report bytes past the last anchored batch (the watcher, which
        sees appends in flight, judges those itself)."""
        if not entries:
            wanted = None if segments is None else set(segments)
            return self._unanchored(None, wanted, 0) if unanchored else []
        groups: dict[int, list[BatchEntry]] = {}
        for entry in entries:
            groups.setdefault(entry.segment, []).append(entry)
        asked = None if segments is None else set(segments)
        wanted = set(groups) if asked is None else asked & set(groups)
        problems: list[Problem] = []
        fds: dict[int, int] = {}
        last = entries[-1]
        try:
            for segment in sorted(wanted):
                path = self.segment_path(segment)
                group = groups[segment]
                try:
                    fds[segment] = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    problems.append(
                        Problem(
                            "records",
                            f"{path.name} is missing: the {sum(e.count for e in group)} records "
                            f"of batches {group[0].batch}..{group[-1].batch} were deleted",
                            group[0].batch,
                        )
                    )
            jobs = [(fds[s], e) for s in sorted(fds) for e in groups[s]]
            with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
                # hashlib and pread release the GIL: the seals are checked in parallel.
                digests = list(
                    pool.map(
                        lambda job: _sha256_at(
                            job[0], job[1].records_offset, job[1].records_length
                        ),
                        jobs,
                        chunksize=max(1, len(jobs) // (8 * max(1, threads))),
                    )
                )
            bad = {
                e.batch for (_, e), d in zip(jobs, digests, strict=True) if d != e.records_digest
            }
            for segment, fd in fds.items():
                problems += self._check_segment(
                    segment, fd, groups[segment], bad, last, deep, unanchored
                )
        finally:
            for fd in fds.values():
                os.close(fd)
        if unanchored:
            problems += self._unanchored(last, asked, len(entries))
        return problems

    def _unanchored(
        self, last: BatchEntry | None, segments: set[int] | None, count: int
    ) -> list[Problem]:
        """Records files past the last anchored segment that hold bytes (an append in progress,
        one interrupted, or bytes written outside the log)."""
        after = -1 if last is None else last.segment
        stray = {
            n: path
            for n, path in self.segment_files().items()
            if n > after and (segments is None or n in segments)
        }
        found = [(path, path.stat().st_size) for path in stray.values() if path.exists()]
        found = [(path, size) for path, size in found if size]
        if found and self.head().count != count:
            return []  # an append anchored since the entries were read: those bytes are its
        return [
            Problem(
                "records",
                f"{path.name} holds {size} bytes that no anchored batch names: an interrupted "
                "append, or records written outside the log",
            )
            for path, size in found
        ]

    def _check_segment(
        self,
        segment: int,
        fd: int,
        group: Sequence[BatchEntry],
        bad: set[int],
        last: BatchEntry,
        deep: bool,
        unanchored: bool,
    ) -> list[Problem]:
        """Size and diagnosis of one records file whose batches' seals were checked (`bad`:
        the batches whose bytes differ from their seal)."""
        name = self.segment_path(segment).name
        problems: list[Problem] = []
        size = os.fstat(fd).st_size
        end = group[-1].records_end
        trailing = size > end and last.segment == segment and not (bad & {e.batch for e in group})
        if trailing and (not unanchored or self.head().count != last.batch + 1):
            size = end  # the bytes of an append in flight, or anchored since the entries were read
        if size != end:
            problems.append(
                Problem(
                    "records",
                    f"{name} holds {size} bytes, the anchored batches {end}: "
                    + (
                        "records were removed or shortened"
                        if size < end
                        else "unanchored bytes at its end (an interrupted append, or records "
                        "written outside the log)"
                        if trailing
                        else "bytes were inserted or records lengthened"
                    ),
                )
            )
        mine = [e for e in group if e.batch in bad]
        if not mine and not deep:
            return problems
        delta = size - end
        if mine and not deep:
            first = mine[0]
            # One edit that changed the length of `first` moves every later batch of the file by
            # `delta` bytes: their seals hold where they moved to, so only `first` is parsed.
            moved = all(
                _sha256_at(fd, e.records_offset + delta, e.records_length) == e.records_digest
                for e in mine[1:]
            )
            if moved and (delta == 0 or len(mine) == len(group) - group.index(first)):
                data = os.pread(fd, max(0, first.records_length + delta), first.records_offset)
                found = diagnose_batch(first, data.splitlines(), self.stored_tree(first))
                return problems + (found or [Problem("records", RESEALED, first.batch)])
        start = mine[0] if mine and not deep else group[0]
        last_bad = mine[-1].batch if mine and not deep else group[-1].batch
        # The general case: from the first changed batch on, records are grouped by the batch
        # they name (a removed or inserted line shifts later batches' bytes, not their records),
        # up to the first line of a batch after the last changed one.
        grouped: dict[int, list[bytes]] = {}
        highest = -1
        for line in _lines_from(self.segment_path(segment), start.records_offset):
            b = _batch_of(line)
            if last_bad < b <= group[-1].batch:
                break
            grouped.setdefault(b, []).append(line)
            if 0 <= b < highest:
                # Records are grouped by the batch they name, so a record moved into another
                # batch's bytes would look intact: its place in the file gives it away.
                leaf = _leaf_of(line)
                problems.append(
                    Problem("records", f"found after records of batch {highest}: moved", b, leaf)
                )
            highest = max(highest, b)
        for stray in grouped.pop(-1, []):
            problems.append(
                Problem("records", f"a line of {name} that is not a record: {stray[:60]!r}")
            )
        here = {e.batch for e in group}
        for b in sorted(set(grouped) - here):
            reason = (
                f"records of batch {b}, anchored in another segment, found in {name}: moved"
                if 0 <= b <= last.batch
                else "records of a batch that was never anchored: inserted"
            )
            problems.append(Problem("records", reason, b))
        shifted = any("moved" in p.reason for p in problems)
        for entry in group:
            if entry.batch < start.batch or entry.batch > last_bad:
                continue
            if entry.batch not in bad and not deep:
                continue  # its sealed bytes are intact where the anchor says
            found = diagnose_batch(entry, grouped.get(entry.batch, []), self.stored_tree(entry))
            problems += found
            shifted = shifted or bool(found)
            if not found and entry.batch in bad and not shifted:
                problems.append(Problem("records", RESEALED, entry.batch))
        return problems


def _lines_from(path: Path, offset: int) -> Iterator[bytes]:
    with path.open("rb") as handle:
        handle.seek(offset)
        for line in handle:
            if line.strip():
                yield line.rstrip(b"\n")


def read_lines(path: Path) -> list[str]:
    """The non-blank lines of a text file, none when it does not exist."""
    try:
        with path.open("r", encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def as_text(value: Any) -> str:
    """A Redis reply (bytes or str) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def open_prompt_log(settings: PromptLogSettings, redis_url: str) -> PromptLog:
    """The log `settings` describe, anchored in `settings.redis_url` or else `redis_url`."""
    client = open_redis(settings.redis_url or redis_url, socket_timeout=5.0)
    return PromptLog(
        client, settings.directory, settings.key_prefix, settings.fsync, settings.segment_bytes
    )


# --- capture at the gateway -------------------------------------------------------------------


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def prompt_text(payload: Mapping[str, Any] | None) -> str | None:
    """The prompt of an OpenAI chat or completions request (`role: content` per message)."""
    if not payload:
        return None
    messages = payload.get("messages")
    if isinstance(messages, list):
        return "\n".join(
            f"{m.get('role', '')}: {_message_text(m.get('content'))}"
            for m in messages
            if isinstance(m, dict)
        )
    prompt = payload.get("prompt")
    if isinstance(prompt, list):
        return "\n".join(str(p) for p in prompt)
    return None if prompt is None else str(prompt)


def answer_text(body: bytes | None) -> str | None:
    """The answer of a non-streamed OpenAI response (None for a stream or no JSON)."""
    if not body:
        return None
    try:
        choices = json.loads(body).get("choices")
    except (ValueError, AttributeError):
        return None
    if not isinstance(choices, list):
        return None
    parts = []
    for choice in choices:
        if isinstance(choice, dict):
            message = choice.get("message")
            text = (
                _message_text(message.get("content"))
                if isinstance(message, dict)
                else choice.get("text")
            )
            parts.append("" if text is None else str(text))
    return "\n".join(parts)


def streamed_text(parts: Sequence[bytes]) -> str:
    """The answer of a streamed response from the raw JSON string bodies of its content deltas,
    as the gateway's stream tally keeps them (n > 1 choices come interleaved)."""
    try:
        # Whole escapes only ever sit inside one part, so the parts join into one JSON string.
        return str(json.loads(b'"' + b"".join(parts) + b'"'))
    except ValueError:
        out = []
        for raw in parts:
            with contextlib.suppress(ValueError):
                out.append(str(json.loads(b'"' + raw + b'"')))
        return "".join(out)


def session_of(
    headers: Iterable[tuple[str, str]], payload: Mapping[str, Any] | None, request_id: str
) -> str:
    """The session a request belongs to: the session header, else the payload's `user`, else
    the request itself."""
    for name, value in headers:
        if name.lower() == SESSION_HEADER and value:
            return value[:256]
    user = payload.get("user") if payload else None
    return str(user)[:256] if user else request_id


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


_STOP = object()


class PromptLogWriter:
    """The gateway's background writer: `submit` only enqueues (never blocks, drops when the
    queue is full); a thread redacts, batches and appends."""

    def __init__(self, settings: PromptLogSettings, prompt_log: PromptLog) -> None:
        self.settings = settings
        self.log = prompt_log
        self.redactor = settings.redactor()
        self.queue: queue.Queue[Any] = queue.Queue(settings.queue_size)
        self.dropped = 0
        self.failed = 0
        self.written = 0
        self._thread: threading.Thread | None = None

    def submit(
        self,
        request_id: str,
        headers: Sequence[tuple[str, str]],
        payload: Mapping[str, Any] | None,
        body: bytes | None,
        streamed: Sequence[bytes] | None = None,
        truncated: bool = False,
    ) -> None:
        """Queue one answered request (the request path's only cost): a response's `body`, or
        for a stream the raw content deltas it sent (`streamed`), `truncated` when it was cut
        short. Decoding, redaction and hashing happen on the writer's thread."""
        try:
            item = (time.time(), request_id, headers, payload, body, streamed, truncated)
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="prompt-log", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread is None:
            return
        self.queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        pending: list[Any] = []
        deadline = 0.0
        while True:
            timeout = None if not pending else max(0.0, deadline - time.monotonic())
            try:
                item = self.queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._flush(pending)
                return
            if item is not None:
                if not pending:
                    deadline = time.monotonic() + self.settings.flush_seconds
                pending.append(item)
            if pending and (item is None or len(pending) >= self.settings.batch_size):
                self._flush(pending)
                pending = []

    def _flush(self, items: list[Any]) -> None:
        if not items:
            return
        try:
            records = [
                build_record(
                    ts,
                    request_id,
                    session_of(headers, payload, request_id),
                    prompt_text(payload),
                    answer_text(body) if streamed is None else streamed_text(streamed),
                    self.redactor,
                    self.settings.store,
                    truncated,
                )
                for ts, request_id, headers, payload, body, streamed, truncated in items
            ]
            self.log.append(records)
            self.written += len(records)
        except (PromptLogError, OSError, redis.RedisError) as exc:
            # Logging must never take the gateway down; the lost records are counted.
            self.failed += len(items)
            log.error("prompt log: %d records not written: %s", len(items), exc)


def build_prompt_log_writer(settings: PromptLogSettings, redis_url: str) -> PromptLogWriter | None:
    """The gateway's writer when `settings.enabled` (not started), else None."""
    if not settings.enabled:
        return None
    return PromptLogWriter(settings, open_prompt_log(settings, redis_url))
