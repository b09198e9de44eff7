"""A conversation's state as a CRDT: an LWW-element-set of messages and context variables.

Pure (no I/O): `redline.platform.session_sync` keeps the same state in Redis, in the same
field layout (`to_fields`), and its Lua scripts merge exactly as `merge` does here.

- Every operation carries a `Stamp` (lamport, region, op id): the session's Lamport clock plus
  one, then the writing region and a unique op id break ties, so stamps are totally ordered and
  two regions never produce equal ones.
- An element is a message (`m:<message id>`, the id is chosen by the writer and is the same in
  every region) or a context variable (`v:<name>`). Each element keeps its latest add (with the
  value) and its latest remove; it is present when its add is newer than its remove. Adding a
  variable again is how it is set to a new value; removing it unsets it.
- `merge` takes, per element, the newer add and the newer remove, the larger clock and the
  per-region maximum of the version vectors: a join of a semilattice, hence idempotent,
  commutative and associative, with no coordinator.
- The version vector `vv[region]` is the largest Lamport time of that region's operations the
  state has merged. `delta_since(state, vv)` is every add/remove stamped later than what `vv`
  records for its region; merging it into a state whose vector is `vv` gives the full merge
  (each region's stamps grow with its own clock, and a state built from operations and merges
  holds, for every operation its vector covers, something at least as new on that element).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""Regions and op ids: ASCII without `|`, so a stamp's text splits unambiguously and compares
byte for byte the same in Python and in Redis's Lua."""
ID_PATTERN = re.compile(r"^[^\s{}|]{1,200}$")
"""Session ids, message ids and variable names: no whitespace, braces (Redis Cluster hash
tags) or `|`."""

ADD_PREFIX = "a:"
REMOVE_PREFIX = "r:"
VV_PREFIX = "vv:"
CLOCK_FIELD = "clock"


class CrdtError(ValueError):
    """A malformed stamp, element, field or serialised state."""


class Kind(StrEnum):
    """What an element of the set is."""

    MESSAGE = "m"
    VARIABLE = "v"


def check_name(what: str, value: str) -> str:
    """`value` if it is a valid region or op id; CrdtError otherwise."""
    if not NAME_PATTERN.match(value):
        raise CrdtError(f"{what} {value!r}: use 1-64 characters of A-Z a-z 0-9 . _ -")
    return value


def check_id(what: str, value: str) -> str:
    """`value` if it is a valid session id, message id or variable name; CrdtError otherwise."""
    if not ID_PATTERN.match(value):
        raise CrdtError(f"{what} {value!r}: 1-200 characters, no whitespace, braces or '|'")
    return value


def element(kind: Kind, ident: str) -> str:
    """The element key of a message or variable (`m:<id>`, `v:<name>`)."""
    return f"{kind.value}:{check_id('element id', ident)}"


@dataclass(frozen=True, order=True)
class Stamp:
    """A Lamport timestamp made total by the region and the op id."""

    lamport: int
    region: str
    op_id: str

    def encode(self) -> str:
        """`lamport|region|op_id`."""
        return f"{self.lamport}|{self.region}|{self.op_id}"

    @classmethod
    def decode(cls, text: str) -> Stamp:
        """The stamp of `lamport|region|op_id` (anything after a further `|` is ignored)."""
        parts = text.split("|", 3)
        if len(parts) < 3 or not parts[0].isdigit():
            raise CrdtError(f"{text!r} is not a stamp like 12|eu|op-1")
        return cls(int(parts[0]), check_name("region", parts[1]), check_name("op id", parts[2]))

    def key(self) -> tuple[int, bytes, bytes]:
        """The sort key, byte-wise as Redis's Lua compares."""
        return (self.lamport, self.region.encode(), self.op_id.encode())


@dataclass(frozen=True)
class Add:
    """An element's latest add: its stamp and the value it carries."""

    stamp: Stamp
    value: str


@dataclass(frozen=True)
class Op:
    """One local operation: add (with a value) or remove an element."""

    element: str
    stamp: Stamp
    value: str | None = None
    """The added value; None for a remove."""

    @property
    def is_add(self) -> bool:
        """True for an add."""
        return self.value is not None


