"""LoRA adapter checkpoints on object storage, and their RPO from the object versions.

A checkpoint is one object per adapter, `adapters/<adapter>/checkpoint`, overwritten every
interval in a versioned, Object-Locked bucket: every checkpoint stays as a version (WORM) and the
newest version's LastModified is when the last one landed. `fetch_checkpoint_ages` reads it with
ListObjectVersions, so the figure comes from the storage itself, not from the writer's word.

Timing: S3 (and SeaweedFS 4.48) report LastModified in whole seconds, so an age is exact to
about a second. Note the design's figures: a checkpoint every 2 min cannot keep the RPO at or
under 90 s — just before the next checkpoint the newest one is 120 s old; an RPO of 90 s needs
an interval under 90 s less the upload time (`build_rpo_figures` flags every breach).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from botocore.exceptions import BotoCoreError, ClientError

from redline.platform.weights.errors import RecordStoreError
from redline.platform.weights.records import encode_part
from redline.platform.weights.s3store import S3RecordStore, describe_client_error

PREFIX = "adapters/"
OBJECT = "checkpoint"
DEFAULT_RPO_SECONDS = 90.0


@dataclass(frozen=True)
class CheckpointAge:
    """The newest stored checkpoint of an adapter."""

    adapter: str
    version_id: str
    last_modified: float
    age_seconds: float
    deleted: bool
    """The key's newest version is a delete marker: the checkpoint was deleted after it."""


@dataclass(frozen=True)
class RpoFigures:
    """Checkpoint ages against the RPO."""

    rpo_seconds: float
    worst_age_seconds: float | None
    breaches: list[str]
    """Adapters whose newest checkpoint is older than the RPO, deleted, or missing."""


def checkpoint_key(adapter: str) -> str:
    """The record key of an adapter's checkpoint object."""
    return f"{PREFIX}{encode_part(adapter)}/{OBJECT}"


def write_checkpoint(store: S3RecordStore, adapter: str, data: bytes) -> str:
    """Store a new checkpoint of the adapter (a new object version); its ETag."""
    return store.put(checkpoint_key(adapter), data)


def _seconds(value: datetime) -> float:
    return value.timestamp()


def fetch_checkpoint_ages(
    store: S3RecordStore,
    adapters: Iterable[str] | None = None,
    now: float | None = None,
) -> dict[str, CheckpointAge]:
    """The newest version of each adapter's checkpoint (all adapters found, or `adapters`)
    and its age, from ListObjectVersions; adapters with no version are left out."""
    now = time.time() if now is None else now
    wanted = None if adapters is None else {checkpoint_key(a): a for a in adapters}
    newest: dict[str, tuple[float, bool, str, bool]] = {}
    paginator = store.client.get_paginator("list_object_versions")
    start = len(store.prefix)
    try:
        pages = list(paginator.paginate(Bucket=store.bucket, Prefix=store.prefix + PREFIX))
    except (ClientError, BotoCoreError) as exc:
        detail = describe_client_error(exc) if isinstance(exc, ClientError) else str(exc)
        raise RecordStoreError(
            f"{store.where(PREFIX)}: cannot list checkpoint versions: {detail}"
        ) from None
    for page in pages:
        items: list[tuple[dict[str, Any], bool]] = [
            *((dict(v), False) for v in page.get("Versions", [])),
            *((dict(m), True) for m in page.get("DeleteMarkers", [])),
        ]
        for item, marker in items:
            key = str(item["Key"])[start:]
            if not key.endswith(f"/{OBJECT}") or (wanted is not None and key not in wanted):
                continue
            stamp = _seconds(item["LastModified"])
            # Whole-second stamps tie: IsLatest breaks the tie.
            rank = (stamp, bool(item.get("IsLatest")))
            current = newest.get(key)
            if current is None or rank > current[:2]:
                newest[key] = (stamp, bool(item.get("IsLatest")), str(item["VersionId"]), marker)
    ages = {}
    for key, (stamp, _, version_id, marker) in newest.items():
        adapter = wanted[key] if wanted else unquote(key[len(PREFIX) : -len(OBJECT) - 1])
        ages[adapter] = CheckpointAge(
            adapter=adapter,
            version_id=version_id,
            last_modified=stamp,
            age_seconds=max(0.0, now - stamp),
            deleted=marker,
        )
    return ages


def build_rpo_figures(
    ages: Mapping[str, CheckpointAge],
    adapters: Iterable[str],
    rpo_seconds: float = DEFAULT_RPO_SECONDS,
) -> RpoFigures:
    """The worst checkpoint age and the adapters breaching the RPO (missing ones included)."""
    breaches = []
    for adapter in sorted(set(adapters) | set(ages)):
        age = ages.get(adapter)
        if age is None or age.deleted or age.age_seconds > rpo_seconds:
            breaches.append(adapter)
    worst = max((a.age_seconds for a in ages.values()), default=None)
    return RpoFigures(rpo_seconds=rpo_seconds, worst_age_seconds=worst, breaches=breaches)
