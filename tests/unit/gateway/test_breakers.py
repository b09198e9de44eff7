"""The circuit breakers' state machine (clock injected), the sliding window and the latency
sketch's error against exact quantiles."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redline.gateway.breakers import (
    RELATIVE_ERROR,
    BreakerBoard,
    BreakerConfig,
    LatencySketch,
    SlidingWindow,
    Transition,
    bucket_index,
    bucket_value,
    exact_quantile,
)
from redline.gateway.settings import BreakerOverrides, GatewayConfigError
from redline.slo.spec import Breakers

CONFIG = BreakerConfig(
    error_rate=0.15,
    window_seconds=60.0,
    p99_seconds=3.0,
    min_requests=20,
    open_for_seconds=30.0,
    half_open_probes=3,
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def board(config: BreakerConfig = CONFIG) -> tuple[BreakerBoard, Clock, list[Transition]]:
    clock = Clock()
    moves: list[Transition] = []
    return BreakerBoard(["primary", "secondary"], config, moves.append, clock), clock, moves


def feed(b: BreakerBoard, clock: Clock, n: int, error_every: int = 0, latency: float = 0.1,
         step: float = 0.1) -> None:  # fmt: skip
    for i in range(n):
        ok = not (error_every and i % error_every == 0)
        b.record("primary", ok, latency)
        clock.now += step


def test_error_rate_over_the_threshold_opens_and_the_region_goes_last() -> None:
    b, clock, moves = board()
    feed(b, clock, 100, error_every=10)  # 10 %: stays closed
    assert b.states()["primary"] == "closed" and not moves
    feed(b, clock, 40, error_every=3)  # the window's share climbs over 15 %
    assert b.states()["primary"] == "open"
    assert [(m.before, m.after) for m in moves] == [("closed", "open")]
    assert "error rate" in moves[0].reason
    assert b.order(["primary", "secondary"]) == ["secondary", "primary"]
    assert not b.admit("primary")


def test_min_requests_guards_a_small_window() -> None:
    b, clock, _ = board()
    feed(b, clock, 19, error_every=1)  # every one failed, but only 19
    assert b.states()["primary"] == "closed"
    feed(b, clock, 1, error_every=1)
    assert b.states()["primary"] == "open"


def test_errors_leave_the_window_after_it_passes() -> None:
    b, clock, _ = board()
    feed(b, clock, 15, error_every=1)  # 15 errors, too few requests to open
    clock.now += 61.0  # they expire
    feed(b, clock, 30)  # 30 fine requests: 0 % errors in the window
    assert b.states()["primary"] == "closed"
    assert b.breakers["primary"].window.total == 30
    assert b.breakers["primary"].window.errors == 0


def test_p99_over_the_threshold_opens() -> None:
    b, clock, moves = board()
    feed(b, clock, 97, latency=0.2)
    feed(b, clock, 3, latency=5.0)  # 3 % at 5 s: the P99 is 5 s
    assert b.states()["primary"] == "open"
    assert moves[0].reason.startswith("p99 ")


def test_a_p99_under_the_threshold_stays_closed() -> None:
    b, clock, _ = board()
    feed(b, clock, 995, latency=0.2, step=0.01)
    feed(b, clock, 5, latency=5.0, step=0.01)  # 0.5 % slow: P99 stays at 0.2 s
    assert b.states()["primary"] == "closed"
    p99 = b.breakers["primary"].window.quantile(0.99)
    assert p99 is not None and abs(p99 - 0.2) <= 0.2 * RELATIVE_ERROR


def open_primary(b: BreakerBoard, clock: Clock) -> None:
    feed(b, clock, 20, error_every=1)
    assert b.states()["primary"] == "open"


def test_half_open_lets_the_probes_through_then_closes() -> None:
    b, clock, moves = board()
    open_primary(b, clock)
    clock.now += 29.8  # it opened at the 20th record, 0.1 s ago
    assert not b.admit("primary")
    clock.now += 0.15
    assert b.order(["primary", "secondary"]) == ["primary", "secondary"]
    assert [b.admit("primary") for _ in range(4)] == [True, True, True, False]
    assert b.states()["primary"] == "half_open"
    assert b.order(["primary", "secondary"]) == ["secondary", "primary"]  # permits used up
    for _ in range(3):
        b.record("primary", True, 0.1)
    assert b.states()["primary"] == "closed"
    assert [(m.before, m.after) for m in moves] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    assert b.breakers["primary"].window.total == 0  # the old errors do not reopen it
    feed(b, clock, 19, error_every=1)
    assert b.states()["primary"] == "closed"


def test_one_failed_probe_opens_again() -> None:
    b, clock, moves = board()
    open_primary(b, clock)
    clock.now += 30.0
    assert b.admit("primary") and b.admit("primary")
    b.record("primary", True, 0.1)
    b.record("primary", False, 0.1)
    assert b.states()["primary"] == "open"
    assert moves[-1].reason == "a half-open probe failed"
    clock.now += 29.0
    assert not b.admit("primary")  # a whole open_for again
    clock.now += 1.0
    assert b.admit("primary")


def test_probes_that_never_report_are_issued_again() -> None:
    b, clock, _ = board()
    open_primary(b, clock)
    clock.now += 30.0
    assert all(b.admit("primary") for _ in range(3))
    assert not b.admit("primary")
    clock.now += 30.0  # the three clients went away without an outcome
    assert b.admit("primary")


def test_an_open_region_ignores_forced_attempts() -> None:
    b, clock, moves = board()
    open_primary(b, clock)
    b.record("primary", True, 0.1)  # tried as the last region left
    b.record("primary", False, 0.1)
    assert b.states()["primary"] == "open" and len(moves) == 1


def test_regions_are_independent() -> None:
    b, clock, _ = board()
    open_primary(b, clock)
    assert b.states()["secondary"] == "closed"
    assert b.admit("secondary")
    assert b.blocked() == frozenset({"primary"})


def test_config_from_the_spec() -> None:
    config = BreakerConfig.from_spec(Breakers(window="10s", open_for="5s"))
    assert config.window_seconds == 10.0 and config.open_for_seconds == 5.0
    assert config.error_rate == 0.15 and config.half_open_probes == 3


def test_window_slots_expire_one_by_one() -> None:
    window = SlidingWindow(10.0, 3.0, slots=10)
    for second in range(10):
        window.record(second % 2 == 0, 0.1, 100.0 + second)
    assert (window.total, window.errors) == (10, 5)
    window.advance(110.0)  # the slot of 100 s leaves
    assert (window.total, window.errors) == (9, 5)
    window.advance(114.5)
    assert (window.total, window.errors) == (5, 3)
    window.advance(200.0)
    assert (window.total, window.errors, window.hist) == (0, 0, {})


# --- the sketch ------------------------------------------------------------------------------

QUANTILES = (0.5, 0.9, 0.99, 0.999)


def assert_within_bound(values: list[float]) -> None:
    sketch = LatencySketch()
    for value in values:
        sketch.add(value)
    for q in QUANTILES:
        exact = exact_quantile(values, q)
        estimate = sketch.quantile(q)
        assert estimate is not None
        assert abs(estimate - exact) <= RELATIVE_ERROR * exact * (1 + 1e-9), (q, exact, estimate)


def test_the_stated_bound() -> None:
    # 2^(1/16): about 2.2 % relative error, the bound the docs state.
    assert 0.021 < RELATIVE_ERROR < 0.022


@given(st.lists(st.floats(min_value=1e-4, max_value=1e3, allow_nan=False), min_size=1,
                max_size=500))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_quantiles_within_the_relative_error_on_any_sample(values: list[float]) -> None:
    assert_within_bound(values)


@given(st.floats(min_value=1e-5, max_value=1e4, allow_nan=False))
def test_every_latency_lies_within_the_bound_of_its_bucket(value: float) -> None:
    estimate = bucket_value(bucket_index(value))
    assert abs(estimate - value) <= RELATIVE_ERROR * value * (1 + 1e-9)


@pytest.mark.parametrize(
    "draw",
    [
        lambda rng: rng.lognormvariate(math.log(0.3), 0.8),  # a typical latency shape
        lambda rng: rng.expovariate(1 / 0.5),
        lambda rng: rng.uniform(0.05, 4.0),
        lambda rng: 0.05 * rng.paretovariate(1.5),  # a heavy tail
        lambda rng: rng.choice((0.1, 0.12, 2.5, 9.0)),  # a few modes
    ],
    ids=["lognormal", "exponential", "uniform", "pareto", "modes"],
)
def test_quantiles_within_the_relative_error_on_distributions(draw: object) -> None:
    rng = random.Random(7)
    values = [draw(rng) for _ in range(20_000)]  # type: ignore[operator]
    assert_within_bound(values)


def test_the_window_p99_matches_the_sketch() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(0, 1) for _ in range(5000)]
    window = SlidingWindow(60.0, 3.0)
    for i, value in enumerate(values):
        window.record(True, value, 100.0 + i * 0.01)  # all within 50 s
    p99 = window.quantile(0.99)
    exact = exact_quantile(values, 0.99)
    assert p99 is not None and abs(p99 - exact) <= RELATIVE_ERROR * exact * (1 + 1e-9)


# --- the gateway's overrides ------------------------------------------------------------------


def test_gateway_overrides_apply_over_the_spec() -> None:
    spec = Breakers()
    assert BreakerOverrides().apply(spec) is spec
    changed = BreakerOverrides(enabled=False, window="5s").apply(spec)
    assert changed.enabled is False and changed.window == "5s" and changed.open_for == "30s"


def test_gateway_overrides_are_validated_like_the_spec() -> None:
    with pytest.raises(GatewayConfigError, match=r"breakers\.error_rate"):
        BreakerOverrides(error_rate=1.5).apply(Breakers())
    with pytest.raises(GatewayConfigError, match=r"breakers\.window"):
        BreakerOverrides(window="500ms").apply(Breakers())


def test_a_released_spot_replacement_closes_its_breaker_at_once() -> None:
    b, clock, moves = board()
    feed(b, clock, 40, error_every=2)  # the node died: connection errors open the breaker
    assert b.states()["primary"] == "open" and not b.admit("primary")
    b.close("primary", "released after a spot replacement's readiness gate")
    assert b.states()["primary"] == "closed" and b.admit("primary")
    assert [(m.before, m.after) for m in moves] == [("closed", "open"), ("open", "closed")]
    assert "readiness gate" in moves[-1].reason
    b.close("primary", "again")  # closed already: no transition
    b.close("nowhere", "unknown region: ignored")
    assert len(moves) == 2
    assert b.order(["primary", "secondary"]) == ["primary", "secondary"]