@dataclass(frozen=True)
class SessionState:
    """A session's CRDT state (treated as immutable: every function returns a new one)."""

    adds: Mapping[str, Add] = field(default_factory=dict)
    removes: Mapping[str, Stamp] = field(default_factory=dict)
    clock: int = 0
    vv: Mapping[str, int] = field(default_factory=dict)


EMPTY = SessionState()


def _newer(a: Stamp | None, b: Stamp | None) -> bool:
    return b is None or (a is not None and a.key() > b.key())


def merge(a: SessionState, b: SessionState) -> SessionState:
    """The join of two states: per element the newer add and remove, max clock, max vector."""
    adds = dict(a.adds)
    for key, add in b.adds.items():
        if _newer(add.stamp, adds[key].stamp if key in adds else None):
            adds[key] = add
    removes = dict(a.removes)
    for key, stamp in b.removes.items():
        if _newer(stamp, removes.get(key)):
            removes[key] = stamp
    vv = dict(a.vv)
    for region, lamport in b.vv.items():
        vv[region] = max(vv.get(region, 0), lamport)
    return SessionState(adds, removes, max(a.clock, b.clock), vv)


def apply(state: SessionState, op: Op) -> SessionState:
    """The state with one operation merged in (local or remote, idempotent)."""
    stamp = op.stamp
    single = SessionState(
        {op.element: Add(stamp, op.value)} if op.value is not None else {},
        {} if op.value is not None else {op.element: stamp},
        stamp.lamport,
        {stamp.region: stamp.lamport},
    )
    return merge(state, single)


def local_op(
    state: SessionState, region: str, op_id: str, element_key: str, value: str | None
) -> tuple[SessionState, Op]:
    """A new operation of `region` (an add when `value` is given, else a remove), stamped one
    past the session's clock, and the state with it applied."""
    stamp = Stamp(state.clock + 1, check_name("region", region), check_name("op id", op_id))
    op = Op(element_key, stamp, value)
    return apply(state, op), op


def present(state: SessionState, element_key: str) -> bool:
    """True when the element's add is newer than its remove."""
    add = state.adds.get(element_key)
    return add is not None and _newer(add.stamp, state.removes.get(element_key))


def messages(state: SessionState) -> list[tuple[str, str]]:
    """The present messages as (id, content), ordered by their add stamps (the same order in
    every region)."""
    prefix = f"{Kind.MESSAGE.value}:"
    rows = [
        (add.stamp.key(), key.removeprefix(prefix), add.value)
        for key, add in state.adds.items()
        if key.startswith(prefix) and present(state, key)
    ]
    return [(ident, value) for _stamp, ident, value in sorted(rows)]


def variables(state: SessionState) -> dict[str, str]:
    """The present context variables and their values."""
    prefix = f"{Kind.VARIABLE.value}:"
    return {
        key.removeprefix(prefix): add.value
        for key, add in sorted(state.adds.items())
        if key.startswith(prefix) and present(state, key)
    }


def delta_since(state: SessionState, vv: Mapping[str, int]) -> SessionState:
    """What a state whose version vector is `vv` lacks: every add and remove stamped after
    `vv[region]`, with this state's clock and vector."""
    adds = {k: a for k, a in state.adds.items() if a.stamp.lamport > vv.get(a.stamp.region, 0)}
    removes = {k: s for k, s in state.removes.items() if s.lamport > vv.get(s.region, 0)}
    return SessionState(adds, removes, state.clock, dict(state.vv))


def same_content(a: SessionState, b: SessionState) -> bool:
    """True when both states hold the same adds and removes (what `digest` hashes)."""
    return dict(a.adds) == dict(b.adds) and dict(a.removes) == dict(b.removes)


# --- the field layout (a Redis hash per session) and the compact serialisation --------------


def to_fields(state: SessionState) -> dict[str, str]:
    """The state as hash fields: `a:<el>` = `stamp|value`, `r:<el>` = `stamp`, `vv:<region>`,
    `clock`."""
    fields = {f"{ADD_PREFIX}{k}": f"{a.stamp.encode()}|{a.value}" for k, a in state.adds.items()}
    fields.update({f"{REMOVE_PREFIX}{k}": s.encode() for k, s in state.removes.items()})
    fields.update({f"{VV_PREFIX}{r}": str(lamport) for r, lamport in state.vv.items()})
    fields[CLOCK_FIELD] = str(state.clock)
    return fields


