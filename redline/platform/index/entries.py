"""The delta log's entries: stream ids, row ids and regions, vectors and their checksums, and
an entry's two encodings (its stream fields, and the packed form the read script returns).

An upsert carries the row's vector and, for a collection with more than a primary key and a
vector, its other fields as `payload`: canonical JSON (sorted keys, no spaces) of the scalar and
dynamic fields, normalised to what Milvus stores (`redline.platform.index.schema`). The checksum
covers both, so a row read back from any copy can be checked field by field against its write.

All pure; the Redis side is `redline.platform.index.deltalog`.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from redline.platform.index.errors import DeltaLogError

Vector = npt.NDArray[np.float32]
Op = Literal["upsert", "delete"]

ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:/@#+=-]{1,256}$")
REGION_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
ZERO_ID = "0-0"
_MAX_SEQ = 2**64 - 1


def parse_stream_id(value: str | bytes) -> tuple[int, int]:
    """`"1700000000000-3"` -> (1700000000000, 3); DeltaLogError on anything else."""
    text = value.decode() if isinstance(value, bytes) else value
    ms, sep, seq = text.partition("-")
    if not ms.isdigit() or (sep and not seq.isdigit()):
        raise DeltaLogError(f"not a stream id: {text!r} (expected <ms>-<seq>)")
    return int(ms), int(seq) if sep else 0


def format_stream_id(parts: tuple[int, int]) -> str:
    """(ms, seq) -> `"ms-seq"`."""
    return f"{parts[0]}-{parts[1]}"


def stream_id_before(value: str) -> str:
    """The largest stream id smaller than `value` (exclusive start that includes `value`)."""
    ms, seq = parse_stream_id(value)
    if seq > 0:
        return f"{ms}-{seq - 1}"
    if ms == 0:
        return ZERO_ID
    return f"{ms - 1}-{_MAX_SEQ}"


def to_vector(values: Sequence[float] | npt.NDArray[Any], dim: int) -> Vector:
    """A float32 vector of `dim` finite values; DeltaLogError naming what is wrong otherwise."""
    array = np.asarray(values, dtype=np.float32)
    if array.ndim != 1 or array.shape[0] != dim:
        raise DeltaLogError(f"vector has shape {array.shape}, expected ({dim},)")
    if not np.all(np.isfinite(array)):
        raise DeltaLogError("vector contains NaN or infinite values")
    return array


def vector_checksum(vector: Vector | Sequence[float]) -> str:
    """SHA-256 (first 32 hex digits) of the vector's float32 little-endian bytes."""
    data = np.asarray(vector, dtype="<f4").tobytes()
    return hashlib.sha256(data).hexdigest()[:32]


def row_checksum(vector: Vector | Sequence[float], payload: bytes = b"") -> str:
    """The checksum of a row: its vector's alone when it has no other fields (so rows of the
    original `id, vector` schema keep theirs), else SHA-256 of the vector bytes, a NUL and the
    canonical JSON of the other fields."""
    if not payload:
        return vector_checksum(vector)
    data = np.asarray(vector, dtype="<f4").tobytes() + b"\0" + payload
    return hashlib.sha256(data).hexdigest()[:32]


def check_id(value: str) -> str:
    """A row id usable in the log and in Milvus expressions; DeltaLogError otherwise."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise DeltaLogError(
            f"invalid row id {value!r}: use 1-256 characters of A-Z a-z 0-9 _ . : / @ # + = -"
        )
    return value


def check_region(value: str) -> str:
    """A region name (lowercase, starts alphanumeric, ≤ 63 characters); DeltaLogError otherwise."""
    if not REGION_PATTERN.match(value):
        raise DeltaLogError(
            f"invalid region {value!r}: lowercase letters, digits, '_', '.', '-', ≤ 63 characters"
        )
    return value


@dataclass(frozen=True)
class Version:
    """Which write wins: the later (ts_ms, region); ties go to the later arrival."""

    ts_ms: int
    region: str

    def key(self) -> tuple[int, str]:
        """The ordering key."""
        return (self.ts_ms, self.region)


@dataclass(frozen=True)
class Entry:
    """One delta-log entry: an upsert (with vector and checksum) or a delete of one id."""

    stream_id: str
    op: Op
    id: str
    region: str
    ts_ms: int
    checksum: str
    vector: Vector | None
    payload: bytes = b""
    """Canonical JSON of the row's other fields (empty: none, or a delete)."""

    @property
    def version(self) -> Version:
        """The entry's (ts_ms, region) version."""
        return Version(self.ts_ms, self.region)


