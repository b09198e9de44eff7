"""Snapshot registry of models and LoRA adapters: JSON records in a record store and an active
pointer.

The records go through a `RecordStore` (`redline.platform.weights.records`): by default a
`FileRecordStore` under `root`, where every file is written to a temp file in the same directory,
fsynced, then moved into place with `os.replace`, and the directory is fsynced, so a reader sees
the old file or the new one, never a half-written one; or any other store, such as
`S3RecordStore` (`redline.platform.weights.s3store`), through `SnapshotRegistry.on_store`.
Keys (and the file layout under `root`):

    models/<model>/snapshots/<snapshot_id>.json   one snapshot (immutable but for
                                                   `mark_verified`)
    models/<model>/active.json                     the active pointer
    models/<model>/sequence.json                   the last sequence handed out
    models/<model>/.lock                           writers' lock (flock; file store only)
    checkpoints/<adapter>.json                     last successful checkpoint of an adapter

`<model>` and `<adapter>` are percent-encoded, so ids such as `org/name` are safe.

`ActiveVersions` reads the active pointers through a short cache: the `model_version` of
requests, golden answers and evaluation verdicts when no engine reports one.

Concurrency: every write takes the store's lock of the model (or the checkpoints) — for the file
store an exclusive `fcntl.flock` on its lock file, so several processes on one host may write
safely — and every read-modify-write is a conditional write on the version it read, which is what
makes object storage safe without a lock: two writers racing to move the active pointer, one
wins, the other gets `SnapshotConflictError`. Reads take no lock because every record is replaced
atomically. flock is not reliable across hosts on network file systems: run one writer per model
there, or use object storage.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.platform.weights.errors import RecordConflictError, RecordStoreError
from redline.platform.weights.records import FileRecordStore, RecordStore, write_bytes_atomic

log = logging.getLogger(__name__)

FORMAT = 1
_CHUNK = 1 << 20
_VERSION_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_ATTEMPTS = 8
"""Read-modify-write attempts before a writer gives up on a record others keep changing."""


class SnapshotError(Exception):
    """Base class of the registry's errors."""


class SnapshotNotFoundError(SnapshotError):
    """A snapshot, model or file that the caller named does not exist."""


class SnapshotCorruptError(SnapshotError):
    """A registry file exists but is not a valid snapshot, pointer or checkpoint record."""


class SnapshotIntegrityError(SnapshotError):
    """The weights or config on disk no longer match the hashes recorded in the snapshot."""


class SnapshotConflictError(SnapshotError):
    """Another writer changed the record (the active pointer, say) between our read and write."""


