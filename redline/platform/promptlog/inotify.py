"""Change events of one directory from the kernel's inotify (Linux), through libc: what the
prompt log's watcher listens to for its files."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
from pathlib import Path

EVERYTHING = "*"  # the name `Inotify.read` gives when events were lost: everything may have changed

# inotify(7): the events that can mean a file's bytes, or the file itself, changed.
_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_WATCHED = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")


class Inotify:
    """Change events of one directory from the kernel's inotify, through libc (Linux)."""

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if int(libc.inotify_add_watch(self.fd, os.fsencode(directory), _WATCHED)) < 0:
            errno = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(errno, f"inotify_add_watch {directory} failed")

    def read(self, timeout: float) -> list[str]:
        """The names of the files that changed (`*`: events were lost), waiting up to
        `timeout` seconds for the first."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        names, at = [], 0
        while at + _EVENT.size <= len(data):
            _, mask, _, length = _EVENT.unpack_from(data, at)
            raw = data[at + _EVENT.size : at + _EVENT.size + length]
            at += _EVENT.size + length
            if mask & (_IN_Q_OVERFLOW | _IN_DELETE_SELF | _IN_MOVE_SELF):
                names.append(EVERYTHING)
            elif length:
                names.append(os.fsdecode(raw.rstrip(b"\0")))
        return names

    def close(self) -> None:
        """Stop watching."""
        os.close(self.fd)
