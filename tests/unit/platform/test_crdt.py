"""The session CRDT: merge laws, deltas, convergence of any interleaving, serialisation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redline.platform import crdt
from redline.platform.crdt import EMPTY, Kind, SessionState

REGIONS = ("eu", "us", "ap")
ELEMENTS = [crdt.element(Kind.MESSAGE, f"m{i}") for i in range(4)] + [
    crdt.element(Kind.VARIABLE, name) for name in ("lang", "topic")
]

# One step of a history: a local op in a region (element index, add?, value) or a merge of one
# region's state into another's. Histories, not arbitrary states: stamps stay unique, as they are.
local_step = st.tuples(
    st.just("op"),
    st.sampled_from(REGIONS),
    st.integers(0, len(ELEMENTS) - 1),
    st.booleans(),
    st.text("abc", max_size=3),
)
merge_step = st.tuples(st.just("merge"), st.sampled_from(REGIONS), st.sampled_from(REGIONS))
histories: st.SearchStrategy[list[tuple[object, ...]]] = st.lists(
    st.one_of(local_step, merge_step), max_size=40
)


def run_history(steps: list[tuple[object, ...]]) -> tuple[dict[str, SessionState], list[crdt.Op]]:
    """Replay a history; return each region's state and every op made."""
    states = dict.fromkeys(REGIONS, EMPTY)
    ops: list[crdt.Op] = []
    for n, step in enumerate(steps):
        if step[0] == "op":
            _, region, index, is_add, value = step
            assert isinstance(region, str) and isinstance(index, int)
            states[region], op = crdt.local_op(
                states[region], region, f"op{n}", ELEMENTS[index], str(value) if is_add else None
            )
            ops.append(op)
        else:
            _, src, dst = step
            assert isinstance(src, str) and isinstance(dst, str)
            states[dst] = crdt.merge(states[dst], states[src])
    return states, ops


@st.composite
def reachable_states(draw: st.DrawFn) -> list[SessionState]:
    """Three states reachable from one history (they share its unique stamps)."""
    states, _ = run_history(draw(histories))
    return [states[r] for r in REGIONS]


@given(reachable_states())
def test_merge_is_idempotent_commutative_associative(states: list[SessionState]) -> None:
    a, b, c = states
    assert crdt.merge(a, a) == a
    assert crdt.merge(a, b) == crdt.merge(b, a)
    assert crdt.merge(crdt.merge(a, b), c) == crdt.merge(a, crdt.merge(b, c))
    assert crdt.merge(a, EMPTY) == a


@given(reachable_states())
def test_delta_since_the_receivers_vector_equals_the_full_merge(states: list[SessionState]) -> None:
    for sender in states:
        for receiver in states:
            delta = crdt.delta_since(sender, receiver.vv)
            assert crdt.merge(receiver, delta) == crdt.merge(receiver, sender)


@given(histories, st.randoms(use_true_random=False))
@settings(max_examples=200)
def test_any_interleaving_of_the_ops_converges(
    steps: list[tuple[object, ...]], rng: random.Random
) -> None:
    _, ops = run_history(steps)
    in_order = EMPTY
    for op in ops:
        in_order = crdt.apply(in_order, op)
    shuffled = list(ops)
    rng.shuffle(shuffled)
    replayed = EMPTY
    for op in shuffled + shuffled[: len(shuffled) // 2]:  # and some delivered twice
        replayed = crdt.apply(replayed, op)
    assert replayed == in_order
    assert crdt.digest(replayed) == crdt.digest(in_order)


@given(histories)
def test_regions_that_exchange_states_converge_and_keep_every_last_write(
    steps: list[tuple[object, ...]],
) -> None:
    states, ops = run_history(steps)
    final = crdt.merge_all(states.values())
    synced = {r: crdt.merge(states[r], crdt.delta_since(final, states[r].vv)) for r in REGIONS}
    assert len({crdt.dumps(s) for s in synced.values()}) == 1
    # Last writer wins per element: the present set is what the newest op on each element says.
    newest: dict[str, crdt.Op] = {}
    for op in ops:
        if op.element not in newest or op.stamp > newest[op.element].stamp:
            newest[op.element] = op
    expected_present = {e for e, op in newest.items() if op.is_add}
    assert {e for e in ELEMENTS if crdt.present(final, e)} == expected_present


@given(reachable_states())
def test_serialisations_round_trip(states: list[SessionState]) -> None:
    for state in states:
        assert crdt.loads(crdt.dumps(state)) == state
        assert crdt.from_fields(crdt.to_fields(state)) == state


def test_stamps_order_by_lamport_then_region_then_op() -> None:
    assert crdt.Stamp(2, "a", "x") > crdt.Stamp(1, "z", "z")
    assert crdt.Stamp(1, "b", "a") > crdt.Stamp(1, "a", "z")
    assert crdt.Stamp(1, "a", "b") > crdt.Stamp(1, "a", "a")
    assert crdt.Stamp.decode("12|eu|op-1|hello|world") == crdt.Stamp(12, "eu", "op-1")


def test_a_concurrent_remove_and_add_resolve_by_stamp_and_messages_keep_one_order() -> None:
    eu, _ = crdt.local_op(EMPTY, "eu", "e1", crdt.element(Kind.MESSAGE, "hello"), "hi")
    us = crdt.merge(EMPTY, eu)
    eu, _ = crdt.local_op(eu, "eu", "e2", crdt.element(Kind.MESSAGE, "hello"), None)  # (2,eu)
    us, _ = crdt.local_op(us, "us", "u1", crdt.element(Kind.MESSAGE, "hello"), "hi!")  # (2,us)
    us, _ = crdt.local_op(us, "us", "u2", crdt.element(Kind.VARIABLE, "lang"), "fr")
    both = crdt.merge(eu, us)
    assert both == crdt.merge(us, eu)
    assert crdt.messages(both) == [("hello", "hi!")]  # (2,us) > (2,eu): the re-add wins
    assert crdt.variables(both) == {"lang": "fr"}


def test_digest_ignores_vectors_and_clock_but_not_content() -> None:
    state, _ = crdt.local_op(EMPTY, "eu", "e1", crdt.element(Kind.MESSAGE, "m"), "x")
    other = SessionState(state.adds, state.removes, state.clock + 5, {"eu": 9})
    assert crdt.digest(state) == crdt.digest(other)
    changed, _ = crdt.local_op(state, "eu", "e2", crdt.element(Kind.MESSAGE, "m"), None)
    assert crdt.digest(changed) != crdt.digest(state)
    assert crdt.digest(EMPTY) == "da39a3ee5e6b4b0d3255bfef95601890afd80709"  # sha1 of b""


@pytest.mark.parametrize(
    "bad",
    ["", "{x}", "a b", "a|b"],
)
def test_ids_with_hash_tags_spaces_or_bars_are_refused(bad: str) -> None:
    with pytest.raises(crdt.CrdtError):
        crdt.element(Kind.MESSAGE, bad)


def test_malformed_serialisations_are_refused() -> None:
    with pytest.raises(crdt.CrdtError):
        crdt.loads('{"a": 1}')
    with pytest.raises(crdt.CrdtError):
        crdt.from_fields({"a:m:x": "nope"})
    with pytest.raises(crdt.CrdtError):
        crdt.local_op(EMPTY, "e|u", "op", "m:x", "v")
