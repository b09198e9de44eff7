"""The DEK lifecycle: data-encryption keys created, rotated, retired, expired and revoked.

Each DEK is a record `keyrings/<name>/deks/<version>.json` in a record store (object storage in
production, so every region's keyring is where its shards are) holding the DEK wrapped by the
KEK (`keys.KeyWrapper`); the plain DEK exists only in memory, unwrapped through the HSM or KMS
on every use. States (`build_dek_state`):

- current: the newest DEK that is neither retired nor revoked; it encrypts new shards. Once it is
  the spec's `weights.dek_rotation_hours` (72) old, `current()` makes the next version and
  retires it.
- retired: decrypts older shards for `weights.dek_retention_days` (30) after its retirement,
- expired: after that it decrypts nothing (DekExpiredError): shards still under it must have
  been re-encrypted (`build_keyring_figures` counts those that were not),
- revoked: decrypts nothing, at once (DekRevokedError).

Both periods come from the spec (`redline.slo.spec.Weights`): the service that builds a keyring
passes `spec.weights`; without it a keyring takes the spec's defaults, the same numbers as a spec
without a `weights:` section.

Writers race with conditional writes: two processes rotating at once create one new version
(the loser reads the winner's), and a crash between creating a DEK and retiring the old one
is healed by the next `current()`.
"""

from __future__ import annotations

import base64
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.platform.weights.errors import (
    DekExpiredError,
    DekNotFoundError,
    DekRevokedError,
    KeyringError,
    RecordConflictError,
)
from redline.platform.weights.keys import DEK_BYTES, KeyWrapper
from redline.platform.weights.records import RecordStore, encode_part
from redline.platform.weights.settings import KeyringSettings
from redline.slo.spec import Weights

log = logging.getLogger(__name__)

DekState = Literal["current", "retired", "expired", "revoked"]
_ATTEMPTS = 8


class DekRecord(BaseModel):
    """One DEK version, wrapped by the KEK, with its lifecycle times."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = 1
    keyring: str
    version: int = Field(ge=1)
    kek_id: str = Field(min_length=1, description="The KEK that wrapped `wrapped`.")
    wrapped: str = Field(min_length=1, description="The wrapped DEK, base64.")
    created_at: float
    retired_at: float | None = None
    revoked_at: float | None = None
    revoked_reason: str | None = None


@dataclass(frozen=True)
class Dek:
    """An unwrapped DEK: its version and key (kept out of every repr)."""

    version: int
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class KeyringFigures:
    """What monitoring shows of a keyring at one moment."""

    current_version: int | None
    current_age_seconds: float | None
    seconds_to_rotation: float | None
    versions_by_state: dict[str, list[int]]
    shards_by_version: dict[int, int]
    shards_past_retention: int
    """Shards whose DEK is expired or revoked (or unknown): they no longer decrypt."""


def build_dek_state(record: DekRecord, policy: Weights, now: float) -> DekState:
    """The lifecycle state of a DEK record at `now` under the spec's `weights` periods."""
    if record.revoked_at is not None and record.revoked_at <= now:
        return "revoked"
    if record.retired_at is None or record.retired_at > now:
        return "current"
    if now > record.retired_at + policy.retention_seconds:
        return "expired"
    return "retired"


def build_keyring_figures(
    records: Iterable[DekRecord],
    policy: Weights,
    now: float,
    shard_key_versions: Iterable[int] = (),
) -> KeyringFigures:
    """Age of the current DEK, seconds to its rotation, versions by state and the shards whose
    DEK is past retention (expired, revoked or missing)."""
    records = sorted(records, key=lambda r: r.version)
    states = {r.version: build_dek_state(r, policy, now) for r in records}
    by_state: dict[str, list[int]] = {s: [] for s in ("current", "retired", "expired", "revoked")}
    for version, state in states.items():
        by_state[state].append(version)
    current = next((r for r in reversed(records) if states[r.version] == "current"), None)
    age = None if current is None else max(0.0, now - current.created_at)
    to_rotation = None if age is None else max(0.0, policy.rotation_seconds - age)
    shards: dict[int, int] = {}
    for version in shard_key_versions:
        shards[version] = shards.get(version, 0) + 1
    unusable = sum(
        count
        for version, count in shards.items()
        if states.get(version, "expired") in ("expired", "revoked")
    )
    return KeyringFigures(
        current_version=None if current is None else current.version,
        current_age_seconds=age,
        seconds_to_rotation=to_rotation,
        versions_by_state=by_state,
        shards_by_version=dict(sorted(shards.items())),
        shards_past_retention=unusable,
    )


