"""Pure parts of the index write path: entry encoding, stream ids, checks, conflict resolution."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redline.platform.index import (
    DeltaLogError,
    Entry,
    RowState,
    Version,
    build_fields,
    build_resolution,
    check_id,
    check_region,
    parse_entry,
    parse_packed,
    parse_packed_at,
    parse_stream_id,
    row_checksum,
    stream_id_before,
    to_vector,
    vector_checksum,
)


def _fields(op: str, row_id: str, vector: np.ndarray | None) -> dict[bytes, bytes]:
    raw = build_fields("upsert" if op == "u" else "delete", row_id, "eu", 1234, vector)
    return {k.encode(): v for k, v in raw.items()}


def test_entries_round_trip_with_exact_vectors_and_checksums() -> None:
    vector = np.array([0.1, -0.0, 3.5e-8, 1e30], dtype=np.float32)
    entry = parse_entry(b"5-1", _fields("u", "doc:1", vector), 4)
    assert entry.op == "upsert" and entry.id == "doc:1" and entry.ts_ms == 1234
    assert entry.vector is not None and entry.vector.tobytes() == vector.tobytes()
    assert entry.checksum == vector_checksum(vector) and len(entry.checksum) == 32
    gone = parse_entry("6-0", _fields("d", "doc:1", None), 4)
    assert gone.op == "delete" and gone.vector is None and gone.checksum == ""
    assert b"fields" not in _fields("u", "doc:1", vector)  # rows of id + vector: as before


def test_a_rows_other_fields_travel_with_it_and_count_in_its_checksum() -> None:
    vector = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    payload = b'{"lang":"en","n":3}'
    raw = build_fields("upsert", "7", "eu", 1, vector, payload)
    entry = parse_entry("8-0", {k.encode(): v for k, v in raw.items()}, 4)
    assert entry.payload == payload
    assert entry.checksum == row_checksum(vector, payload) != vector_checksum(vector)
    assert row_checksum(vector, payload + b" ") != entry.checksum
    assert row_checksum(vector) == vector_checksum(vector)
    assert b"fields" not in build_fields("delete", "7", "eu", 2, None, payload)


def _packed(
    op: bytes, sid: bytes, row_id: bytes, ts: bytes, vector: bytes, fields: bytes = b""
) -> bytes:
    """What the read script returns for one entry."""
    region, checksum = b"eu", b"c" * 32
    lengths = (len(sid), len(row_id), len(region), len(ts), 32, len(vector), len(fields))
    head = struct.pack(">cHHHHHII", op, *lengths)
    return head + sid + row_id + region + ts + checksum + vector + fields


def test_packed_entries_decode_like_stream_fields() -> None:
    vector = np.arange(4, dtype=np.float32)
    entry = parse_packed(_packed(b"u", b"9-2", b"doc", b"77", vector.tobytes()), 4)
    assert (entry.stream_id, entry.op, entry.id, entry.region, entry.ts_ms) == (
        "9-2", "upsert", "doc", "eu", 77,
    )  # fmt: skip
    assert entry.vector is not None and entry.vector.tobytes() == vector.tobytes()
    assert parse_packed(_packed(b"d", b"9-3", b"doc", b"78", b""), 4).op == "delete"
    with pytest.raises(DeltaLogError, match=r"entry 9-4: vector has 8 bytes, expected 16"):
        parse_packed(_packed(b"u", b"9-4", b"doc", b"1", b"\0" * 8), 4)
    with pytest.raises(DeltaLogError, match=r"entry 9-5: malformed"):
        parse_packed(_packed(b"u", b"9-5", b"doc", b"", b""), 4)
    with pytest.raises(DeltaLogError, match=r"entry 9-6: unknown op b'\?'"):
        parse_packed(_packed(b"?", b"9-6", b"doc", b"1", b""), 4)
    with pytest.raises(DeltaLogError, match="truncated"):
        parse_packed(b"u\0", 4)
    carried = parse_packed(_packed(b"u", b"9-8", b"7", b"1", vector.tobytes(), b'{"t":"x"}'), 4)
    assert carried.payload == b'{"t":"x"}' and carried.vector is not None
    two = _packed(b"u", b"9-7", b"a", b"1", vector.tobytes()) + b"extra"
    entry, end = parse_packed_at(two, 0, 4)
    assert entry.id == "a" and two[end:] == b"extra"
    with pytest.raises(DeltaLogError, match="truncated"):
        parse_packed(two[:-8], 4)


def test_malformed_entries_name_the_entry_and_the_problem() -> None:
    fields = _fields("u", "a", np.ones(4, dtype=np.float32))
    with pytest.raises(DeltaLogError, match=r"entry 7-0: vector has 16 bytes, expected 32"):
        parse_entry("7-0", fields, 8)
    with pytest.raises(DeltaLogError, match=r"entry 7-1: malformed"):
        parse_entry("7-1", {b"op": b"u"}, 4)
    with pytest.raises(DeltaLogError, match=r"unknown op b'x'"):
        parse_entry("7-2", {**fields, b"op": b"x"}, 4)


def test_checks_reject_bad_ids_regions_and_vectors() -> None:
    assert check_id("doc-1:a/b") == "doc-1:a/b"
    for bad in ("", "a'b", 'a"b', "a b", "x" * 257):
        with pytest.raises(DeltaLogError, match="invalid row id"):
            check_id(bad)
    with pytest.raises(DeltaLogError, match="invalid region"):
        check_region("EU West")
    with pytest.raises(DeltaLogError, match=r"shape \(3,\), expected \(4,\)"):
        to_vector([1.0, 2.0, 3.0], 4)
    with pytest.raises(DeltaLogError, match="NaN or infinite"):
        to_vector([1.0, float("nan"), 0.0, 0.0], 4)


def test_stream_id_helpers() -> None:
    assert parse_stream_id("1700000000000-3") == (1700000000000, 3)
    assert stream_id_before("10-3") == "10-2"
    assert stream_id_before("10-0") == f"9-{2**64 - 1}"
    assert stream_id_before("0-0") == "0-0"
    with pytest.raises(DeltaLogError, match="not a stream id"):
        parse_stream_id("abc")


def _entry(n: int, op: str, row_id: str, ts: int, region: str, tag: int) -> Entry:
    vector = np.full(2, float(tag), dtype=np.float32) if op == "upsert" else None
    checksum = vector_checksum(vector) if vector is not None else ""
    return Entry(f"1-{n}", op, row_id, region, ts, checksum, vector)  # type: ignore[arg-type]


def _final(entries: list[Entry], batch: int) -> dict[str, tuple[str, int, str, str]]:
    """Apply entries in batches against an in-memory target (rows + tombstones)."""
    rows: dict[str, RowState] = {}
    tombs: dict[str, Version] = {}
    for start in range(0, len(entries), batch):
        chunk = entries[start : start + batch]
        ids = {e.id for e in chunk}
        res = build_resolution(
            chunk,
            {k: v for k, v in rows.items() if k in ids},
            {k: v for k, v in tombs.items() if k in ids},
        )
        for e in res.deletes:
            tombs[e.id] = e.version
            rows.pop(e.id, None)
        for e in res.upserts:
            rows[e.id] = RowState(e.version, e.checksum)
            tombs.pop(e.id, None)
    state = {k: ("upsert", v.version.ts_ms, v.version.region, v.checksum) for k, v in rows.items()}
    for k, v in tombs.items():
        if k not in rows:
            state[k] = ("delete", v.ts_ms, v.region, "")
    return state


writes = st.lists(
    st.tuples(
        st.sampled_from(["upsert", "delete"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 5),
        st.sampled_from(["eu", "us", "ap"]),
    ),
    min_size=1,
    max_size=7,
    unique_by=lambda w: (w[1], w[2], w[3]),  # distinct versions per id: order cannot matter
)


@settings(max_examples=200, deadline=None)
@given(writes)
def test_resolution_is_the_same_for_every_arrival_order_and_batch_size(
    spec: list[tuple[str, str, int, str]],
) -> None:
    tagged = [(op, row, ts, region, i) for i, (op, row, ts, region) in enumerate(spec)]
    outcomes = set()
    for order in itertools.islice(itertools.permutations(tagged), 60):
        entries = [_entry(n, *w) for n, w in enumerate(order)]
        for batch in (1, 2, len(entries)):
            outcomes.add(tuple(sorted(_final(entries, batch).items())))
    assert len(outcomes) == 1
    # and the survivor of each id is its highest (ts, region) write
    (outcome,) = outcomes
    for row_id, (op, ts, region, _) in outcome:
        best = max((w for w in tagged if w[1] == row_id), key=lambda w: (w[2], w[3]))
        assert (op, ts, region) == (best[0], best[2], best[3])


def test_conflicts_count_writes_that_meet_another_regions_different_write() -> None:
    a = _entry(0, "upsert", "x", 10, "eu", 1)
    b = _entry(1, "upsert", "x", 20, "us", 2)
    same = _entry(2, "upsert", "x", 30, "us", 2)
    assert build_resolution([a, b], {}, {}).conflicts == 1
    assert build_resolution([b, a], {}, {}).conflicts == 1
    late = build_resolution([a], {"x": RowState(b.version, b.checksum)}, {})
    assert (late.conflicts, late.superseded, late.upserts) == (1, 1, ())
    # a newer write from the same region is an update, not a conflict
    assert build_resolution([b, same], {}, {}).conflicts == 0
