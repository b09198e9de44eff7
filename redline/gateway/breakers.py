"""Per-region circuit breakers: closed -> open -> half-open -> closed.

Pure logic over an injected clock (no I/O, no asyncio), so the state machine is tested with a
fake clock and costs the proxy a few microseconds per attempt.

A region's breaker is **closed** while its upstream behaves. Every attempt at it is recorded
(outcome and latency) in a sliding window of `window` seconds cut into `SLOTS` slots: each slot
holds a count, an error count and a sparse exponential histogram of latencies, and running
window totals are kept beside them, so a record is O(1) (one slot add, one total add) and an
expired slot is subtracted once when the clock passes it. The breaker **opens** when, with at
least `min_requests` attempts in the window, the error share exceeds `error_rate` or the
window's P99 exceeds `p99_seconds`.

The P99 comes from the histogram, never from sorting samples: latencies fall in base-2 buckets
of scale `SCALE` (gamma = 2^(2^-SCALE), the OpenTelemetry exponential histogram's layout), and a
bucket (gamma^(i-1), gamma^i] answers 2 gamma^i / (gamma + 1), DDSketch's estimate, whose
relative error is at most `RELATIVE_ERROR` = (gamma - 1) / (gamma + 1) (about 2.2 % at scale 4)
for every latency of at least `MIN_LATENCY`. The quantile is only computed when the running count
of attempts slower than `p99_seconds` makes a P99 over it possible, so the hot path scans nothing.

While **open** a region is skipped (placed last in the order and not attempted unless it is the
only region left: trying a failing region is better than failing the request outright). After
`open_for` seconds the next request that reaches it turns it **half-open**: at most
`half_open_probes` attempts are let through; when that many succeed it closes (with an empty
window), one failure opens it again. Probes whose outcome never comes back (a client that went
away) are re-issued after another `open_for`, so a half-open breaker cannot wedge.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from redline.slo.spec import Breakers, parse_duration

BreakerState = Literal["closed", "open", "half_open"]
STATES: tuple[BreakerState, ...] = ("closed", "open", "half_open")
"""Every state, in the order the state gauge exposes them."""

SLOTS = 60
"""Slots of the sliding window (1 s each for the default 60 s window)."""
SCALE = 4
"""Scale of the exponential histogram: 2^SCALE buckets per doubling."""
GAMMA = 2.0 ** (2.0**-SCALE)
RELATIVE_ERROR = (GAMMA - 1) / (GAMMA + 1)
"""Bound of the sketch's relative error on any quantile of latencies >= MIN_LATENCY."""
MIN_LATENCY = 1e-6
"""Latencies below this share the lowest bucket (a microsecond is far below any upstream's)."""
QUANTILE = 0.99

_INDEX_FACTOR = 2.0**SCALE
_MIN_INDEX = math.ceil(math.log2(MIN_LATENCY) * _INDEX_FACTOR)


def bucket_index(seconds: float) -> int:
    """The histogram bucket of a latency: the i with gamma^(i-1) < seconds <= gamma^i."""
    if seconds <= MIN_LATENCY:
        return _MIN_INDEX
    return math.ceil(math.log2(seconds) * _INDEX_FACTOR)


def bucket_value(index: int) -> float:
    """The estimate a bucket answers: 2 gamma^i / (gamma + 1), within RELATIVE_ERROR of any
    latency in it."""
    return float(2.0 * GAMMA**index / (GAMMA + 1.0))


def histogram_quantile(counts: Mapping[int, int], total: int, q: float) -> float | None:
    """The q-quantile of a bucketed histogram (the value of rank floor(q (total - 1)) in sorted
    order, as `exact_quantile` defines it); None when it is empty."""
    if total <= 0:
        return None
    rank = math.floor(q * (total - 1))
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen > rank:
            return bucket_value(index)
    return bucket_value(max(counts))  # unreachable while counts sum to total


def exact_quantile(values: Iterable[float], q: float) -> float:
    """The q-quantile of the values themselves (rank floor(q (n - 1))), for tests and benches."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


class LatencySketch:
    """A mergeable exponential histogram of latencies (sparse: bucket index -> count)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0

    def add(self, seconds: float) -> None:
        """Count one latency."""
        index = bucket_index(seconds)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.total += 1

    def quantile(self, q: float) -> float | None:
        """The q-quantile, within RELATIVE_ERROR of the exact one; None when empty."""
        return histogram_quantile(self.counts, self.total, q)


