"""Globally unique, sortable, region-aware vector ids (design notes §3.1).

An id is a positive 63-bit integer (it fits Milvus' INT64 keys), laid out high to low:

    bit 63      62 ........ 22   21 .. 16   15 .. 10   9 ...... 0
    [ 0 sign ] [ time ms (41) ] [region 6] [ node 6 ] [ seq 10 ]

- time: milliseconds since `EPOCH_MS` (2024-01-01T00:00:00Z); 41 bits last until 2093;
- region: the region's code, 0-63 (settings `region_code`, the same in every process of a region);
- node: the writing process' code within its region, 0-63 (settings `node_id`; two live writers of
  one region must not share it);
- seq: a per-millisecond counter, 0-1023; the 1025th id of one millisecond waits for the next one.

Ids of one generator strictly increase; ids of different generators sort by time first. For
VARCHAR keys the same number is spelled as 19 zero-padded decimal digits (`format_vector_id`), so
string order is numeric order. A clock that goes backwards is waited out up to
`max_backwards_ms`, then refused (ClockSkewError): ids must never repeat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from redline.platform.index.errors import VectorIndexError

EPOCH_MS = 1_704_067_200_000
"""2024-01-01T00:00:00Z in Unix milliseconds: time 0 of an id."""
TIME_BITS, REGION_BITS, NODE_BITS, SEQUENCE_BITS = 41, 6, 6, 10
MAX_TIME = (1 << TIME_BITS) - 1
MAX_REGION = (1 << REGION_BITS) - 1
MAX_NODE = (1 << NODE_BITS) - 1
MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1
NODE_SHIFT = SEQUENCE_BITS
REGION_SHIFT = SEQUENCE_BITS + NODE_BITS
TIME_SHIFT = SEQUENCE_BITS + NODE_BITS + REGION_BITS
ID_DIGITS = 19
"""Decimal digits of the string form (2**63 - 1 has 19)."""


class VectorIdError(VectorIndexError):
    """An id, or a part of one, is out of the layout's range."""


class ClockSkewError(VectorIdError):
    """The clock went backwards further than the generator is willing to wait."""


@dataclass(frozen=True)
class VectorIdParts:
    """The decoded parts of an id."""

    ts_ms: int
    """Unix milliseconds."""
    region: int
    node: int
    sequence: int


def check_code(value: int, limit: int, what: str) -> int:
    """`value` if 0 <= value <= limit; VectorIdError naming `what` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise VectorIdError(f"{what} must be an integer in 0..{limit}, got {value!r}")
    return value


def compose_vector_id(ts_ms: int, region: int, node: int, sequence: int) -> int:
    """The id of (Unix ms, region code, node code, sequence); VectorIdError when out of range."""
    offset = ts_ms - EPOCH_MS
    if not 0 <= offset <= MAX_TIME:
        raise VectorIdError(f"time {ts_ms} ms is outside the id's range (from {EPOCH_MS})")
    check_code(region, MAX_REGION, "region code")
    check_code(node, MAX_NODE, "node id")
    check_code(sequence, MAX_SEQUENCE, "sequence")
    return (offset << TIME_SHIFT) | (region << REGION_SHIFT) | (node << NODE_SHIFT) | sequence


def decode_vector_id(value: int | str) -> VectorIdParts:
    """The parts of an id (an int, or its decimal string form); VectorIdError otherwise."""
    if isinstance(value, str):
        if not value.isdigit():
            raise VectorIdError(f"not a vector id: {value!r}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise VectorIdError(f"not a vector id: {value!r}")
    return VectorIdParts(
        ts_ms=(value >> TIME_SHIFT) + EPOCH_MS,
        region=(value >> REGION_SHIFT) & MAX_REGION,
        node=(value >> NODE_SHIFT) & MAX_NODE,
        sequence=value & MAX_SEQUENCE,
    )


def format_vector_id(value: int) -> str:
    """The fixed-width string form (19 digits, zero-padded): sorts like the number."""
    return f"{value:0{ID_DIGITS}d}"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class VectorIdGenerator:
    """Ids of one writer (region code, node id); thread-safe. `clock` returns Unix ms and
    `sleep` waits (both injectable, for tests of skew and overflow)."""

    def __init__(
        self,
        region: int,
        node: int,
        clock: Callable[[], int] = _now_ms,
        sleep: Callable[[float], None] = time.sleep,
        max_backwards_ms: int = 1000,
    ) -> None:
        self.region = check_code(region, MAX_REGION, "region code")
        self.node = check_code(node, MAX_NODE, "node id")
        self.clock = clock
        self.sleep = sleep
        self.max_backwards_ms = max_backwards_ms
        self._last_ms = -1
        self._sequence = 0
        self._lock = threading.Lock()

    def next_id(self) -> int:
        """The next id: larger than every id this generator returned before."""
        with self._lock:
            now = self._wait_not_before(self._last_ms)
            if now == self._last_ms:
                self._sequence += 1
                if self._sequence > MAX_SEQUENCE:
                    # this millisecond is used up: the next id belongs to the next one
                    now = self._wait_not_before(self._last_ms + 1)
                    self._sequence = 0
            else:
                self._sequence = 0
            self._last_ms = now
            return compose_vector_id(now, self.region, self.node, self._sequence)

    def next_str(self) -> str:
        """The next id in its fixed-width string form."""
        return format_vector_id(self.next_id())

    def _wait_not_before(self, floor: int) -> int:
        """The clock once it reads at least `floor`; ClockSkewError when it is behind by more
        than `max_backwards_ms` (waiting that long would stall every writer)."""
        now = self.clock()
        if floor - now > self.max_backwards_ms:
            raise ClockSkewError(
                f"clock went back {floor - now} ms (more than {self.max_backwards_ms} ms): "
                "refusing to generate ids that could repeat; fix the clock (NTP) and retry"
            )
        waited = 0.0
        # a clock that does not move at all must not hang the writer either
        budget = self.max_backwards_ms / 1000.0 + 1.0
        while now < floor:
            pause = min(0.001 * (floor - now), 0.05)
            if waited + pause > budget:
                raise ClockSkewError(
                    f"clock stayed {floor - now} ms behind for {waited:.3f} s: not generating ids"
                )
            self.sleep(pause)
            waited += pause
            now = self.clock()
            if floor - now > self.max_backwards_ms:
                raise ClockSkewError(
                    f"clock went back {floor - now} ms while waiting for it to catch up"
                )
        return now
