"""Snapshot registry of models and LoRA adapters: atomic JSON files and an active pointer.

Layout under `root` (every file is written to a temp file in the same directory, fsynced, then
moved into place with `os.replace`, and the directory is fsynced, so a reader sees the old file or
the new one, never a half-written one):

    <root>/models/<model>/snapshots/<snapshot_id>.json   one snapshot (immutable but for
                                                          `mark_verified`)
    <root>/models/<model>/active.json                     the active pointer
    <root>/models/<model>/.lock                           writers' lock (flock)
    <root>/checkpoints/<adapter>.json                     last successful checkpoint of an adapter

`<model>` and `<adapter>` are percent-encoded, so ids such as `org/name` are safe.

`ActiveVersions` reads the active pointers through a short cache: the `model_version` of
requests, golden answers and evaluation verdicts when no engine reports one.

Concurrency: every write takes an exclusive `fcntl.flock` on the model's (or the checkpoints')
lock file, so several processes on one host may write safely; reads take no lock because every
file is replaced atomically. flock is not reliable across hosts on network file systems: run one
writer per model there.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

FORMAT = 1
_CHUNK = 1 << 20
_VERSION_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


class SnapshotError(Exception):
    """Base class of the registry's errors."""


class SnapshotNotFoundError(SnapshotError):
    """A snapshot, model or file that the caller named does not exist."""


class SnapshotCorruptError(SnapshotError):
    """A registry file exists but is not a valid snapshot, pointer or checkpoint record."""


