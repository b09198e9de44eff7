"""The prompt log's segment files: `records-<segment>.seg` and `tree-<segment>.bin` in one
directory, and the ranged reads of a batch's bytes, its stored tree and a proof from it.

A batch starts a new segment once the current one holds `segment_bytes`: closed segments are
never written again, so a change to one is tampering, and re-checking the segment that changed
costs the same at any log size.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import BinaryIO

from redline.platform.promptlog.format import BatchEntry
from redline.platform.promptlog.merkle import level_sizes

_SEGMENT_FILE = re.compile(r"^records-(\d{6,})\.seg$")


def read_range(handle: BinaryIO, offset: int, length: int) -> bytes:
    """`length` bytes of an open file from `offset` (pread: the file position is left alone)."""
    return os.pread(handle.fileno(), length, offset)


def stored_proof(handle: BinaryIO, entry: BatchEntry, leaf: int) -> list[bytes]:
    """The inclusion proof of `leaf` read from the batch's stored tree: one 32-byte read per
    level (the tree is not trusted: the proof is checked against the anchored root)."""
    proof: list[bytes] = []
    level_at, index = entry.tree_offset, leaf
    for size in level_sizes(entry.count)[:-1]:
        sibling = index ^ 1
        if sibling < size:
            proof.append(os.pread(handle.fileno(), 32, level_at + 32 * sibling))
        level_at += 32 * size
        index //= 2
    return proof


class SegmentFiles:
    """The records and tree files of a prompt log's `directory`, by segment number."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def segment_path(self, segment: int) -> Path:
        """The records file of `segment`."""
        return self.directory / f"records-{segment:06d}.seg"

    def tree_path(self, segment: int) -> Path:
        """The Merkle trees file of `segment`."""
        return self.directory / f"tree-{segment:06d}.bin"

    def segment_files(self) -> dict[int, Path]:
        """The records files on disk, by segment number."""
        found: dict[int, Path] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in self.directory.iterdir():
                match = _SEGMENT_FILE.match(path.name)
                if match:
                    found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def segment_range(self, segment: int, offset: int, length: int) -> bytes:
        """`length` bytes of `segment`'s records file from `offset` (OSError when unreadable)."""
        with self.segment_path(segment).open("rb") as handle:
            return read_range(handle, offset, length)

    def sealed(self, entry: BatchEntry) -> bool:
        """True when the batch's bytes are where its entry says and match their seal."""
        try:
            data = self.segment_range(entry.segment, entry.records_offset, entry.records_length)
        except OSError:
            return False
        return hashlib.sha256(data).hexdigest() == entry.records_digest

    def stored_tree(self, entry: BatchEntry) -> bytes | None:
        """The bytes of a batch's stored tree (None when they cannot be read)."""
        try:
            with self.tree_path(entry.segment).open("rb") as handle:
                return read_range(handle, entry.tree_offset, entry.tree_end - entry.tree_offset)
        except OSError:
            return None