@dataclass(frozen=True)
class BreakerConfig:
    """A breaker's thresholds in seconds (from the spec's `breakers` section)."""

    error_rate: float = 0.15
    window_seconds: float = 60.0
    p99_seconds: float = 3.0
    min_requests: int = 20
    open_for_seconds: float = 30.0
    half_open_probes: int = 3

    @classmethod
    def from_spec(cls, breakers: Breakers) -> BreakerConfig:
        """The thresholds of a spec's `breakers` section."""
        return cls(
            error_rate=breakers.error_rate,
            window_seconds=parse_duration(breakers.window),
            p99_seconds=breakers.p99_seconds,
            min_requests=breakers.min_requests,
            open_for_seconds=parse_duration(breakers.open_for),
            half_open_probes=breakers.half_open_probes,
        )


@dataclass(frozen=True)
class Transition:
    """One change of a breaker's state, and why."""

    region: str
    before: BreakerState
    after: BreakerState
    reason: str
    at: float

    def attributes(self) -> dict[str, str]:
        """The transition as span-event / log attributes."""
        return {
            "breaker.region": self.region,
            "breaker.from": self.before,
            "breaker.to": self.after,
            "breaker.reason": self.reason,
        }


class _Slot:
    __slots__ = ("errors", "hist", "slow", "total")

    def __init__(self) -> None:
        self.total = 0
        self.errors = 0
        self.slow = 0
        self.hist: dict[int, int] = {}