class SnapshotStoreError(SnapshotError):
    """The record store refused a write (object storage down, access denied)."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


R = TypeVar("R", bound=_Record)
_V = TypeVar("_V")


class Baselines(_Record):
    """What a version measured when it was verified; the rollback gate compares against it."""

    p99_seconds: float = Field(gt=0, description="P99 latency (s) of the version when verified.")
    accuracy_ratio: float = Field(ge=0, le=1, description="Golden-set accuracy when verified.")
    samples: int | None = Field(None, ge=0, description="Requests the baselines were measured on.")
    reference_answers: dict[str, str] = Field(
        default_factory=dict, description="Golden-set prompt id -> the version's reference answer."
    )


class Snapshot(_Record):
    """One recorded model or adapter version with the hashes of its files."""

    format: int = Field(FORMAT, description="Record format version.")
    snapshot_id: str = Field(description="Unique within the model; the file name.")
    sequence: int = Field(ge=1, description="Creation order within the model (newest highest).")
    model: str = Field(min_length=1, description="Served model name (the `model` label).")
    version: str = Field(min_length=1, description="Version (the `model_version` label).")
    adapter: str | None = Field(None, description="LoRA adapter name, when this is an adapter.")
    weights_path: str = Field(description="Absolute path of the weights file or directory.")
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    config_path: str = Field(description="Absolute path of the config file or directory.")
    config_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: float = Field(description="Unix time of creation.")
    verified_at: float | None = Field(None, description="Unix time it was last marked verified.")
    baselines: Baselines | None = Field(None, description="Recorded when marked verified.")

    @property
    def verified(self) -> bool:
        """True once the snapshot was marked verified (with baselines)."""
        return self.verified_at is not None and self.baselines is not None


class ActivePointer(_Record):
    """Which snapshot a model serves, since when, and which one it replaced."""

    format: int = FORMAT
    model: str
    snapshot_id: str
    activated_at: float
    previous_snapshot_id: str | None = None


class Checkpoint(_Record):
    """The last successful checkpoint of a LoRA adapter."""

    format: int = FORMAT
    adapter: str
    last_success: float
    path: str | None = None


class _Sequence(_Record):
    format: int = FORMAT
    model: str
    last: int = Field(ge=0)


def hash_path(path: Path) -> str:
    """SHA-256 of a file, or of a directory as sorted `relpath NUL sha256 LF` lines of its files."""
    if path.is_dir():
        digest = hashlib.sha256()
        files = sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            relative = file.relative_to(path).as_posix()
            digest.update(f"{relative}\0{_hash_file(file)}\n".encode())
        return digest.hexdigest()
    return _hash_file(path)


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _encode(name: str) -> str:
    if not name:
        raise SnapshotError("model and adapter names must not be empty")
    encoded = quote(name, safe="")
    # A leading dot would name a hidden file (temp and lock files) or, as "..", escape the root.
    return "%2E" + encoded[1:] if encoded.startswith(".") else encoded


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    """Write JSON to a temp file beside `path`, fsync it, `os.replace` it, fsync the directory."""
    write_bytes_atomic(path, _dump(data))


def _dump(data: Mapping[str, object]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _decode(raw: bytes, where: str, kind: type[R], what: str) -> R:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SnapshotCorruptError(f"{where}: cannot read {what}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SnapshotCorruptError(f"{where}: corrupt {what}: malformed JSON: {exc}") from None
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SnapshotCorruptError(f"{where}: corrupt {what}: {problems}") from None


class SnapshotRegistry:
    """Durable registry of model/adapter snapshots, active pointers and checkpoints: files under
    `root`, or any record store through `on_store`."""

    def __init__(
        self,
        root: Path | None = None,
        clock: Callable[[], float] = time.time,
        *,
        store: RecordStore | None = None,
    ) -> None:
        if (root is None) == (store is None):
            raise ValueError("SnapshotRegistry needs a root directory or a record store (one)")
        self.root = Path(root) if root is not None else None
        self._store: RecordStore
        if store is not None:
            self._store = store
        elif self.root is not None:
            self._store = FileRecordStore(self.root)
        self._now = clock

    @classmethod
    def on_store(
        cls, store: RecordStore, clock: Callable[[], float] = time.time
    ) -> SnapshotRegistry:
        """A registry whose records live in `store` (object storage, say); `root` is None."""
        return cls(None, clock, store=store)

    @property
    def store(self) -> RecordStore:
        """The record store holding the registry's records."""
        return self._store

    # ---- keys and records --------------------------------------------------------------------

    def _model_scope(self, model: str) -> str:
        return f"models/{_encode(model)}"

    def _snapshot_key(self, model: str, snapshot_id: str) -> str:
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            raise SnapshotNotFoundError(f"{snapshot_id!r} is not a snapshot id")
        return f"{self._model_scope(model)}/snapshots/{snapshot_id}.json"

    def _active_key(self, model: str) -> str:
        return f"{self._model_scope(model)}/active.json"

    def _raw(self, key: str, what: str) -> tuple[bytes, str] | None:
        try:
            return self._store.get(key)
        except RecordStoreError as exc:
            raise SnapshotCorruptError(f"cannot read {what}: {exc}") from None

    def _read(self, key: str, kind: type[R], what: str) -> tuple[R, str] | None:
        found = self._raw(key, what)
        if found is None:
            return None
        return _decode(found[0], self._store.where(key), kind, what), found[1]

    def _put(
        self, key: str, record: _Record, *, if_version: str | None = None, if_absent: bool = False
    ) -> None:
        data = _dump(record.model_dump(mode="json"))
        try:
            self._store.put(key, data, if_version=if_version, if_absent=if_absent)
        except RecordConflictError:
            raise
        except RecordStoreError as exc:
            raise SnapshotStoreError(str(exc)) from None

    def _conflict(self, key: str, what: str) -> SnapshotConflictError:
        return SnapshotConflictError(
            f"{self._store.where(key)}: {what} kept changing under concurrent writers "
            f"({_ATTEMPTS} attempts); try again"
        )

    # ---- snapshots ---------------------------------------------------------------------------

    def models(self) -> builtins.list[str]:
        """Every model with at least a snapshot directory, sorted."""
        try:
            names = self._store.children("models/")
        except RecordStoreError as exc:
            raise SnapshotCorruptError(f"cannot list models: {exc}") from None
        return sorted(unquote(name) for name in names)

    def _next_sequence(self, model: str) -> int:
        """Claim the model's next sequence (a conditional write of the counter, so writers
        without a shared lock, on object storage, never share one)."""
        key = f"{self._model_scope(model)}/sequence.json"
        for _ in range(_ATTEMPTS):
            found = self._raw(key, "sequence counter")
            last, token = 0, None
            if found is not None:
                token = found[1]
                try:
                    last = _decode(found[0], self._store.where(key), _Sequence, "counter").last
                except SnapshotCorruptError as exc:
                    # The snapshots themselves say where the count is: never block on the counter.
                    log.warning("rebuilding the sequence counter: %s", exc)
            existing, _ = self.scan(model)
            sequence = max(last, max((s.sequence for s in existing), default=0)) + 1
            try:
                self._put(
                    key,
                    _Sequence(model=model, last=sequence),
                    if_version=token,
                    if_absent=token is None,
                )
            except RecordConflictError:
                continue
            return sequence
        raise self._conflict(key, "the sequence counter")

    def create(
        self,
        model: str,
        version: str,
        weights_path: Path,
        config_path: Path,
        adapter: str | None = None,
        created_at: float | None = None,
    ) -> Snapshot:
        """Hash the weights and config and record a new snapshot; the same content is idempotent."""
        weights = Path(weights_path).resolve()
        config = Path(config_path).resolve()
        for label, path in (("weights", weights), ("config", config)):
            if not path.exists():
                raise SnapshotNotFoundError(f"{label} path {path} does not exist")
        weights_sha = hash_path(weights)
        config_sha = hash_path(config)
        identity = hashlib.sha256(
            f"{model}\0{adapter or ''}\0{version}\0{weights_sha}\0{config_sha}".encode()
        ).hexdigest()
        slug = _VERSION_SLUG.sub("-", version).strip("-.") or "v"
        snapshot_id = f"{slug}-{identity[:10]}"
        key = self._snapshot_key(model, snapshot_id)
        with self._store.lock(self._model_scope(model)):
            found = self._read(key, Snapshot, "snapshot")
            if found is not None:
                return found[0]
            snapshot = Snapshot(
                snapshot_id=snapshot_id,
                sequence=self._next_sequence(model),
                model=model,
                version=version,
                adapter=adapter,
                weights_path=str(weights),
                weights_sha256=weights_sha,
                config_path=str(config),
                config_sha256=config_sha,
                created_at=self._now() if created_at is None else created_at,
            )
            try:
                self._put(key, snapshot, if_absent=True)
            except RecordConflictError:
                # The same content was recorded concurrently (no shared lock on object storage).
                found = self._read(key, Snapshot, "snapshot")
                if found is None:
                    raise self._conflict(key, "the snapshot") from None
                return found[0]
        return snapshot

    def _get(self, model: str, snapshot_id: str) -> tuple[Snapshot, str]:
        key = self._snapshot_key(model, snapshot_id)
        found = self._read(key, Snapshot, "snapshot")
        if found is None:
            raise SnapshotNotFoundError(f"{self._store.where(key)}: no such snapshot")
        snapshot = found[0]
        if snapshot.model != model or snapshot.snapshot_id != snapshot_id:
            raise SnapshotCorruptError(
                f"{self._store.where(key)}: records model {snapshot.model!r} "
                f"snapshot {snapshot.snapshot_id!r}, expected {model!r} {snapshot_id!r}"
            )
        return found

    def get(self, model: str, snapshot_id: str) -> Snapshot:
        """One snapshot; SnapshotNotFoundError or SnapshotCorruptError naming the file."""
        return self._get(model, snapshot_id)[0]

    def scan(
        self, model: str
    ) -> tuple[builtins.list[Snapshot], builtins.list[SnapshotCorruptError]]:
        """Every readable snapshot of `model` (newest first) and the errors of unreadable ones."""
        prefix = f"{self._model_scope(model)}/snapshots/"
        snapshots: builtins.list[Snapshot] = []
        errors: builtins.list[SnapshotCorruptError] = []
        try:
            keys = self._store.list(prefix)
        except RecordStoreError as exc:
            return snapshots, [SnapshotCorruptError(f"cannot list snapshots: {exc}")]
        for key in keys:
            name = key[len(prefix) :]
            if "/" in name or not name.endswith(".json"):
                continue
            try:
                snapshots.append(self.get(model, name.removesuffix(".json")))
            except SnapshotCorruptError as exc:
                errors.append(exc)
            except SnapshotNotFoundError:
                continue  # deleted while listing
        snapshots.sort(key=lambda s: s.sequence, reverse=True)
        return snapshots, errors

    def list(self, model: str) -> builtins.list[Snapshot]:
        """Snapshots of `model`, newest first; unreadable files are logged and skipped."""
        snapshots, errors = self.scan(model)
        for error in errors:
            log.warning("skipping unreadable snapshot: %s", error)
        return snapshots

    def check(self, snapshot: Snapshot) -> builtins.list[str]:
        """Integrity problems of a snapshot (missing files, hash mismatches); empty when intact."""
        problems: builtins.list[str] = []
        pairs = (
            ("weights", snapshot.weights_path, snapshot.weights_sha256),
            ("config", snapshot.config_path, snapshot.config_sha256),
        )
        for label, path, expected in pairs:
            try:
                actual = hash_path(Path(path))
            except OSError as exc:
                problems.append(f"{label} {path}: cannot read: {exc.strerror or exc}")
                continue
            if actual != expected:
                problems.append(
                    f"{label} {path}: sha256 {actual[:12]}... does not match the recorded "
                    f"{expected[:12]}..."
                )
        return problems

    def verify(self, snapshot: Snapshot) -> bool:
        """Recompute the weights and config hashes; True when both still match."""
        problems = self.check(snapshot)
        for problem in problems:
            log.warning("snapshot %s/%s: %s", snapshot.model, snapshot.snapshot_id, problem)
        return not problems

    def mark_verified(
        self,
        model: str,
        snapshot_id: str,
        baselines: Baselines,
        verified_at: float | None = None,
    ) -> Snapshot:
        """Record that the snapshot passed verification, with its baselines; hashes must match."""
        key = self._snapshot_key(model, snapshot_id)
        with self._store.lock(self._model_scope(model)):
            for _ in range(_ATTEMPTS):
                snapshot, token = self._get(model, snapshot_id)
                problems = self.check(snapshot)
                if problems:
                    raise SnapshotIntegrityError(
                        f"{model}/{snapshot_id} cannot be marked verified: " + "; ".join(problems)
                    )
                updated = snapshot.model_copy(
                    update={
                        "verified_at": self._now() if verified_at is None else verified_at,
                        "baselines": baselines,
                    }
                )
                try:
                    self._put(key, updated, if_version=token)
                except RecordConflictError:
                    continue
                return updated
        raise self._conflict(key, "the snapshot")

    # ---- active pointer ----------------------------------------------------------------------

    def _pointer(self, model: str, found: tuple[bytes, str]) -> ActivePointer:
        where = self._store.where(self._active_key(model))
        pointer = _decode(found[0], where, ActivePointer, "active pointer")
        if pointer.model != model:
            raise SnapshotCorruptError(
                f"{where}: points for model {pointer.model!r}, expected {model!r}"
            )
        return pointer

    def active_pointer(self, model: str) -> ActivePointer | None:
        """The model's active pointer, or None when nothing was activated yet."""
        found = self._raw(self._active_key(model), "active pointer")
        return None if found is None else self._pointer(model, found)

    def active(self, model: str) -> Snapshot | None:
        """The snapshot the model serves, or None; an error if the pointer names a lost file."""
        pointer = self.active_pointer(model)
        if pointer is None:
            return None
        try:
            return self.get(model, pointer.snapshot_id)
        except SnapshotNotFoundError:
            raise SnapshotNotFoundError(
                f"{self._store.where(self._active_key(model))}: active snapshot "
                f"{pointer.snapshot_id!r} of {model!r} is missing"
            ) from None

    def activate(
        self, model: str, snapshot_id: str, verify: bool = True, when: float | None = None
    ) -> ActivePointer:
        """Atomically point the model at a snapshot (hashes checked first unless verify=False);
        SnapshotConflictError when another writer moved the pointer meanwhile."""
        key = self._active_key(model)
        with self._store.lock(self._model_scope(model)):
            snapshot = self.get(model, snapshot_id)
            if verify:
                problems = self.check(snapshot)
                if problems:
                    raise SnapshotIntegrityError(
                        f"{model}/{snapshot_id} cannot be activated: " + "; ".join(problems)
                    )
            found = self._raw(key, "active pointer")
            current = None
            if found is not None:
                try:
                    current = self._pointer(model, found)
                except SnapshotCorruptError as exc:
                    # A broken pointer must not block switching to a good snapshot (it is the fix).
                    log.warning("replacing an unreadable active pointer: %s", exc)
            if current is not None and current.snapshot_id == snapshot_id:
                return current  # idempotent: already active
            pointer = ActivePointer(
                model=model,
                snapshot_id=snapshot_id,
                activated_at=self._now() if when is None else when,
                previous_snapshot_id=current.snapshot_id if current else None,
            )
            token = None if found is None else found[1]
            try:
                self._put(key, pointer, if_version=token, if_absent=token is None)
            except RecordConflictError:
                # Never retry over another writer's switch: it decided with what it knew.
                winner = self.active_pointer(model)
                if winner is not None and winner.snapshot_id == snapshot_id:
                    return winner
                raise SnapshotConflictError(
                    f"{self._store.where(key)}: another writer moved the active pointer of "
                    f"{model!r} (to {winner.snapshot_id if winner else None!r}) while "
                    f"{snapshot_id!r} was being activated; read it again before retrying"
                ) from None
        return pointer

    def previous_verified(self, model: str, before: str | None = None) -> Snapshot | None:
        """Newest verified snapshot older than `before` (default: the active one) whose hashes
        still match; None when there is none."""
        reference = before
        if reference is None:
            pointer = self.active_pointer(model)
            reference = pointer.snapshot_id if pointer else None
        snapshots = self.list(model)
        limit = None
        if reference is not None:
            limit = self.get(model, reference).sequence
        for snapshot in snapshots:
            if limit is not None and snapshot.sequence >= limit:
                continue
            if not snapshot.verified:
                continue
            if self.verify(snapshot):
                return snapshot
            log.warning("skipping %s/%s: its files changed", model, snapshot.snapshot_id)
        return None

    # ---- checkpoints -------------------------------------------------------------------------

    def record_checkpoint(
        self, adapter: str, when: float | None = None, path: Path | None = None
    ) -> Checkpoint:
        """Record a successful checkpoint of an adapter (never moves the time backwards)."""
        key = f"checkpoints/{_encode(adapter)}.json"
        timestamp = self._now() if when is None else when
        with self._store.lock("checkpoints"):
            for _ in range(_ATTEMPTS):
                found = self._read(key, Checkpoint, "checkpoint record")
                if found is not None and found[0].last_success >= timestamp:
                    return found[0]
                record = Checkpoint(
                    adapter=adapter,
                    last_success=timestamp,
                    path=str(Path(path).resolve()) if path is not None else None,
                )
                token = None if found is None else found[1]
                try:
                    self._put(key, record, if_version=token, if_absent=token is None)
                except RecordConflictError:
                    continue
                return record
        raise self._conflict(key, "the checkpoint record")

    def checkpoints(self) -> builtins.list[Checkpoint]:
        """The last checkpoint of every adapter, by adapter name; corrupt records raise."""
        prefix = "checkpoints/"
        try:
            keys = self._store.list(prefix)
        except RecordStoreError as exc:
            raise SnapshotCorruptError(f"cannot list checkpoint records: {exc}") from None
        records = []
        for key in keys:
            if "/" in key[len(prefix) :] or not key.endswith(".json"):
                continue
            found = self._read(key, Checkpoint, "checkpoint record")
            if found is not None:
                records.append(found[0])
        return sorted(records, key=lambda r: r.adapter)


