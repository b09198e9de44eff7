"""The vector id layout: monotonic and sortable ids, decoding, sequence overflow and a clock
that goes backwards (an injected clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redline.platform.index import (
    ClockSkewError,
    VectorIdError,
    VectorIdGenerator,
    compose_vector_id,
    decode_vector_id,
    format_vector_id,
)
from redline.platform.index.ids import EPOCH_MS, MAX_NODE, MAX_REGION, MAX_SEQUENCE, MAX_TIME


class FakeClock:
    """Milliseconds that only move when told to (or when the generator sleeps)."""

    def __init__(self, now: int) -> None:
        self.now = now
        self.slept = 0.0

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.now += max(1, round(seconds * 1000))


parts = st.tuples(
    st.integers(EPOCH_MS, EPOCH_MS + MAX_TIME),
    st.integers(0, MAX_REGION),
    st.integers(0, MAX_NODE),
    st.integers(0, MAX_SEQUENCE),
)


@given(parts)
def test_decode_inverts_compose(p: tuple[int, int, int, int]) -> None:
    value = compose_vector_id(*p)
    assert 0 <= value < 2**63  # fits a positive INT64 key
    decoded = decode_vector_id(value)
    assert (decoded.ts_ms, decoded.region, decoded.node, decoded.sequence) == p
    assert decode_vector_id(format_vector_id(value)) == decoded


@given(parts, parts)
def test_ids_sort_by_time_first_and_strings_sort_like_numbers(
    a: tuple[int, int, int, int], b: tuple[int, int, int, int]
) -> None:
    x, y = compose_vector_id(*a), compose_vector_id(*b)
    if a[0] < b[0]:
        assert x < y
    assert (x < y) == (format_vector_id(x) < format_vector_id(y))
    assert len(format_vector_id(x)) == 19


@given(st.lists(st.integers(0, 3), min_size=1, max_size=300))
def test_a_generator_is_strictly_increasing(steps: list[int]) -> None:
    clock = FakeClock(EPOCH_MS + 10_000)
    gen = VectorIdGenerator(5, 7, clock=clock, sleep=clock.sleep)
    ids = []
    for step in steps:
        clock.now += step
        ids.append(gen.next_id())
    assert ids == sorted(set(ids))
    assert {(decode_vector_id(i).region, decode_vector_id(i).node) for i in ids} == {(5, 7)}


def test_sequence_overflow_waits_for_the_next_millisecond() -> None:
    clock = FakeClock(EPOCH_MS + 1)
    gen = VectorIdGenerator(1, 1, clock=clock, sleep=clock.sleep)
    ids = [gen.next_id() for _ in range(MAX_SEQUENCE + 2)]
    last_in_ms, first_next = decode_vector_id(ids[-2]), decode_vector_id(ids[-1])
    assert last_in_ms.sequence == MAX_SEQUENCE and last_in_ms.ts_ms == EPOCH_MS + 1
    assert first_next.sequence == 0 and first_next.ts_ms == EPOCH_MS + 2
    assert clock.slept > 0 and ids == sorted(set(ids))


def test_a_clock_slightly_behind_is_waited_out() -> None:
    clock = FakeClock(EPOCH_MS + 5000)
    gen = VectorIdGenerator(1, 1, clock=clock, sleep=clock.sleep, max_backwards_ms=100)
    first = gen.next_id()
    clock.now -= 50  # NTP stepped the clock back 50 ms
    second = gen.next_id()
    assert second > first and clock.slept > 0
    assert decode_vector_id(second).ts_ms >= decode_vector_id(first).ts_ms


def test_a_clock_far_behind_is_refused() -> None:
    clock = FakeClock(EPOCH_MS + 5000)
    gen = VectorIdGenerator(1, 1, clock=clock, sleep=clock.sleep, max_backwards_ms=100)
    gen.next_id()
    clock.now -= 1000
    with pytest.raises(ClockSkewError, match="went back 1000 ms"):
        gen.next_id()


def test_a_stopped_clock_is_refused_instead_of_hanging() -> None:
    clock = FakeClock(EPOCH_MS + 5000)
    gen = VectorIdGenerator(
        1, 1, clock=clock, sleep=lambda _: None, max_backwards_ms=10
    )  # sleeping does not move this clock
    for _ in range(MAX_SEQUENCE + 1):
        gen.next_id()
    with pytest.raises(ClockSkewError, match="behind"):
        gen.next_id()


@pytest.mark.parametrize(
    ("region", "node"), [(-1, 0), (MAX_REGION + 1, 0), (0, MAX_NODE + 1), (True, 0)]
)
def test_codes_out_of_range_are_refused(region: int, node: int) -> None:
    with pytest.raises(VectorIdError):
        VectorIdGenerator(region, node)


def test_times_outside_the_layout_are_refused() -> None:
    with pytest.raises(VectorIdError, match="outside"):
        compose_vector_id(EPOCH_MS - 1, 0, 0, 0)
    with pytest.raises(VectorIdError):
        decode_vector_id("12a")
