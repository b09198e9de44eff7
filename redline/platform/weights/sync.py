"""Cross-region sync of encrypted weights: shards and manifests copied from a healthy region's
store to another, the DEK records beside them, and the DR sync table with per-region lag.

A copy is idempotent and minimal: an object is copied only when the destination lacks it or
holds other bytes (compared by sha256: `RecordStore.digest`, a HeadObject on S3), the source
bytes are checked against the manifest's ciphertext sha256 before they leave (a damaged source
is never spread), the destination's digest is checked after, and a version's manifest is
written last, so the destination shows a version only once all its shards are there. The KEK is
not copied: each region's HSM (or KMS multi-region key) must hold the same KEK for the copied
DEK records to unwrap there.

The sync table is one record per weights name and region, `sync/<name>/<region>.json`, in the
store the caller names (the control region's, or both): a row per shard with its key version,
storage node (the bucket), ciphertext sha256 and last sync time. `build_region_lag` turns
tables and the source manifests into lag figures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.platform.weights.errors import RecordConflictError, SyncError
from redline.platform.weights.keyring import DekRecord
from redline.platform.weights.records import RecordStore, encode_part, sha256_hex
from redline.platform.weights.shards import (
    ShardManifest,
    list_versions,
    load_manifest,
    manifest_key,
    shard_key,
)

log = logging.getLogger(__name__)

_ATTEMPTS = 8


@dataclass(frozen=True)
class Region:
    """One region's copy: its name, its store and the storage node (bucket) it names."""

    name: str
    store: RecordStore
    node: str


class SyncRow(BaseModel):
    """One shard's copy in one region."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shard_id: str
    key_version: int = Field(ge=1)
    region: str
    node: str
    ciphertext_sha256: str
    last_sync: float


class SyncTable(BaseModel):
    """The sync rows of one weights name in one region, and the versions fully copied."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = 1
    name: str
    region: str
    rows: dict[str, SyncRow] = Field(default_factory=dict)
    versions: dict[str, float] = Field(
        default_factory=dict, description="Version -> when its manifest reached the region."
    )


@dataclass
class SyncResult:
    """What one sync copied and what was there already."""

    copied: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    manifests_copied: list[str] = field(default_factory=list)
    deks_copied: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RegionLag:
    """How far one region is behind the source."""

    region: str
    node: str | None
    shards_expected: int
    shards_missing: int
    versions_missing: list[str]
    last_sync_age_seconds: float | None
    lag_seconds: float
    """0 when the region holds every version; else the age of the oldest version it lacks."""


def sync_table_key(name: str, region: str) -> str:
    """The record key of a region's sync table."""
    return f"sync/{encode_part(name)}/{encode_part(region)}.json"


def load_sync_table(store: RecordStore, name: str, region: str) -> SyncTable:
    """A region's sync table (empty when none was written)."""
    table, _ = _read_table(store, name, region)
    return table


def _read_table(store: RecordStore, name: str, region: str) -> tuple[SyncTable, str | None]:
    key = sync_table_key(name, region)
    found = store.get(key)
    if found is None:
        return SyncTable(name=name, region=region), None
    try:
        return SyncTable.model_validate_json(found[0]), found[1]
    except ValidationError as exc:
        raise SyncError(f"{store.where(key)}: malformed sync table: {exc}") from None


def _copy_object(source: Region, dest: Region, key: str, expected: str) -> bool:
    """Copy one object if the destination lacks it or differs; True when copied."""
    if dest.store.digest(key) == expected:
        return False
    found = source.store.get(key)
    if found is None:
        raise SyncError(f"{source.store.where(key)}: missing in region {source.name!r}")
    if sha256_hex(found[0]) != expected:
        raise SyncError(
            f"{source.store.where(key)}: damaged in region {source.name!r} (sha256 does not "
            "match the manifest): not copied"
        )
    dest.store.put(key, found[0])
    if dest.store.digest(key) != expected:
        raise SyncError(f"{dest.store.where(key)}: copy to {dest.name!r} did not verify")
    return True


def sync_keyring(source: Region, dest: Region, keyring: str) -> list[int]:
    """Copy the DEK records of `keyring`, merged: a retirement or revocation made in either
    region is kept (the earliest time wins). The versions written to the destination."""
    prefix = f"keyrings/{encode_part(keyring)}/deks/"
    written = []
    for key in source.store.list(prefix):
        found = source.store.get(key)
        if found is None:
            continue
        record = DekRecord.model_validate_json(found[0])
        for _ in range(_ATTEMPTS):
            there = dest.store.get(key)
            merged = record
            if there is not None:
                other = DekRecord.model_validate_json(there[0])
                merged = record.model_copy(
                    update={
                        "retired_at": _earliest(record.retired_at, other.retired_at),
                        "revoked_at": _earliest(record.revoked_at, other.revoked_at),
                        "revoked_reason": record.revoked_reason or other.revoked_reason,
                    }
                )
                if merged == other:
                    break
            data = merged.model_dump_json(indent=2).encode()
            try:
                dest.store.put(
                    key,
                    data,
                    if_version=None if there is None else there[1],
                    if_absent=there is None,
                )
            except RecordConflictError:
                continue
            written.append(record.version)
            break
        else:
            raise SyncError(f"{dest.store.where(key)}: kept changing while syncing")
    return written