class SnapshotIntegrityError(SnapshotError):
    """The weights or config on disk no longer match the hashes recorded in the snapshot."""


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
    return quote(name, safe="")


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    """Write JSON to a temp file beside `path`, fsync it, `os.replace` it, fsync the directory."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
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


def _read_record(path: Path, kind: type[R], what: str) -> R:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotCorruptError(f"{path}: cannot read {what}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotCorruptError(f"{path}: corrupt {what}: malformed JSON: {exc}") from None
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SnapshotCorruptError(f"{path}: corrupt {what}: {problems}") from None


class SnapshotRegistry:
    """Durable, file-based registry of model/adapter snapshots, active pointers and checkpoints."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self._now = clock

    # ---- paths -------------------------------------------------------------------------------

    def _model_dir(self, model: str) -> Path:
        return self.root / "models" / _encode(model)

    def _snapshot_path(self, model: str, snapshot_id: str) -> Path:
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            raise SnapshotNotFoundError(f"{snapshot_id!r} is not a snapshot id")
        return self._model_dir(model) / "snapshots" / f"{snapshot_id}.json"

    def _active_path(self, model: str) -> Path:
        return self._model_dir(model) / "active.json"

    def _checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @contextlib.contextmanager
    def _locked(self, directory: Path) -> Iterator[None]:
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / ".lock").open("a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    # ---- snapshots ---------------------------------------------------------------------------

    def models(self) -> builtins.list[str]:
        """Every model with at least a snapshot directory, sorted."""
        base = self.root / "models"
        if not base.is_dir():
            return []
        return sorted(unquote(entry.name) for entry in base.iterdir() if entry.is_dir())

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
        with self._locked(self._model_dir(model)):
            path = self._snapshot_path(model, snapshot_id)
            if path.exists():
                return _read_record(path, Snapshot, "snapshot")
            existing, _ = self.scan(model)
            sequence = max((s.sequence for s in existing), default=0) + 1
            snapshot = Snapshot(
                snapshot_id=snapshot_id,
                sequence=sequence,
                model=model,
                version=version,
                adapter=adapter,
                weights_path=str(weights),
                weights_sha256=weights_sha,
                config_path=str(config),
                config_sha256=config_sha,
                created_at=self._now() if created_at is None else created_at,
            )
            write_json_atomic(path, snapshot.model_dump(mode="json"))
        return snapshot

    def get(self, model: str, snapshot_id: str) -> Snapshot:
        """One snapshot; SnapshotNotFoundError or SnapshotCorruptError naming the file."""
        snapshot = _read_record(self._snapshot_path(model, snapshot_id), Snapshot, "snapshot")
        if snapshot.model != model or snapshot.snapshot_id != snapshot_id:
            raise SnapshotCorruptError(
                f"{self._snapshot_path(model, snapshot_id)}: records model {snapshot.model!r} "
                f"snapshot {snapshot.snapshot_id!r}, expected {model!r} {snapshot_id!r}"
            )
        return snapshot

    def scan(
        self, model: str
    ) -> tuple[builtins.list[Snapshot], builtins.list[SnapshotCorruptError]]:
        """Every readable snapshot of `model` (newest first) and the errors of unreadable ones."""
        directory = self._model_dir(model) / "snapshots"
        snapshots: builtins.list[Snapshot] = []
        errors: builtins.list[SnapshotCorruptError] = []
        if not directory.is_dir():
            return snapshots, errors
        for path in directory.glob("*.json"):
            if path.name.startswith("."):
                continue  # a temp file a crashed writer left behind
            try:
                snapshots.append(self.get(model, path.stem))
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
        with self._locked(self._model_dir(model)):
            snapshot = self.get(model, snapshot_id)
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
            write_json_atomic(
                self._snapshot_path(model, snapshot_id), updated.model_dump(mode="json")
            )
        return updated

    # ---- active pointer ----------------------------------------------------------------------

    def active_pointer(self, model: str) -> ActivePointer | None:
        """The model's active pointer, or None when nothing was activated yet."""
        path = self._active_path(model)
        if not path.exists():
            return None
        pointer = _read_record(path, ActivePointer, "active pointer")
        if pointer.model != model:
            raise SnapshotCorruptError(
                f"{path}: points for model {pointer.model!r}, expected {model!r}"
            )
        return pointer

    def active(self, model: str) -> Snapshot | None:
        """The snapshot the model serves, or None; an error if the pointer names a lost file."""
        pointer = self.active_pointer(model)
        if pointer is None:
            return None
        try:
            return self.get(model, pointer.snapshot_id)
        except SnapshotNotFoundError:
            raise SnapshotNotFoundError(
                f"{self._active_path(model)}: active snapshot {pointer.snapshot_id!r} of "
                f"{model!r} is missing"
            ) from None

    def activate(
        self, model: str, snapshot_id: str, verify: bool = True, when: float | None = None
    ) -> ActivePointer:
        """Atomically point the model at a snapshot (hashes checked first unless verify=False)."""
        with self._locked(self._model_dir(model)):
            snapshot = self.get(model, snapshot_id)
            if verify:
                problems = self.check(snapshot)
                if problems:
                    raise SnapshotIntegrityError(
                        f"{model}/{snapshot_id} cannot be activated: " + "; ".join(problems)
                    )
            try:
                current = self.active_pointer(model)
            except SnapshotCorruptError as exc:
                # A broken pointer must not block switching to a good snapshot (it is the fix).
                log.warning("replacing an unreadable active pointer: %s", exc)
                current = None
            if current is not None and current.snapshot_id == snapshot_id:
                return current  # idempotent: already active
            pointer = ActivePointer(
                model=model,
                snapshot_id=snapshot_id,
                activated_at=self._now() if when is None else when,
                previous_snapshot_id=current.snapshot_id if current else None,
            )
            write_json_atomic(self._active_path(model), pointer.model_dump(mode="json"))
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
        directory = self._checkpoint_dir()
        file = directory / f"{_encode(adapter)}.json"
        timestamp = self._now() if when is None else when
        with self._locked(directory):
            if file.exists():
                current = _read_record(file, Checkpoint, "checkpoint record")
                if current.last_success >= timestamp:
                    return current
            record = Checkpoint(
                adapter=adapter,
                last_success=timestamp,
                path=str(Path(path).resolve()) if path is not None else None,
            )
            write_json_atomic(file, record.model_dump(mode="json"))
        return record

    def checkpoints(self) -> builtins.list[Checkpoint]:
        """The last checkpoint of every adapter, by adapter name; corrupt records raise."""
        directory = self._checkpoint_dir()
        if not directory.is_dir():
            return []
        records = [
            _read_record(file, Checkpoint, "checkpoint record")
            for file in sorted(directory.glob("*.json"))
            if not file.name.startswith(".")
        ]
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