def build_fields(
    op: Op, row_id: str, region: str, ts_ms: int, vector: Vector | None, payload: bytes = b""
) -> dict[str, bytes]:
    """The stream fields of an entry; the vector is raw float32 little-endian bytes, `fields`
    (only when the row has other fields) their canonical JSON."""
    if op == "upsert":
        if vector is None:
            raise DeltaLogError(f"upsert of {row_id!r} without a vector")
        blob = np.asarray(vector, dtype="<f4").tobytes()
        checksum = row_checksum(vector, payload)
    else:
        blob, checksum, payload = b"", "", b""
    fields = {
        "op": b"u" if op == "upsert" else b"d",
        "id": row_id.encode(),
        "vector": blob,
        "region": region.encode(),
        "ts_ms": str(ts_ms).encode(),
        "checksum": checksum.encode(),
    }
    if payload:
        fields["fields"] = payload
    return fields


def parse_entry(stream_id: str | bytes, fields: Mapping[bytes, bytes], dim: int) -> Entry:
    """Decode one stream entry; DeltaLogError naming the entry and field when malformed."""
    sid = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    try:
        op_raw = fields[b"op"]
        row_id = fields[b"id"].decode()
        region = fields[b"region"].decode()
        ts_ms = int(fields[b"ts_ms"])
        checksum = fields[b"checksum"].decode()
        blob = fields[b"vector"]
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise DeltaLogError(f"delta-log entry {sid}: malformed ({exc!r})") from None
    if op_raw == b"u":
        if len(blob) != 4 * dim:
            raise DeltaLogError(
                f"delta-log entry {sid}: vector has {len(blob)} bytes, expected {4 * dim}"
            )
        vector: Vector | None = np.frombuffer(blob, dtype="<f4").astype(np.float32)
        payload = fields.get(b"fields", b"")
        return Entry(sid, "upsert", row_id, region, ts_ms, checksum, vector, payload)
    if op_raw == b"d":
        return Entry(sid, "delete", row_id, region, ts_ms, "", None)
    raise DeltaLogError(f"delta-log entry {sid}: unknown op {op_raw!r} (expected u or d)")


_PACKED = struct.Struct(">cHHHHHII")


def parse_packed(blob: bytes, dim: int) -> Entry:
    """Decode one entry as `_READ` packs it (op, lengths, then id, fields and vector bytes)."""
    entry, _ = parse_packed_at(blob, 0, dim)
    return entry


def parse_packed_at(blob: bytes, start: int, dim: int) -> tuple[Entry, int]:
    """Decode the entry packed at `start` (op, 7 lengths, then stream id, id, region, ts_ms,
    checksum, vector bytes, fields JSON); returns it and where the next one starts."""
    truncated = f"delta-log read returned a truncated entry ({len(blob)} bytes)"
    try:
        op, *lengths = _PACKED.unpack_from(blob, start)
    except struct.error:
        raise DeltaLogError(truncated) from None
    end = start + _PACKED.size + sum(lengths)
    if end > len(blob):
        raise DeltaLogError(truncated)
    pos = start + _PACKED.size
    parts: list[bytes] = []
    for length in lengths[:5]:
        parts.append(blob[pos : pos + length])
        pos += length
    sid_raw, id_raw, region_raw, ts_raw, checksum_raw = parts
    sid = sid_raw.decode()
    try:
        row_id, region, ts_ms = id_raw.decode(), region_raw.decode(), int(ts_raw)
        checksum = checksum_raw.decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise DeltaLogError(f"delta-log entry {sid}: malformed ({exc!r})") from None
    if not row_id:
        raise DeltaLogError(f"delta-log entry {sid}: malformed (no id)")
    if op == b"u":
        if lengths[5] != 4 * dim:
            raise DeltaLogError(
                f"delta-log entry {sid}: vector has {lengths[5]} bytes, expected {4 * dim}"
            )
        vector = np.frombuffer(blob, dtype="<f4", count=dim, offset=pos).astype(np.float32)
        payload = blob[pos + lengths[5] : end] if lengths[6] else b""
        return Entry(sid, "upsert", row_id, region, ts_ms, checksum, vector, payload), end
    if op == b"d":
        return Entry(sid, "delete", row_id, region, ts_ms, "", None), end
    raise DeltaLogError(f"delta-log entry {sid}: unknown op {op!r} (expected u or d)")
