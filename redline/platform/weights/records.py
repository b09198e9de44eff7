"""The record-store interface (small JSON records and blobs by key, with conditional writes) and
its file implementation, the snapshot registry's default.

A key is a relative `/`-separated path (`models/org%2Fm/active.json`); no part may be empty,
`..` or start with `.` (those names are the file store's temp and lock files). A version token
is opaque: a store hands one out with every read and write, and `put(..., if_version=token)`
succeeds only while the record still has that version; `if_absent=True` only while no record
exists. A lost race raises `RecordConflictError`.

`FileRecordStore` keeps the registry's historical layout and write discipline: a temp file in
the same directory, fsync, `os.replace`, fsync of the directory, so a reader sees the old
record or the new one, never half of one. Its version token is the sha256 of the bytes. Its
conditions are checked then written, which is atomic among writers holding `lock(scope)` of the
key's scope (the registry always writes under it; flock, so across processes on one host): the
file store offers no compare-and-swap of its own. `S3RecordStore` (`s3store`) needs no lock:
the object store checks the conditions itself.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from redline.platform.weights.errors import RecordConflictError, RecordStoreError


class RecordStore(Protocol):
    """Records by key with version tokens and conditional writes."""

    def get(self, key: str) -> tuple[bytes, str] | None:
        """The record's bytes and version token; None when there is no record."""
        ...

    def put(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        """Write the record (conditionally); its new version token. RecordConflictError when
        the condition does not hold."""
        ...

    def list(self, prefix: str) -> builtins.list[str]:
        """Every key starting with `prefix`, sorted."""
        ...

    def children(self, prefix: str) -> builtins.list[str]:
        """The names one level below `prefix` (which ends in `/` or is empty), sorted."""
        ...

    def digest(self, key: str) -> str | None:
        """The sha256 (hex) of the stored bytes; None when there is no record."""
        ...

    def where(self, key: str) -> str:
        """Where the record lives, for messages (a path or an s3:// URL)."""
        ...

    def lock(self, scope: str) -> AbstractContextManager[None]:
        """Serialise this store's writers of one scope where it needs to (a no-op for stores
        that check conditions themselves)."""
        ...


def check_key(key: str) -> str:
    """The key itself if it is a valid record key; RecordStoreError naming it otherwise."""
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or any(not p or p == ".." or p.startswith(".") for p in parts)
    ):
        raise RecordStoreError(
            f"record key {key!r} is not valid: a relative /-separated path whose parts are "
            "neither empty, '..' nor start with '.'"
        )
    return key


def check_prefix(prefix: str) -> str:
    """The prefix itself if valid (empty, or a valid key, possibly ending in `/`)."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def encode_part(name: str) -> str:
    """`name` as one key part: percent-encoded (so `org/name` is safe), a leading dot too."""
    if not name:
        raise RecordStoreError("a name in a record key must not be empty")
    encoded = quote(name, safe="")
    return "%2E" + encoded[1:] if encoded.startswith(".") else encoded


def sha256_hex(data: bytes) -> str:
    """The sha256 of `data`, hex."""
    return hashlib.sha256(data).hexdigest()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write bytes to a temp file beside `path`, fsync it, `os.replace` it, fsync the directory."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class FileRecordStore:
    """Records as files under `root` (see the module docstring for the guarantees)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def where(self, key: str) -> str:
        """The record's file path."""
        return str(self.root / key)

    def get(self, key: str) -> tuple[bytes, str] | None:
        """The file's bytes and their sha256; None when there is no file."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RecordStoreError(f"{path}: cannot read: {exc.strerror or exc}") from None
        return data, sha256_hex(data)

    def digest(self, key: str) -> str | None:
        """The sha256 of the file; None when there is no file."""
        found = self.get(key)
        return None if found is None else found[1]

    def put(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        """Replace the file atomically; conditions as the module docstring says."""
        path = self._path(key)
        if if_absent or if_version is not None:
            current = self.get(key)
            if if_absent and current is not None:
                raise RecordConflictError(f"{path}: exists already (written concurrently?)")
            if if_version is not None and (current is None or current[1] != if_version):
                raise RecordConflictError(f"{path}: changed since it was read")
        try:
            write_bytes_atomic(path, data)
        except OSError as exc:
            raise RecordStoreError(f"{path}: cannot write: {exc.strerror or exc}") from None
        return sha256_hex(data)

    def list(self, prefix: str) -> builtins.list[str]:
        """Every file key starting with `prefix` (hidden files and directories left out)."""
        check_prefix(prefix)
        base = self.root / prefix.rpartition("/")[0]
        if not base.is_dir():
            return []
        keys = []
        for path in base.rglob("*"):
            relative = path.relative_to(self.root).as_posix()
            if any(part.startswith(".") for part in relative.split("/")) or not path.is_file():
                continue  # a crashed writer's temp file or a lock file is no record
            if relative.startswith(prefix):
                keys.append(relative)
        return sorted(keys)

    def children(self, prefix: str) -> builtins.list[str]:
        """Entries (files and directories) directly below the `prefix` directory."""
        check_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            raise RecordStoreError(f"children prefix {prefix!r} must end with '/'")
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(entry.name for entry in base.iterdir() if not entry.name.startswith("."))

    @contextlib.contextmanager
    def lock(self, scope: str) -> Iterator[None]:
        """An exclusive flock on `<root>/<scope>/.lock` (created as needed)."""
        directory = self.root / check_key(scope)
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / ".lock").open("a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
