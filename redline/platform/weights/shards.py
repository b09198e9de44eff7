"""Encrypted weight shards: the writer, the manifest, full and incremental verification, loading.

A weights file is cut into fixed-size plaintext shards (`ShardSettings.shard_size`, 4 MiB by
default). Each is encrypted with AES-256-GCM under the keyring's current DEK, with a fresh
96-bit random nonce and, as associated data, the weights name, the shard id and the DEK version,
so a shard moved to another place or relabelled with another key fails its tag check. A shard
object is `MAGIC | nonce (12) | ciphertext | tag (16)`.

Keys (in any record store; `S3RecordStore` in production):

    weights/<name>/shards/<plaintext sha256>-v<key version>   one shard (content-addressed: an
                                                              unchanged shard is not re-uploaded)
    weights/<name>/manifests/<version>.json                   the manifest (written once, last)
    weights/<name>/verdicts/<version>.json                    the last verification's report

Nothing is half-written: the shards are uploaded first and the manifest last, with
`if_absent`, so a version exists only once its manifest is complete; an interrupted upload
leaves shards that nothing names (and that the retry reuses).

Verification returns what it checked. Full: every shard fetched, its size and ciphertext sha256
compared, its DEK unwrapped (expired and revoked DEKs refused), the GCM tag verified, the
plaintext sha256 compared, and the whole file's sha256 recomputed. Incremental: only the shards
whose plaintext hash (so shard id) changed since the previous verified version are checked so;
the verdict of the unchanged ones is reused, after a HeadObject-sized `digest` confirms the
object still holds the bytes that were verified (an overwrite shows; no download, no decrypt).
The whole-file hash is recomputed on full verification and on every load.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import unquote

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from redline.platform.weights.errors import (
    KeyringError,
    KeyWrapError,
    ManifestError,
    RecordConflictError,
    ShardIntegrityError,
)
from redline.platform.weights.keyring import Dek, Keyring
from redline.platform.weights.records import RecordStore, encode_part, sha256_hex
from redline.platform.weights.settings import ShardSettings

log = logging.getLogger(__name__)

FORMAT = 1
MAGIC = b"RLS1"
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = len(MAGIC) + NONCE_BYTES + TAG_BYTES
_SHA = r"^[0-9a-f]{64}$"


class ByteSource(Protocol):
    """What `write_shards` reads from besides a path: a binary stream (a file, a socket)."""

    def read(self, size: int, /) -> bytes:
        """Up to `size` bytes; b"" at the end."""
        ...


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShardEntry(_Model):
    """One shard of a weights file, in file order."""

    index: int = Field(ge=0)
    offset: int = Field(ge=0, description="Plaintext offset in the file.")
    size: int = Field(ge=1, description="Plaintext bytes.")
    shard_id: str = Field(pattern=r"^[0-9a-f]{64}-v[1-9][0-9]*$")
    key_version: int = Field(ge=1, description="DEK version that encrypted it.")
    plaintext_sha256: str = Field(pattern=_SHA)
    ciphertext_sha256: str = Field(pattern=_SHA, description="sha256 of the whole shard object.")
    ciphertext_size: int = Field(ge=OVERHEAD + 1)

    @model_validator(mode="after")
    def _consistent(self) -> ShardEntry:
        if self.shard_id != build_shard_id(self.plaintext_sha256, self.key_version):
            raise ValueError(f"shard {self.index}: shard_id does not match its hash and key")
        if self.ciphertext_size != self.size + OVERHEAD:
            raise ValueError(f"shard {self.index}: ciphertext_size is not size + {OVERHEAD}")
        return self


class ShardManifest(_Model):
    """Every shard of one version of a weights file, and the whole file's hash."""

    format: int = FORMAT
    name: str = Field(min_length=1, description="Weights name (model or adapter).")
    version: str = Field(min_length=1)
    keyring: str = Field(min_length=1)
    shard_size: int = Field(ge=1)
    total_size: int = Field(ge=0)
    weights_sha256: str = Field(pattern=_SHA, description="sha256 of the whole plaintext file.")
    created_at: float
    shards: list[ShardEntry]

    @model_validator(mode="after")
    def _contiguous(self) -> ShardManifest:
        offset = 0
        for position, entry in enumerate(self.shards):
            if entry.index != position or entry.offset != offset:
                raise ValueError(f"shard {position}: index/offset out of order")
            last = position == len(self.shards) - 1
            if entry.size > self.shard_size or (not last and entry.size != self.shard_size):
                raise ValueError(f"shard {position}: size {entry.size} breaks shard_size")
            offset += entry.size
        if offset != self.total_size:
            raise ValueError(f"shards cover {offset} bytes, total_size is {self.total_size}")
        return self

    def key_versions(self) -> list[int]:
        """The DEK version of every distinct shard object (for the keyring figures)."""
        return [e.key_version for e in {e.shard_id: e for e in self.shards}.values()]