class SlidingWindow:
    """Attempts, errors and a latency histogram over the last `window` seconds, in `SLOTS`
    slots with running totals (O(1) per record, one subtraction per expired slot)."""

    def __init__(self, window_seconds: float, slow_seconds: float, slots: int = SLOTS) -> None:
        self.width = window_seconds / slots
        self.slots = [_Slot() for _ in range(slots)]
        self.slow_index = bucket_index(slow_seconds)
        self.epoch = -1
        self.total = 0
        self.errors = 0
        self.slow = 0
        """Attempts whose bucket lies above the one holding `slow_seconds`."""
        self.hist: dict[int, int] = {}

    def reset(self) -> None:
        """Forget every attempt."""
        for slot in self.slots:
            slot.total, slot.errors, slot.slow = 0, 0, 0
            slot.hist = {}
        self.total = self.errors = self.slow = 0
        self.hist = {}

    def advance(self, now: float) -> None:
        """Expire the slots older than the window at `now`."""
        epoch = int(now // self.width)
        if epoch == self.epoch:
            return
        count = len(self.slots)
        if epoch - self.epoch >= count:
            self.reset()
        else:
            for passed in range(self.epoch + 1, epoch + 1):
                self._expire(self.slots[passed % count])
        self.epoch = epoch

    def _expire(self, slot: _Slot) -> None:
        if slot.total:
            self.total -= slot.total
            self.errors -= slot.errors
            self.slow -= slot.slow
            hist = self.hist
            for index, n in slot.hist.items():
                left = hist[index] - n
                if left:
                    hist[index] = left
                else:
                    del hist[index]
            slot.total = slot.errors = slot.slow = 0
            slot.hist = {}

    def record(self, ok: bool, seconds: float, now: float) -> None:
        """Count one attempt at `now`."""
        self.advance(now)
        slot = self.slots[self.epoch % len(self.slots)]
        index = bucket_index(seconds)
        slot.total += 1
        self.total += 1
        if not ok:
            slot.errors += 1
            self.errors += 1
        if index > self.slow_index:
            slot.slow += 1
            self.slow += 1
        slot.hist[index] = slot.hist.get(index, 0) + 1
        self.hist[index] = self.hist.get(index, 0) + 1

    def quantile(self, q: float) -> float | None:
        """The window's q-quantile of latencies (None when empty)."""
        return histogram_quantile(self.hist, self.total, q)


class Breaker:
    """One region's breaker (see the module docstring for the states)."""

    def __init__(self, region: str, config: BreakerConfig) -> None:
        self.region = region
        self.config = config
        self.state: BreakerState = "closed"
        self.window = SlidingWindow(config.window_seconds, config.p99_seconds)
        self.opened_at = 0.0
        self.probes_issued = 0
        self.probes_passed = 0
        self.probes_since = 0.0
        self.last_reason = ""

    def _move(self, to: BreakerState, reason: str, now: float) -> Transition:
        before, self.state, self.last_reason = self.state, to, reason
        if to == "open":
            self.opened_at = now
        elif to == "half_open":
            self.probes_issued = self.probes_passed = 0
            self.probes_since = now
        else:
            self.window.reset()
        return Transition(self.region, before, to, reason, now)

    def blocked(self, now: float) -> bool:
        """Whether a request arriving at `now` would skip the region (read only)."""
        if self.state == "closed":
            return False
        if self.state == "open":
            return now < self.opened_at + self.config.open_for_seconds
        return not self._probe_free(now)

    def _probe_free(self, now: float) -> bool:
        if now >= self.probes_since + self.config.open_for_seconds:
            # Probes that never reported (their clients went away) are issued again.
            self.probes_issued = self.probes_passed
            self.probes_since = now
        return self.probes_issued < self.config.half_open_probes

    def admit(self, now: float) -> tuple[bool, Transition | None]:
        """Whether an attempt at `now` may go to the region (a half-open probe takes a permit),
        and the transition to half-open it caused, if any."""
        if self.state == "closed":
            return True, None
        moved = None
        if self.state == "open":
            if now < self.opened_at + self.config.open_for_seconds:
                return False, None
            moved = self._move("half_open", f"open for {self.config.open_for_seconds:g} s", now)
        if not self._probe_free(now):
            return False, moved
        self.probes_issued += 1
        return True, moved

    def close(self, reason: str, now: float) -> Transition | None:
        """Close the breaker at once (the region was proven healthy another way); the
        transition, or None when it was closed already."""
        return None if self.state == "closed" else self._move("closed", reason, now)

    def record(self, ok: bool, seconds: float, now: float) -> Transition | None:
        """Count one attempt's outcome and latency; the transition it caused, if any."""
        state = self.state
        if state == "closed":
            window = self.window
            window.record(ok, seconds, now)
            config = self.config
            if window.total < config.min_requests:
                return None
            if window.errors > config.error_rate * window.total:
                share = window.errors / window.total
                reason = (
                    f"error rate {window.errors}/{window.total} = {share:.2%} > "
                    f"{config.error_rate * 100:g}%"
                )
                return self._move("open", reason, now)
            if window.slow > (1.0 - QUANTILE) * window.total:
                p99 = window.quantile(QUANTILE)
                if p99 is not None and p99 > config.p99_seconds:
                    reason = f"p99 {p99:.3f} s > {config.p99_seconds:g} s"
                    return self._move("open", reason, now)
            return None
        if state == "half_open":
            if not ok:
                return self._move("open", "a half-open probe failed", now)
            self.probes_passed += 1
            if self.probes_passed >= self.config.half_open_probes:
                return self._move("closed", f"{self.probes_passed} probes succeeded", now)
        # Open: a forced attempt (the only region left) changes nothing.
        return None


TransitionHook = Callable[[Transition], None]


class BreakerBoard:
    """The breakers of every region, one clock, and a hook called on every transition."""

    def __init__(
        self,
        regions: Iterable[str],
        config: BreakerConfig,
        on_transition: TransitionHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
        self.on_transition = on_transition
        self.breakers = {region: Breaker(region, config) for region in regions}

    def _emit(self, transition: Transition | None) -> None:
        if transition is not None and self.on_transition is not None:
            self.on_transition(transition)

    def blocked(self, now: float | None = None) -> frozenset[str]:
        """The regions a request arriving now would skip."""
        at = self.clock() if now is None else now
        return frozenset(r for r, b in self.breakers.items() if b.blocked(at))

    def order(self, order: list[str]) -> list[str]:
        """`order` with the blocked regions moved last (their relative order kept)."""
        now = self.clock()
        breakers = self.breakers
        if all(breakers[r].state == "closed" for r in order):
            return order  # the common case: nothing to move, nothing allocated
        blocked = [r for r in order if breakers[r].blocked(now)]
        if not blocked:
            return order
        return [r for r in order if r not in blocked] + blocked

    def admit(self, region: str) -> bool:
        """Whether an attempt may go to `region` now (see `Breaker.admit`)."""
        admitted, transition = self.breakers[region].admit(self.clock())
        self._emit(transition)
        return admitted

    def record(self, region: str, ok: bool, seconds: float) -> None:
        """Count one attempt at `region`."""
        self._emit(self.breakers[region].record(ok, seconds, self.clock()))

    def close(self, region: str, reason: str) -> None:
        """Close `region`'s breaker now: a spot replacement behind it passed its readiness gate
        and the agent released it, so waiting out `open_for` would only keep traffic away."""
        breaker = self.breakers.get(region)
        if breaker is not None:
            self._emit(breaker.close(reason, self.clock()))

    def states(self) -> dict[str, BreakerState]:
        """Region -> current state."""
        return {region: breaker.state for region, breaker in self.breakers.items()}


__all__ = [
    "GAMMA",
    "MIN_LATENCY",
    "RELATIVE_ERROR",
    "SCALE",
    "SLOTS",
    "STATES",
    "Breaker",
    "BreakerBoard",
    "BreakerConfig",
    "BreakerState",
    "LatencySketch",
    "SlidingWindow",
    "Transition",
    "bucket_index",
    "bucket_value",
    "exact_quantile",
    "histogram_quantile",
]
