"""A rollback job's progress in Redis, so a re-run (after a crash or a retry) continues it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis


@dataclass(frozen=True)
class Progress:
    """What this job has done so far: the snapshot it started from, the one it chose, the ones it
    rejected (snapshot id -> why)."""

    origin: str | None
    chosen: str | None
    rejected: dict[str, str]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ProgressStore:
    """One job's progress hash (`<prefix>:rollback:<job id>`), kept `retention_seconds`."""

    def __init__(self, client: redis.Redis, key: str, retention_seconds: int) -> None:
        self.client = client
        self.key = key
        self.retention_seconds = retention_seconds

    def load(self) -> Progress:
        """The progress recorded so far (empty for a new job)."""
        raw = {_text(k): _text(v) for k, v in self.client.hgetall(self.key).items()}
        rejected = {k[len("rejected:") :]: v for k, v in raw.items() if k.startswith("rejected:")}
        return Progress(raw.get("from"), raw.get("chosen"), rejected)

    def fix_origin(self, origin: str) -> None:
        """Record where the job started; the first execution wins, a re-run keeps it."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self.key, "from", origin)
            pipe.expire(self.key, self.retention_seconds)
            pipe.execute()

    def save(self, fields: Mapping[str, str]) -> None:
        """Set fields of the progress (`chosen`, `rejected:<id>`)."""
        with self.client.pipeline(transaction=True) as pipe:
            for name, value in fields.items():
                pipe.hset(self.key, name, value)
            pipe.expire(self.key, self.retention_seconds)
            pipe.execute()

    def choose(self, snapshot_id: str) -> None:
        """Record the snapshot the job rolled back to."""
        self.save({"chosen": snapshot_id})

    def reject(self, snapshot_id: str, reason: str) -> None:
        """Record a candidate that failed, and why."""
        self.save({f"rejected:{snapshot_id}": reason})


__all__ = ["Progress", "ProgressStore"]