def from_fields(fields: Mapping[str, str]) -> SessionState:
    """The state of a hash's fields (`to_fields`'s inverse); unknown fields are ignored."""
    adds: dict[str, Add] = {}
    removes: dict[str, Stamp] = {}
    vv: dict[str, int] = {}
    clock = 0
    for name, text in fields.items():
        if name.startswith(ADD_PREFIX):
            parts = text.split("|", 3)
            if len(parts) != 4:
                raise CrdtError(f"field {name}: {text!r} is not stamp|value")
            adds[name.removeprefix(ADD_PREFIX)] = Add(Stamp.decode(text), parts[3])
        elif name.startswith(REMOVE_PREFIX):
            removes[name.removeprefix(REMOVE_PREFIX)] = Stamp.decode(text)
        elif name.startswith(VV_PREFIX):
            vv[name.removeprefix(VV_PREFIX)] = _int(name, text)
        elif name == CLOCK_FIELD:
            clock = _int(name, text)
    return SessionState(adds, removes, clock, vv)


def _int(name: str, text: str) -> int:
    if not text.isdigit():
        raise CrdtError(f"field {name}: {text!r} is not a non-negative integer")
    return int(text)


def digest(fields_or_state: SessionState | Mapping[str, str]) -> str:
    """SHA-1 over the sorted add/remove fields, length-prefixed; the Lua `DIGEST` script in
    `session_sync` computes the same server-side (vectors and clock are left out: two regions
    holding the same elements agree whatever path the operations took)."""
    fields = (
        to_fields(fields_or_state) if isinstance(fields_or_state, SessionState) else fields_or_state
    )
    pairs = sorted(
        (name.encode(), value.encode())
        for name, value in fields.items()
        if name.startswith((ADD_PREFIX, REMOVE_PREFIX))
    )
    blob = b"".join(b"%d:%s%d:%s" % (len(name), name, len(value), value) for name, value in pairs)
    return hashlib.sha1(blob, usedforsecurity=False).hexdigest()


def dumps(state: SessionState) -> str:
    """Compact, canonical JSON: `{"a":[[el,lamport,region,op,value]…],"c":clock,"r":[[el,
    lamport,region,op]…],"v":{region:lamport}}` (sorted, no spaces)."""
    body = {
        "a": sorted(
            [k, a.stamp.lamport, a.stamp.region, a.stamp.op_id, a.value]
            for k, a in state.adds.items()
        ),
        "c": state.clock,
        "r": sorted([k, s.lamport, s.region, s.op_id] for k, s in state.removes.items()),
        "v": dict(sorted(state.vv.items())),
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def loads(text: str) -> SessionState:
    """The state `dumps` wrote; CrdtError when the text is not one."""
    try:
        body = json.loads(text)
        adds = {
            str(k): Add(Stamp(int(lamport), check_name("region", str(r)), str(o)), str(v))
            for k, lamport, r, o, v in body["a"]
        }
        removes = {
            str(k): Stamp(int(lamport), check_name("region", str(r)), str(o))
            for k, lamport, r, o in body["r"]
        }
        vv = {str(r): int(lamport) for r, lamport in body["v"].items()}
        return SessionState(adds, removes, int(body["c"]), vv)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CrdtError):
            raise
        raise CrdtError(f"not a serialised session state: {exc}") from None


def merge_all(states: Iterable[SessionState]) -> SessionState:
    """The join of any number of states (EMPTY for none)."""
    result = EMPTY
    for state in states:
        result = merge(result, state)
    return result


__all__ = [
    "EMPTY",
    "Add",
    "CrdtError",
    "Kind",
    "Op",
    "SessionState",
    "Stamp",
    "apply",
    "check_id",
    "check_name",
    "delta_since",
    "digest",
    "dumps",
    "element",
    "from_fields",
    "loads",
    "local_op",
    "merge",
    "merge_all",
    "messages",
    "present",
    "same_content",
    "to_fields",
    "variables",
]