UNKNOWN_VERSION = "unknown"
"""The `model_version` label of a request whose version nobody can tell."""

_UNSAFE_MODELS = frozenset({".", ".."})


class ActiveVersions:
    """The version each model serves, read from the registry's active pointer and cached.

    This is where `model_version` labels come from when no engine says it (vLLM, SGLang, TGI send
    no version): redline loads and rolls back adapters, so the active pointer is the truth. Each
    model's answer is kept `ttl_seconds`, so a hot path (the gateway) reads two small files per
    model at most once per TTL, never per request; a rollback shows within one TTL. Reads take no
    lock (the registry replaces files atomically). A corrupt pointer reads as the last good value
    (else "unknown") and is logged, so a broken file never fails a request.
    """

    def __init__(
        self,
        registry: SnapshotRegistry,
        ttl_seconds: float = 1.0,
        max_models: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_seconds < 0:
            raise ValueError(f"ttl_seconds must be >= 0, got {ttl_seconds}")
        self.registry = registry
        self.ttl_seconds = ttl_seconds
        self.max_models = max_models
        self._clock = clock
        self._active: dict[str, tuple[str, float]] = {}
        self._known: dict[str, tuple[frozenset[str], float]] = {}
        self._models: tuple[builtins.list[str], float] | None = None

    def _fresh(self, expires: float) -> bool:
        return self._clock() < expires

    def _remember(self, cache: dict[str, tuple[_V, float]], model: str, value: _V) -> None:
        if len(cache) >= self.max_models and model not in cache:
            # Clients name models freely (the gateway's `model`): never let that grow unbounded.
            cache.clear()
        cache[model] = (value, self._clock() + self.ttl_seconds)

    def version(self, model: str) -> str:
        """The version of the model's active snapshot; "unknown" when it has none."""
        cached = self._active.get(model)
        if cached is not None and self._fresh(cached[1]):
            return cached[0]
        version = UNKNOWN_VERSION
        if model and model not in _UNSAFE_MODELS:
            try:
                active = self.registry.active(model)
            except SnapshotError as exc:
                log.warning("active version of %r unreadable: %s", model, exc)
                version = cached[0] if cached is not None else UNKNOWN_VERSION
            else:
                version = active.version if active is not None else UNKNOWN_VERSION
        self._remember(self._active, model, version)
        return version

    def resolve(self, model: str, reported: str | None = None) -> str:
        """The registry's version of `model`; else the one the server reported; else "unknown"."""
        version = self.version(model)
        if version != UNKNOWN_VERSION:
            return version
        return reported or UNKNOWN_VERSION

    def known(self, model: str) -> frozenset[str]:
        """Every version the registry holds a snapshot of for `model` (readable ones)."""
        cached = self._known.get(model)
        if cached is not None and self._fresh(cached[1]):
            return cached[0]
        versions: frozenset[str] = frozenset()
        if model and model not in _UNSAFE_MODELS:
            snapshots, errors = self.registry.scan(model)
            for error in errors:
                log.warning("skipping unreadable snapshot: %s", error)
            versions = frozenset(s.version for s in snapshots)
        self._remember(self._known, model, versions)
        return versions

    def models(self) -> builtins.list[str]:
        """The models the registry knows (those with a snapshot directory), sorted."""
        if self._models is not None and self._fresh(self._models[1]):
            return self._models[0]
        models = self.registry.models()
        self._models = (models, self._clock() + self.ttl_seconds)
        return models