def _earliest(a: float | None, b: float | None) -> float | None:
    return min(x for x in (a, b) if x is not None) if a is not None or b is not None else None


def sync_weights(
    source: Region,
    dest: Region,
    name: str,
    table_store: RecordStore,
    *,
    versions: Iterable[str] | None = None,
    now: float | None = None,
) -> SyncResult:
    """Copy the missing or mismatched shards of every version (or `versions`) of `name`, then
    each manifest; the DEK records of their keyrings; the destination's sync table updated."""
    now = time.time() if now is None else now
    result = SyncResult()
    manifests = [
        load_manifest(source.store, name, v)
        for v in (list_versions(source.store, name) if versions is None else versions)
    ]
    for keyring in sorted({m.keyring for m in manifests}):
        result.deks_copied.extend(sync_keyring(source, dest, keyring))
    rows: dict[str, SyncRow] = {}
    reached: dict[str, float] = {}
    for manifest in sorted(manifests, key=lambda m: m.created_at):
        for entry in {e.shard_id: e for e in manifest.shards}.values():
            key = shard_key(name, entry.shard_id)
            if entry.shard_id not in rows:
                copied = _copy_object(source, dest, key, entry.ciphertext_sha256)
                (result.copied if copied else result.present).append(key)
            rows[entry.shard_id] = SyncRow(
                shard_id=entry.shard_id,
                key_version=entry.key_version,
                region=dest.name,
                node=dest.node,
                ciphertext_sha256=entry.ciphertext_sha256,
                last_sync=now,
            )
        if _sync_manifest(source, dest, manifest):
            result.manifests_copied.append(manifest.version)
        reached[manifest.version] = now
    _record(table_store, name, dest, rows, reached)
    log.info(
        "sync %s %s -> %s: %d copied, %d present, %d manifests",
        name,
        source.name,
        dest.name,
        len(result.copied),
        len(result.present),
        len(result.manifests_copied),
    )
    return result


def _sync_manifest(source: Region, dest: Region, manifest: ShardManifest) -> bool:
    key = manifest_key(manifest.name, manifest.version)
    found = source.store.get(key)
    if found is None:
        raise SyncError(f"{source.store.where(key)}: vanished during the sync")
    wanted = sha256_hex(found[0])
    there = dest.store.digest(key)
    if there == wanted:
        return False
    if there is not None:
        raise SyncError(
            f"{dest.store.where(key)}: region {dest.name!r} holds another manifest of "
            f"{manifest.name!r} {manifest.version!r} than {source.name!r}: manifests are "
            "immutable, resolve by hand"
        )
    try:
        dest.store.put(key, found[0], if_absent=True)
    except RecordConflictError:
        if dest.store.digest(key) != wanted:
            raise SyncError(
                f"{dest.store.where(key)}: written concurrently with other bytes"
            ) from None
        return False
    return True


def _record(
    store: RecordStore,
    name: str,
    dest: Region,
    rows: Mapping[str, SyncRow],
    reached: Mapping[str, float],
) -> None:
    key = sync_table_key(name, dest.name)
    for _ in range(_ATTEMPTS):
        table, token = _read_table(store, name, dest.name)
        merged = table.model_copy(
            update={
                "rows": {**table.rows, **rows},
                "versions": {**table.versions, **reached},
            }
        )
        try:
            store.put(
                key,
                merged.model_dump_json(indent=1).encode(),
                if_version=token,
                if_absent=token is None,
            )
        except RecordConflictError:
            continue
        return
    raise SyncError(f"{store.where(key)}: the sync table kept changing")


def build_region_lag(
    manifests: Iterable[ShardManifest],
    tables: Mapping[str, SyncTable],
    now: float,
) -> dict[str, RegionLag]:
    """Per region: shards and versions of the source it lacks, the age of its last sync, and
    its lag (the age of the oldest source version it does not hold; 0 when it holds all)."""
    manifests = list(manifests)
    expected: dict[str, str] = {}
    for manifest in manifests:
        expected.update({e.shard_id: e.ciphertext_sha256 for e in manifest.shards})
    figures = {}
    for region, table in sorted(tables.items()):
        missing = [
            shard
            for shard, sha in expected.items()
            if shard not in table.rows or table.rows[shard].ciphertext_sha256 != sha
        ]
        lacking = [m for m in manifests if m.version not in table.versions]
        last = max((row.last_sync for row in table.rows.values()), default=None)
        nodes = {row.node for row in table.rows.values()}
        figures[region] = RegionLag(
            region=region,
            node=next(iter(nodes)) if len(nodes) == 1 else None,
            shards_expected=len(expected),
            shards_missing=len(missing),
            versions_missing=sorted(m.version for m in lacking),
            last_sync_age_seconds=None if last is None else max(0.0, now - last),
            lag_seconds=max((max(0.0, now - m.created_at) for m in lacking), default=0.0),
        )
    return figures