def dek_key(keyring: str, version: int) -> str:
    """The record key of a keyring's DEK version."""
    return f"keyrings/{encode_part(keyring)}/deks/{version:08d}.json"


def read_dek_record(store: RecordStore, keyring: str, version: int) -> tuple[DekRecord, str] | None:
    """A DEK record and its ETag; None when there is none; KeyringError naming the object when
    it is corrupt or names another keyring or version."""
    key = dek_key(keyring, version)
    found = store.get(key)
    if found is None:
        return None
    try:
        record = DekRecord.model_validate_json(found[0])
    except ValidationError as exc:
        raise KeyringError(f"{store.where(key)}: corrupt DEK record: {exc}") from None
    if record.version != version or record.keyring != keyring:
        raise KeyringError(
            f"{store.where(key)}: records keyring {record.keyring!r} version "
            f"{record.version}, expected {keyring!r} {version}"
        )
    return record, found[1]


def load_dek_records(store: RecordStore, keyring: str) -> list[DekRecord]:
    """Every DEK record of a keyring, oldest first: what monitoring reads, no KEK needed."""
    records = []
    for key in store.list(dek_key(keyring, 0).rsplit("/", 1)[0] + "/"):
        name = key.rsplit("/", 1)[-1]
        if not name.endswith(".json") or not name[:-5].isdigit():
            continue
        found = read_dek_record(store, keyring, int(name[:-5]))
        if found is not None:
            records.append(found[0])
    return sorted(records, key=lambda r: r.version)


