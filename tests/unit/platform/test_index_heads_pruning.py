"""The conflict window and the pruning of settled heads (pure): two writes further apart than the
window are no conflict, and dropping settled heads from one copy and not the other changes no row
of either, whatever is written afterwards and in whatever order the regions' logs arrive."""

from __future__ import annotations

import random as stdlib_random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from redline.platform.index import Entry, build_conflict, build_desired, remap_id, row_checksum
from redline.platform.index.conflicts import (
    Head,
    Heads,
    _format_heads,
    _parse_heads,
    build_row_plan,
    fold_heads,
    prune_settled,
)

SALT = "s"
Rows = dict[str, tuple[str, int, str]]
"""id -> (checksum, ts_ms, region): what a copy holds."""


def _entry(region: str, seq: int, row_id: str, ts_ms: int, content: int, op: str) -> Entry:
    vector = np.full(4, float(content), dtype=np.float32)
    sid = f"{ts_ms}-{seq}"
    if op == "delete":
        return Entry(sid, "delete", row_id, region, ts_ms, "", None)
    return Entry(sid, "upsert", row_id, region, ts_ms, row_checksum(vector), vector)


class _Copy:
    """A copy as `apply_heads` keeps it: heads per id and the rows they call for."""

    def __init__(self, window: int | None) -> None:
        self.window = window
        self.heads: dict[str, Heads] = {}
        self.rows: Rows = {}

    def apply(self, entries: list[Entry]) -> None:
        contents = {e.checksum: (e.vector, b"") for e in entries if e.vector is not None}
        for row in self.rows.values():  # contents the rows hold (read back from Milvus)
            contents.setdefault(row[0], (np.zeros(4, dtype=np.float32), b""))
        for entry in entries:
            if entry.vector is not None:
                contents[entry.checksum] = (entry.vector, b"")
        for entry in entries:
            changed = fold_heads([entry], self.heads)
            plan = build_row_plan(changed, self.heads, contents, SALT, "varchar", self.window)
            for up in plan.upserts:
                self.rows[up.id] = (up.checksum, up.ts_ms, up.region)
            for gone in plan.deletes:
                self.rows.pop(gone, None)
            self.heads.update(changed)

    def prune(self, settled_before_ms: int) -> None:
        for row_id, heads in list(self.heads.items()):
            kept = prune_settled(heads, settled_before_ms, self.window)
            if kept:
                self.heads[row_id] = kept
            else:
                del self.heads[row_id]


REGIONS = ("a", "b", "c")


def _interleave(logs: dict[str, list[Entry]], rng: stdlib_random.Random) -> list[Entry]:
    """The regions' logs merged in a random order, each keeping its own."""
    pending = [list(log) for log in logs.values() if log]
    mixed = []
    while pending:
        source = rng.choice(pending)
        mixed.append(source.pop(0))
        if not source:
            pending.remove(source)
    return mixed


write = st.tuples(
    st.sampled_from(REGIONS), st.integers(0, 3), st.integers(0, 2), st.integers(0, 3),
    st.sampled_from(["upsert", "upsert", "delete"]),
)  # fmt: skip
"""(region, id, content, ts step, op)."""


def _logs(
    spec: list[tuple[str, int, int, int, str]], start: int, seq: int
) -> dict[str, list[Entry]]:
    logs: dict[str, list[Entry]] = {r: [] for r in REGIONS}
    ts = start
    for n, (region, row, content, step, op) in enumerate(spec):
        ts += step
        logs[region].append(_entry(region, seq + n, f"id{row}", ts, content, op))
    return logs


@given(
    st.lists(write, min_size=1, max_size=10),
    st.lists(write, min_size=0, max_size=10),
    st.sampled_from([None, 0, 2, 5, 100]),
    st.integers(0, 2**32),
)
def test_pruning_settled_heads_changes_no_row_now_or_later(  # type: ignore[no-untyped-def]
    before, after, window, seed
) -> None:
    rng = stdlib_random.Random(seed)
    old = _logs(before, 1000, 0)
    settled_before = 1000 + 3 * len(before) + 1  # every old write is settled
    # what is applied after the pruning is at least the window after the settled bound
    new = _logs(after, settled_before + (window or 0), 100)
    pruned, kept = _Copy(window), _Copy(window)
    pruned.apply(_interleave(old, rng))
    rows_before = dict(pruned.rows)
    pruned.prune(settled_before)
    assert pruned.rows == rows_before
    pruned.apply(_interleave(new, rng))
    # the other copy never prunes, and sees both logs in another order
    kept.apply(_interleave({r: old[r] + new[r] for r in REGIONS}, rng))
    assert pruned.rows == kept.rows
    # a copy pruned again at the end holds the same rows and fewer (or as many) heads
    heads = sum(len(h) for h in kept.heads.values())
    kept.prune(settled_before)
    assert sum(len(h) for h in kept.heads.values()) <= heads