class VerificationReport(_Model):
    """What one verification checked, what it reused, and what it found."""

    format: int = FORMAT
    name: str
    version: str
    mode: Literal["full", "incremental"]
    manifest_sha256: str = Field(pattern=_SHA)
    verified_at: float
    base_version: str | None = Field(None, description="The version whose verdicts were reused.")
    checked: list[str] = Field(description="Shard ids fetched, decrypted and hashed now.")
    reused: list[str] = Field(description="Shard ids whose earlier verdict was reused.")
    weights_sha256_checked: bool
    problems: list[str]

    @property
    def ok(self) -> bool:
        """True when nothing was wrong."""
        return not self.problems


# ---- keys and pure helpers ------------------------------------------------------------------


def build_shard_id(plaintext_sha256: str, key_version: int) -> str:
    """The content address of a shard: its plaintext hash and DEK version."""
    return f"{plaintext_sha256}-v{key_version}"


def shard_key(name: str, shard_id: str) -> str:
    """The record key of a shard object."""
    return f"weights/{encode_part(name)}/shards/{shard_id}"


def manifest_key(name: str, version: str) -> str:
    """The record key of a version's manifest."""
    return f"weights/{encode_part(name)}/manifests/{encode_part(version)}.json"


def verdict_key(name: str, version: str) -> str:
    """The record key of a version's last verification report."""
    return f"weights/{encode_part(name)}/verdicts/{encode_part(version)}.json"


def build_aad(name: str, shard_id: str, key_version: int) -> bytes:
    """The associated data bound into a shard's GCM tag."""
    return f"redline-shard/{FORMAT}\0{name}\0{shard_id}\0{key_version}".encode()


def encrypt_shard(dek: Dek, name: str, plaintext: bytes) -> tuple[str, bytes]:
    """The shard id and object bytes of one plaintext shard (a fresh random nonce)."""
    shard_id = build_shard_id(sha256_hex(plaintext), dek.version)
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = AESGCM(dek.key).encrypt(nonce, plaintext, build_aad(name, shard_id, dek.version))
    return shard_id, MAGIC + nonce + sealed