class Keyring:
    """The DEKs of one keyring in a record store, wrapped by one KEK, rotated and retired by
    `policy` (the spec's `weights` section)."""

    def __init__(
        self,
        store: RecordStore,
        wrapper: KeyWrapper,
        settings: KeyringSettings | None = None,
        clock: Callable[[], float] = time.time,
        policy: Weights | None = None,
    ) -> None:
        self.store = store
        self.wrapper = wrapper
        self.settings = settings or KeyringSettings()
        self.policy = policy or Weights()
        self._clock = clock

    @property
    def name(self) -> str:
        """The keyring's name."""
        return self.settings.name

    def _key(self, version: int) -> str:
        return dek_key(self.name, version)

    def _read(self, version: int) -> tuple[DekRecord, str] | None:
        return read_dek_record(self.store, self.name, version)

    def records(self) -> list[DekRecord]:
        """Every DEK record, oldest first."""
        return load_dek_records(self.store, self.name)

    def record(self, version: int) -> DekRecord:
        """One DEK record; DekNotFoundError naming the key when there is none."""
        found = self._read(version)
        if found is None:
            raise DekNotFoundError(
                f"{self.store.where(self._key(version))}: keyring {self.name!r} has no DEK "
                f"version {version}"
            )
        return found[0]

    def state(self, record: DekRecord, now: float | None = None) -> DekState:
        """The record's lifecycle state now."""
        return build_dek_state(record, self.policy, self._clock() if now is None else now)

    def _unwrap(self, record: DekRecord) -> Dek:
        if record.kek_id != self.wrapper.kek_id:
            raise KeyringError(
                f"DEK {self.name!r} v{record.version} is wrapped by {record.kek_id!r}, this "
                f"keyring unwraps with {self.wrapper.kek_id!r} (rewrap pending?)"
            )
        return Dek(record.version, self.wrapper.unwrap(base64.b64decode(record.wrapped)))

    def _update(self, version: int, change: Callable[[DekRecord], DekRecord | None]) -> DekRecord:
        """Read-modify-write of one record; `change` returns None to leave it as it is."""
        for _ in range(_ATTEMPTS):
            found = self._read(version)
            if found is None:
                raise DekNotFoundError(f"keyring {self.name!r} has no DEK version {version}")
            updated = change(found[0])
            if updated is None:
                return found[0]
            data = updated.model_dump_json(indent=2).encode()
            try:
                self.store.put(self._key(version), data, if_version=found[1])
            except RecordConflictError:
                continue
            return updated
        raise KeyringError(f"DEK {self.name!r} v{version} kept changing; try again")

    def _create(self, version: int, now: float) -> DekRecord:
        """A new DEK version (or the one a concurrent writer created first)."""
        dek = secrets.token_bytes(DEK_BYTES)
        record = DekRecord(
            keyring=self.name,
            version=version,
            kek_id=self.wrapper.kek_id,
            wrapped=base64.b64encode(self.wrapper.wrap(dek)).decode(),
            created_at=now,
        )
        data = record.model_dump_json(indent=2).encode()
        try:
            self.store.put(self._key(version), data, if_absent=True)
        except RecordConflictError:
            return self.record(version)  # another process rotated first: use its DEK
        log.info("keyring %s: created DEK v%d", self.name, version)
        return record

    def _retire_older(self, records: list[DekRecord], newest: DekRecord) -> None:
        """Retire every older DEK that is still current (the retirement an interrupted rotation
        left undone), at the creation time of the DEK that followed it."""
        later = {r.version: r for r in records}
        later[newest.version] = newest
        for record in records:
            if record.version >= newest.version or record.retired_at is not None:
                continue
            successor = min(
                (r for r in later.values() if r.version > record.version),
                key=lambda r: r.version,
            )
            when = successor.created_at

            def retire(current: DekRecord, when: float = when) -> DekRecord | None:
                if current.retired_at is not None:
                    return None
                return current.model_copy(update={"retired_at": when})

            self._update(record.version, retire)

    def current(self, now: float | None = None) -> Dek:
        """The DEK that encrypts new shards, rotated when `dek_rotation_hours` old (or missing,
        or revoked)."""
        now = self._clock() if now is None else now
        records = self.records()
        usable = [r for r in records if build_dek_state(r, self.policy, now) == "current"]
        newest = usable[-1] if usable else None
        if newest is None or now - newest.created_at >= self.policy.rotation_seconds:
            newest = self._create(max((r.version for r in records), default=0) + 1, now)
        self._retire_older(records, newest)
        return self._unwrap(newest)

    def rotate(self, now: float | None = None) -> DekRecord:
        """Make a new current DEK now, whatever the age of the last one; retire the old."""
        now = self._clock() if now is None else now
        records = self.records()
        created = self._create(max((r.version for r in records), default=0) + 1, now)
        self._retire_older(records, created)
        return created

    def dek_for_decrypt(self, version: int, now: float | None = None) -> Dek:
        """The DEK of `version` for decryption; DekRevokedError / DekExpiredError when it may
        decrypt nothing any more."""
        now = self._clock() if now is None else now
        record = self.record(version)
        state = build_dek_state(record, self.policy, now)
        if state == "revoked":
            raise DekRevokedError(
                f"DEK {self.name!r} v{version} was revoked at {record.revoked_at:.0f}"
                + (f" ({record.revoked_reason})" if record.revoked_reason else "")
                + ": it decrypts nothing"
            )
        if state == "expired":
            assert record.retired_at is not None
            raise DekExpiredError(
                f"DEK {self.name!r} v{version} expired: retired at {record.retired_at:.0f}, "
                f"{(now - record.retired_at) / 86400.0:.1f} days ago, past the "
                f"{self.policy.dek_retention_days:g}-day retention (spec "
                "weights.dek_retention_days)"
            )
        return self._unwrap(record)

    def revoke(self, version: int, reason: str = "", now: float | None = None) -> DekRecord:
        """Revoke a DEK at once (a compromised key): nothing decrypts with it any more."""
        when = self._clock() if now is None else now

        def revoke(record: DekRecord) -> DekRecord | None:
            if record.revoked_at is not None:
                return None
            return record.model_copy(update={"revoked_at": when, "revoked_reason": reason or None})

        return self._update(version, revoke)

    def rewrap(self, new_wrapper: KeyWrapper, now: float | None = None) -> Keyring:
        """Wrap every DEK that may still decrypt with a new KEK (KEK rotation); the keyring
        that unwraps with it. Expired and revoked DEKs are left as they are."""
        now = self._clock() if now is None else now
        for record in self.records():
            if build_dek_state(record, self.policy, now) in ("expired", "revoked"):
                continue
            if record.kek_id == new_wrapper.kek_id:
                continue
            blob = base64.b64encode(new_wrapper.wrap(self._unwrap(record).key)).decode()
            kek_id = new_wrapper.kek_id

            def rewrapped(
                current: DekRecord, blob: str = blob, kek_id: str = kek_id
            ) -> DekRecord | None:
                if current.kek_id == kek_id:
                    return None
                return current.model_copy(update={"wrapped": blob, "kek_id": kek_id})

            self._update(record.version, rewrapped)
        return Keyring(self.store, new_wrapper, self.settings, self._clock, self.policy)

    def figures(
        self, shard_key_versions: Iterable[int] = (), now: float | None = None
    ) -> KeyringFigures:
        """Monitoring figures now (see `build_keyring_figures`)."""
        now = self._clock() if now is None else now
        return build_keyring_figures(self.records(), self.policy, now, shard_key_versions)