def _head(region: str, ts: int, op: str = "upsert", checksum: str = "c1") -> Head:
    return Head(region, f"{ts}-0", ts, op, checksum if op == "upsert" else "")  # type: ignore[arg-type]


def test_writes_further_apart_than_the_window_are_no_conflict() -> None:
    a, b = _head("a", 1000), _head("b", 1005, checksum="c2")
    assert build_conflict("x", a, b, SALT, "varchar") is not None  # no window: any pair
    assert build_conflict("x", a, b, SALT, "varchar", 5) is not None  # at the window: concurrent
    assert build_conflict("x", a, b, SALT, "varchar", 4) is None  # further apart: sequential
    desired = build_desired("x", {"a": a, "b": b}, SALT, "varchar", 4)
    assert desired.winner == b and not desired.remaps
    within = build_desired("x", {"a": a, "b": b}, SALT, "varchar", 5)
    assert within.remaps == {remap_id("x", "a", SALT, "varchar"): a}


def test_what_settles_with_and_without_a_window() -> None:
    deleted = {"a": _head("a", 10, "delete"), "b": _head("b", 12, "delete")}
    assert prune_settled(deleted, 20, None) == {}  # deletes settle even without a window
    # b is not settled yet: only the losing delete of a goes
    assert prune_settled(deleted, 11, None) == {"b": deleted["b"]}
    assert prune_settled(deleted, 10, None) is deleted  # nothing settled: the same heads
    alone = {"a": _head("a", 10)}
    assert prune_settled(alone, 20, None) is alone  # a later upsert of b could conflict with it
    assert prune_settled(alone, 20, 5) == {}  # with a window nothing later can
    # a recent winner keeps its head; a settled losing delete goes, a losing upsert only with a
    # window (and only when it is no conflict)
    mixed = {"a": _head("a", 10, "delete"), "b": _head("b", 30)}
    assert prune_settled(mixed, 20, None) == {"b": mixed["b"]}
    losing = {"a": _head("a", 10, checksum="c9"), "b": _head("b", 30)}
    assert prune_settled(losing, 20, None) is losing
    assert prune_settled(losing, 20, 5) == {"b": losing["b"]}
    assert prune_settled(losing, 20, 50) is losing  # a conflict: its re-mapped row needs it
    conflict = {"a": _head("a", 10, checksum="c9"), "b": _head("b", 12)}
    assert prune_settled(conflict, 20, 5) is conflict  # settled, but a re-mapped row exists


def test_a_delete_that_finds_no_heads_deletes_the_row_left_behind() -> None:
    gone = _entry("a", 0, "x", 5000, 0, "delete")
    changed = fold_heads([gone], {})
    plan = build_row_plan(changed, {}, {}, SALT, "varchar", 5)
    assert plan.deletes == ["x"] and not plan.upserts


def test_an_upsert_another_region_deleted_is_no_conflict_when_that_region_writes_again() -> None:
    """a writes c1 and b deletes the id at the same ts_ms (b wins); b writes c0 a minute later.
    a's c1 is dead: no conflict, whichever batches the copy applied the writes in (it used to be
    re-mapped by a copy that saw everything at once and to stop the others: content gone)."""
    writes = [_entry("a", 0, "x", 1000, 1, "upsert"), _entry("b", 1, "x", 1000, 0, "delete")]
    later = _entry("b", 2, "x", 61_000, 0, "upsert")
    for window in (None, 100):
        apart, together = _Copy(window), _Copy(window)
        apart.apply(writes)
        apart.apply([later])
        together.apply([writes[1], later, writes[0]])  # b's log in its order, a's write last
        assert apart.rows == together.rows == {"x": (later.checksum, 61_000, "b")}
        heads = together.heads["x"]
        assert heads["b"].tombstone_ms == 1000 and heads["b"].supersedes(heads["a"])
        assert build_desired("x", heads, SALT, "varchar", window).conflicts == ()
        assert prune_settled(heads, 70_000, window) == ({} if window else {"b": heads["b"]})


def test_heads_keep_their_tombstone_in_redis_form() -> None:
    """The stored JSON carries a tombstone once the region deleted the id; older records have
    none and read as -1."""
    heads = {"a": Head("a", "1-0", 1, "upsert", "c", 7), "b": _head("b", 2)}
    raw = _format_heads(heads)
    assert _parse_heads(raw) == heads
    assert [h.tombstone_ms for h in _parse_heads(raw).values()] == [7, -1]
    assert _parse_heads('{"a":["1-0",1,"upsert","c"]}')["a"].tombstone_ms == -1