def decrypt_shard(dek: Dek, name: str, entry: ShardEntry, blob: bytes, where: str) -> bytes:
    """Check one shard object against its manifest entry and decrypt it; ShardIntegrityError
    naming `where` (the object key) on any mismatch."""
    if len(blob) != entry.ciphertext_size:
        state = "truncated" if len(blob) < entry.ciphertext_size else "longer than recorded"
        raise ShardIntegrityError(
            f"{where}: shard {entry.index} is {state}: {len(blob)} of "
            f"{entry.ciphertext_size} bytes",
            where,
        )
    if sha256_hex(blob) != entry.ciphertext_sha256:
        raise ShardIntegrityError(
            f"{where}: shard {entry.index} was altered: its ciphertext sha256 does not match "
            "the manifest",
            where,
        )
    if not blob.startswith(MAGIC):
        raise ShardIntegrityError(f"{where}: shard {entry.index} is no redline shard", where)
    nonce = blob[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    aad = build_aad(name, entry.shard_id, entry.key_version)
    try:
        plaintext = AESGCM(dek.key).decrypt(nonce, blob[len(MAGIC) + NONCE_BYTES :], aad)
    except InvalidTag:
        raise ShardIntegrityError(
            f"{where}: shard {entry.index} failed its AES-GCM tag check (tampered, or not "
            f"encrypted under DEK v{entry.key_version} for this name and shard id)",
            where,
        ) from None
    if sha256_hex(plaintext) != entry.plaintext_sha256:
        raise ShardIntegrityError(
            f"{where}: shard {entry.index} decrypts to a plaintext whose sha256 does not match",
            where,
        )
    return plaintext


def build_manifest_sha256(manifest: ShardManifest) -> str:
    """The sha256 of the manifest's canonical JSON (what a verdict is tied to)."""
    return sha256_hex(manifest.model_dump_json().encode())


# ---- the writer -----------------------------------------------------------------------------


def _chunks(handle: ByteSource, size: int) -> Iterator[bytes]:
    while chunk := handle.read(size):
        yield chunk


def _existing_matches(
    store: RecordStore, key: str, name: str, dek: Dek, plain_sha: str
) -> tuple[str, int] | None:
    """(ciphertext sha256, size) of an existing object that decrypts to the same plaintext."""
    found = store.get(key)
    if found is None:
        return None
    blob = found[0]
    entry_sha = sha256_hex(blob)
    probe = ShardEntry.model_construct(
        index=0,
        offset=0,
        size=len(blob) - OVERHEAD,
        shard_id=build_shard_id(plain_sha, dek.version),
        key_version=dek.version,
        plaintext_sha256=plain_sha,
        ciphertext_sha256=entry_sha,
        ciphertext_size=len(blob),
    )
    try:
        decrypt_shard(dek, name, probe, blob, store.where(key))
    except ShardIntegrityError as exc:
        log.warning("replacing a damaged shard object: %s", exc)
        return None
    return entry_sha, len(blob)


def write_shards(
    store: RecordStore,
    keyring: Keyring,
    name: str,
    version: str,
    source: Path | ByteSource,
    *,
    settings: ShardSettings | None = None,
    base: ShardManifest | None = None,
    now: float | None = None,
) -> ShardManifest:
    """Encrypt `source` (a file, or a binary stream read to its end) into shards under the
    current DEK, upload the missing ones, then the manifest (once: ManifestError if the version
    has one). Shards already in `base` (an earlier version) or in the store are not uploaded
    again."""
    settings = settings or ShardSettings()
    now = time.time() if now is None else now
    key = manifest_key(name, version)
    if store.get(key) is not None:
        raise ManifestError(f"{store.where(key)}: version {version!r} of {name!r} exists already")
    dek = keyring.current(now)
    known = {e.shard_id: e for e in base.shards} if base is not None else {}
    done: dict[str, tuple[str, int]] = {}
    entries: list[ShardEntry] = []
    whole = hashlib.sha256()
    offset = 0
    uploaded = 0
    with (
        source.open("rb") if isinstance(source, Path) else contextlib.nullcontext(source) as handle
    ):
        for index, chunk in enumerate(_chunks(handle, settings.shard_size)):
            whole.update(chunk)
            plain_sha = sha256_hex(chunk)
            shard_id = build_shard_id(plain_sha, dek.version)
            object_key = shard_key(name, shard_id)
            if shard_id not in done:
                previous = known.get(shard_id)
                if previous is not None and store.digest(object_key) == previous.ciphertext_sha256:
                    done[shard_id] = (previous.ciphertext_sha256, previous.ciphertext_size)
                else:
                    done[shard_id] = _upload(store, object_key, name, dek, chunk, plain_sha)
                    uploaded += 1
            cipher_sha, cipher_size = done[shard_id]
            entries.append(
                ShardEntry(
                    index=index,
                    offset=offset,
                    size=len(chunk),
                    shard_id=shard_id,
                    key_version=dek.version,
                    plaintext_sha256=plain_sha,
                    ciphertext_sha256=cipher_sha,
                    ciphertext_size=cipher_size,
                )
            )
            offset += len(chunk)
    manifest = ShardManifest(
        name=name,
        version=version,
        keyring=keyring.name,
        shard_size=settings.shard_size,
        total_size=offset,
        weights_sha256=whole.hexdigest(),
        created_at=now,
        shards=entries,
    )
    try:
        store.put(key, manifest.model_dump_json(indent=1).encode(), if_absent=True)
    except RecordConflictError:
        raise ManifestError(
            f"{store.where(key)}: version {version!r} of {name!r} was written concurrently"
        ) from None
    log.info(
        "%s %s: %d shards, %d uploaded, %d reused",
        name,
        version,
        len(entries),
        uploaded,
        len(entries) - uploaded,
    )
    return manifest


def _upload(
    store: RecordStore, key: str, name: str, dek: Dek, chunk: bytes, plain_sha: str
) -> tuple[str, int]:
    shard_id, blob = encrypt_shard(dek, name, chunk)
    try:
        store.put(key, blob, if_absent=True)
    except RecordConflictError:
        # Content-addressed: an earlier upload (an interrupted run, another version) has it.
        existing = _existing_matches(store, key, name, dek, plain_sha)
        if existing is not None:
            return existing
        store.put(key, blob)  # a damaged object: a new version over it
    return sha256_hex(blob), len(blob)


# ---- reading and verifying ------------------------------------------------------------------


def load_manifest(store: RecordStore, name: str, version: str) -> ShardManifest:
    """A version's manifest; ManifestError naming the key when missing or malformed."""
    key = manifest_key(name, version)
    found = store.get(key)
    if found is None:
        raise ManifestError(f"{store.where(key)}: no manifest for {name!r} version {version!r}")
    try:
        manifest = ShardManifest.model_validate_json(found[0])
    except ValidationError as exc:
        raise ManifestError(f"{store.where(key)}: malformed manifest: {exc}") from None
    if manifest.name != name or manifest.version != version:
        raise ManifestError(
            f"{store.where(key)}: is the manifest of {manifest.name!r} {manifest.version!r}"
        )
    return manifest


def list_versions(store: RecordStore, name: str) -> list[str]:
    """The versions of `name` that have a manifest (so are complete), unordered by time."""
    prefix = f"weights/{encode_part(name)}/manifests/"
    return [
        unquote(key[len(prefix) : -len(".json")])
        for key in store.list(prefix)
        if key.endswith(".json") and "/" not in key[len(prefix) :]
    ]


class _DekCache:
    """The DEKs one read unwraps (once per version per read, through the keyring)."""

    def __init__(self, keyring: Keyring, now: float) -> None:
        self._keyring = keyring
        self._now = now
        self._deks: dict[int, Dek] = {}

    def get(self, version: int) -> Dek:
        if version not in self._deks:
            self._deks[version] = self._keyring.dek_for_decrypt(version, self._now)
        return self._deks[version]


def _read_entry(
    store: RecordStore, deks: _DekCache, manifest: ShardManifest, entry: ShardEntry
) -> bytes:
    key = shard_key(manifest.name, entry.shard_id)
    where = store.where(key)
    found = store.get(key)
    if found is None:
        raise ShardIntegrityError(f"{where}: shard {entry.index} is missing", where)
    return decrypt_shard(deks.get(entry.key_version), manifest.name, entry, found[0], where)


def read_shard(
    store: RecordStore,
    keyring: Keyring,
    manifest: ShardManifest,
    index: int,
    now: float | None = None,
) -> bytes:
    """One shard's plaintext: its DEK unwrapped through the keyring's KEK (expired or revoked
    refused), size, hashes and GCM tag checked."""
    if not 0 <= index < len(manifest.shards):
        raise ManifestError(f"{manifest.name} {manifest.version}: no shard {index}")
    deks = _DekCache(keyring, time.time() if now is None else now)
    return _read_entry(store, deks, manifest, manifest.shards[index])


def load_weights(
    store: RecordStore,
    keyring: Keyring,
    manifest: ShardManifest,
    destination: Path,
    now: float | None = None,
) -> str:
    """Decrypt every shard into `destination` (temp file, fsync, rename: never half a file)
    and check the whole file's sha256; that sha256. ShardIntegrityError names the bad object."""
    deks = _DekCache(keyring, time.time() if now is None else now)
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    try:
        whole = hashlib.sha256()
        with os.fdopen(fd, "wb") as handle:
            for entry in manifest.shards:
                plaintext = _read_entry(store, deks, manifest, entry)
                whole.update(plaintext)
                handle.write(plaintext)
            handle.flush()
            os.fsync(handle.fileno())
        if whole.hexdigest() != manifest.weights_sha256:
            raise ShardIntegrityError(
                f"{store.where(manifest_key(manifest.name, manifest.version))}: the shards "
                "decrypt to a file whose sha256 does not match the manifest's weights_sha256",
                manifest_key(manifest.name, manifest.version),
            )
        os.replace(temp, destination)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return manifest.weights_sha256


def _check_entries(
    store: RecordStore,
    deks: _DekCache,
    manifest: ShardManifest,
    entries: list[ShardEntry],
    problems: list[str],
) -> dict[str, bytes]:
    """Fetch, decrypt and hash each distinct shard; problems appended; plaintexts by id."""
    plaintexts: dict[str, bytes] = {}
    for entry in entries:
        if entry.shard_id in plaintexts:
            continue
        try:
            plaintexts[entry.shard_id] = _read_entry(store, deks, manifest, entry)
        except (ShardIntegrityError, KeyringError, KeyWrapError) as exc:
            problems.append(f"shard {entry.index} ({entry.shard_id}): {exc}")
    return plaintexts


def verify_full(
    store: RecordStore,
    keyring: Keyring,
    manifest: ShardManifest,
    now: float | None = None,
) -> VerificationReport:
    """Check every shard (hashes, DEK, GCM tag) and the whole file's sha256."""
    now = time.time() if now is None else now
    deks = _DekCache(keyring, now)
    problems: list[str] = []
    whole = hashlib.sha256()
    complete = True
    checked: list[str] = []
    # Shards in file order, each fetched once: memory holds one shard (plus repeated ones).
    counts: dict[str, int] = {}
    for entry in manifest.shards:
        counts[entry.shard_id] = counts.get(entry.shard_id, 0) + 1
    repeated: dict[str, bytes] = {}
    for entry in manifest.shards:
        if entry.shard_id in repeated:
            whole.update(repeated[entry.shard_id])
            continue
        found = _check_entries(store, deks, manifest, [entry], problems)
        if entry.shard_id not in checked:
            checked.append(entry.shard_id)
        plaintext = found.get(entry.shard_id)
        if plaintext is None:
            complete = False
            continue
        whole.update(plaintext)
        if counts[entry.shard_id] > 1:
            repeated[entry.shard_id] = plaintext
    if complete and whole.hexdigest() != manifest.weights_sha256:
        problems.append("the shards decrypt to a file whose sha256 is not weights_sha256")
    return VerificationReport(
        name=manifest.name,
        version=manifest.version,
        mode="full",
        manifest_sha256=build_manifest_sha256(manifest),
        verified_at=now,
        checked=checked,
        reused=[],
        weights_sha256_checked=complete,
        problems=problems,
    )


def verify_incremental(
    store: RecordStore,
    keyring: Keyring,
    manifest: ShardManifest,
    previous: ShardManifest,
    previous_report: VerificationReport,
    now: float | None = None,
) -> VerificationReport:
    """Check only the shards that changed since `previous` (a version whose report passed);
    reuse the verdict of the others once their stored digest still matches."""
    now = time.time() if now is None else now
    if not previous_report.ok or previous_report.version != previous.version:
        raise ManifestError(
            f"{previous.name} {previous.version}: incremental verification needs a passed "
            "report of the previous version"
        )
    if previous_report.manifest_sha256 != build_manifest_sha256(previous):
        raise ManifestError(
            f"{previous.name} {previous.version}: its manifest changed since it was verified"
        )
    verified = {e.shard_id: e for e in previous.shards}
    problems: list[str] = []
    reused: list[str] = []
    changed: list[ShardEntry] = []
    seen: set[str] = set()
    for entry in manifest.shards:
        if entry.shard_id in seen:
            continue
        seen.add(entry.shard_id)
        before = verified.get(entry.shard_id)
        if before is not None and before.ciphertext_sha256 == entry.ciphertext_sha256:
            digest = store.digest(shard_key(manifest.name, entry.shard_id))
            if digest == entry.ciphertext_sha256:
                reused.append(entry.shard_id)
                continue
            log.warning("%s: changed since verified; checking it", entry.shard_id)
        changed.append(entry)
    deks = _DekCache(keyring, now)
    _check_entries(store, deks, manifest, changed, problems)
    return VerificationReport(
        name=manifest.name,
        version=manifest.version,
        mode="incremental",
        manifest_sha256=build_manifest_sha256(manifest),
        verified_at=now,
        base_version=previous.version,
        checked=[e.shard_id for e in changed],
        reused=reused,
        weights_sha256_checked=False,
        problems=problems,
    )


def write_verdict(store: RecordStore, report: VerificationReport) -> None:
    """Store a verification report (the newest replaces the last; versioning keeps them all)."""
    store.put(verdict_key(report.name, report.version), report.model_dump_json(indent=1).encode())


def load_verdict(store: RecordStore, name: str, version: str) -> VerificationReport | None:
    """A version's last verification report; None when it was never verified."""
    key = verdict_key(name, version)
    found = store.get(key)
    if found is None:
        return None
    try:
        return VerificationReport.model_validate_json(found[0])
    except ValidationError as exc:
        raise ManifestError(f"{store.where(key)}: malformed verification report: {exc}") from None


@dataclass(frozen=True)
class Selection:
    """The version to serve after a verification, and whether it is a fallback."""

    manifest: ShardManifest
    report: VerificationReport
    fell_back: bool
    failed: VerificationReport | None = None
    """The report of the candidate that failed, on a fallback."""


def select_verified(
    store: RecordStore,
    keyring: Keyring,
    name: str,
    candidate: str,
    now: float | None = None,
) -> Selection:
    """Verify `candidate` (incrementally against the newest passed version older than it, else
    in full) and record the verdict; when it fails, fall back to that last verified version.
    ManifestError when it fails and nothing verified is left."""
    now = time.time() if now is None else now
    manifest = load_manifest(store, name, candidate)
    base: tuple[ShardManifest, VerificationReport] | None = None
    for version in list_versions(store, name):
        if version == candidate:
            continue
        report = load_verdict(store, name, version)
        if report is None or not report.ok:
            continue
        older = load_manifest(store, name, version)
        if older.created_at >= manifest.created_at:
            continue
        if report.manifest_sha256 != build_manifest_sha256(older):
            continue
        if base is None or older.created_at > base[0].created_at:
            base = (older, report)
    if base is None:
        report = verify_full(store, keyring, manifest, now)
    else:
        report = verify_incremental(store, keyring, manifest, base[0], base[1], now)
    write_verdict(store, report)
    if report.ok:
        return Selection(manifest, report, fell_back=False)
    log.warning("%s %s failed verification: %s", name, candidate, "; ".join(report.problems))
    if base is None:
        raise ManifestError(
            f"{name} {candidate} failed verification and no earlier version passed: "
            + "; ".join(report.problems)
        )
    return Selection(base[0], base[1], fell_back=True, failed=report)
