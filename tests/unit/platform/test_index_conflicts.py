"""Conflict resolution of two writing regions (pure): the rows a copy holds depend only on the
heads it applied, whatever the order the two regions' writes arrived in."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from redline.platform.index import Entry, build_conflict, build_desired, remap_id, row_checksum
from redline.platform.index.conflicts import Head, Heads, build_row_plan, fold_heads

SALT = "s"


def _entry(region: str, seq: int, row_id: str, ts_ms: int, content: int, op: str) -> Entry:
    vector = np.full(4, float(content), dtype=np.float32)
    if op == "delete":
        return Entry(f"{ts_ms}-{seq}", "delete", row_id, region, ts_ms, "", None)
    return Entry(f"{ts_ms}-{seq}", "upsert", row_id, region, ts_ms, row_checksum(vector), vector)


writes = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 2),
              st.sampled_from(["upsert", "upsert", "delete"])),
    min_size=1, max_size=12,
)  # fmt: skip


def _logs(spec: list[tuple[str, int, int, str]]) -> dict[str, list[Entry]]:
    logs: dict[str, list[Entry]] = {"a": [], "b": []}
    for n, (region, row, content, op) in enumerate(spec):
        logs[region].append(_entry(region, n, f"id{row}", 1000 + n, content, op))
    return logs


def _apply(order: list[Entry]) -> tuple[dict[str, Heads], dict[str, str]]:
    """Fold entries one at a time, as a copy would, keeping its rows (id -> checksum)."""
    heads: dict[str, Heads] = {}
    rows: dict[str, str] = {}
    contents = {e.checksum: (e.vector, b"") for e in order if e.vector is not None}
    for entry in order:
        changed = fold_heads([entry], heads)
        plan = build_row_plan(changed, heads, contents, SALT, "varchar")  # type: ignore[arg-type]
        for up in plan.upserts:
            rows[up.id] = up.checksum
        for gone in plan.deletes:
            rows.pop(gone, None)
        heads.update(changed)
    return heads, rows


@given(writes, st.randoms(use_true_random=False))
def test_any_interleaving_of_the_two_logs_gives_the_same_rows(spec, random) -> None:  # type: ignore[no-untyped-def]
    logs = _logs(spec)
    # each log keeps its own order; the interleaving between them is arbitrary
    a, b = list(logs["a"]), list(logs["b"])
    mixed = []
    while a or b:
        source = a if (a and (not b or random.random() < 0.5)) else b
        mixed.append(source.pop(0))
    assert _apply(mixed) == _apply(logs["a"] + logs["b"]) == _apply(logs["b"] + logs["a"])


def test_a_conflict_keeps_both_contents_the_loser_under_its_remapped_id() -> None:
    a = _entry("a", 0, "x", 1000, 1, "upsert")
    b = _entry("b", 0, "x", 1001, 2, "upsert")
    heads, rows = _apply([a, b])
    rid = remap_id("x", "a", SALT, "varchar")
    assert rows == {"x": b.checksum, rid: a.checksum}
    desired = build_desired("x", heads["x"], SALT, "varchar")
    assert [c.field for c in desired.conflicts] == [f"x|{min(a.checksum, b.checksum)}|"
                                                    f"{max(a.checksum, b.checksum)}"]  # fmt: skip


def test_equal_content_a_delete_or_one_region_is_no_conflict() -> None:
    a = Head("a", "1-0", 1, "upsert", "c1")
    assert build_conflict("x", a, Head("b", "1-0", 2, "upsert", "c1"), SALT, "varchar") is None
    assert build_conflict("x", a, Head("b", "1-0", 2, "delete", ""), SALT, "varchar") is None
    assert build_conflict("x", a, Head("a", "2-0", 2, "upsert", "c2"), SALT, "varchar") is None


def test_remapped_ids_fit_the_key_type_and_do_not_look_generated() -> None:
    assert int(remap_id("12", "eu", SALT, "int64")) < 0
    assert remap_id("doc", "eu", SALT, "varchar").startswith("r.")
    assert remap_id("doc", "eu", SALT, "varchar") != remap_id("doc", "us", SALT, "varchar")
    assert remap_id("doc", "eu", SALT, "varchar") != remap_id("doc", "eu", "t", "varchar")
