"""The Merkle maths of the prompt log (pure): leaf and node hashes, trees as levels, inclusion
proofs, and a stored tree's bytes back into levels.

Leaf = SHA-256(0x00 | ts | session | content hash) with each field length-prefixed; node =
SHA-256(0x01 | left | right) (domain separation: a leaf can never pass for a node); an odd node
at the end of a level moves up unchanged. A stored tree is every level, leaves first, as raw
32-byte nodes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from redline.platform.promptlog.errors import PromptLogError

_LEAF = b"\x00"
_NODE = b"\x01"


def _framed(*parts: str) -> bytes:
    out = bytearray()
    for part in parts:
        data = part.encode("utf-8")
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)


def leaf_hash(ts: str, session: str, digest: str) -> bytes:
    """The Merkle leaf of a record: H(0x00 | ts | session | content hash), fields framed."""
    return hashlib.sha256(_LEAF + _framed(ts, session, digest)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """An inner node: H(0x01 | left | right)."""
    return hashlib.sha256(_NODE + left + right).digest()


def build_levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaves first, root last (an odd last node moves up as is)."""
    if not leaves:
        raise PromptLogError("a Merkle tree needs at least one leaf")
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        level = levels[-1]
        up = [node_hash(level[k], level[k + 1]) for k in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            up.append(level[-1])
        levels.append(up)
    return levels


def level_sizes(count: int) -> list[int]:
    """How many nodes each level of a tree over `count` leaves holds."""
    sizes = [count]
    while sizes[-1] > 1:
        sizes.append((sizes[-1] + 1) // 2)
    return sizes


def inclusion_proof(levels: Sequence[Sequence[bytes]], index: int) -> list[bytes]:
    """The sibling hashes from leaf `index` up to the root."""
    proof: list[bytes] = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            proof.append(level[sibling])
        index //= 2
    return proof


def root_from_proof(leaf: bytes, index: int, count: int, proof: Sequence[bytes]) -> bytes | None:
    """The root leaf `index` of `count` leads to with `proof` (None: the proof has the wrong
    length for that position). The sides come from the index, so a proof binds the position."""
    if not 0 <= index < count:
        return None
    node, size, steps = leaf, count, iter(proof)
    while size > 1:
        if index ^ 1 < size:
            sibling = next(steps, None)
            if sibling is None:
                return None
            node = node_hash(sibling, node) if index % 2 else node_hash(node, sibling)
        index //= 2
        size = (size + 1) // 2
    return None if next(steps, None) is not None else node


def verify_proof(leaf: bytes, index: int, count: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True when `proof` shows `leaf` at `index` of a `count`-leaf tree with `root`."""
    return root_from_proof(leaf, index, count, proof) == root


def split_levels(tree: bytes, count: int) -> list[list[bytes]]:
    """A stored tree's bytes back into levels (PromptLogError when the size is wrong)."""
    sizes = level_sizes(count)
    if len(tree) != 32 * sum(sizes):
        raise PromptLogError(f"tree of {count} leaves must be {32 * sum(sizes)} bytes")
    levels, at = [], 0
    for size in sizes:
        levels.append([tree[k : k + 32] for k in range(at, at + 32 * size, 32)])
        at += 32 * size
    return levels
