"""Where a game day records each step: redline's audit trail in Redis (the receiver's, so
`redline audit verify` checks the game day with the jobs it caused) or, without Redis, a JSONL
file chained the same way (`seq`, `prev`, `hash`; `redline audit verify --file` reads it)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from redline.gameday.plan import GamedayError
from redline.remediation.audit import (
    EMPTY_HEAD,
    AuditEntry,
    Head,
    extend_chain,
    mirror_to_file,
    verify_file,
)


class Audit(Protocol):
    """Appends one audit record (`AuditLog` has this shape)."""

    def append(self, kind: str, job_id: str | None = None, **data: Any) -> None:
        """Append one record."""


class FileAudit:
    """A hash-chained JSONL audit file, continued where it ends."""

    def __init__(self, path: Path) -> None:
        result = verify_file(path)
        if not result.ok:
            raise GamedayError(f"--audit-file {path}: {result.render(str(path))}")
        self.path = path
        self.head = Head(result.count, result.last_hash) if result.count else EMPTY_HEAD

    def append(self, kind: str, job_id: str | None = None, **data: Any) -> None:
        """Append one record to the file."""
        records, head = extend_chain(self.head, [AuditEntry(kind, job_id, data)], datetime.now(UTC))
        mirror_to_file(self.path, records, self.head.count)
        self.head = head
