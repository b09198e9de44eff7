"""Embedding drift probe: recent vectors (Milvus or a Redis stream) against a reference set.

Window sources
- `MilvusWindow`: the newest vectors of a Milvus collection. The collection must have an int64
  field holding the insert time in milliseconds since the Unix epoch (default `ts_ms`, set by the
  writer on every insert/upsert; an INVERTED or STL_SORT index on it keeps the look-up cheap).
  Milvus queries cannot sort, so the source narrows `ts_ms >= cutoff` with `count(*)` queries
  until it covers at least the window, then fetches those rows and keeps the newest.
- `RedisStreamWindow`: the newest entries of a Redis stream (XREVRANGE), one vector per entry in
  a field (raw little-endian float32 bytes, or a JSON list).

Each run fetches window_size + 10 % (so a few bad vectors do not shrink the window), skips
vectors of the wrong dimension, with NaN/inf, or undecodable (counted by reason, one log line per
run), and scores the newest window_size valid ones; with fewer valid vectors it scores the newest
window_size/2, /4, ... (each size has its own calibration), and below `min_window` it publishes
only the sample count. A Milvus window is at most 7447 vectors (16384-row query cap).

Reference sources: `NpyReference` (a `.npy` file of shape (rows, dim)) or `MilvusSnapshot` (the
vectors of a collection, read once). The reference is loaded on the first run and the detector,
with its calibrated thresholds, is kept for the life of the probe.

Published series: `embedding_drift_score{collection,method}`,
`embedding_drift_threshold{collection,method}` (same labels, so an alert compares them series to
series), `embedding_drift_window_samples{collection}` and the counter
`embedding_drift_invalid_vectors_total{collection,reason}` (reason: wrong_dimension, non_finite,
undecodable; a bad vector is counted at every run that fetches it).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray
from pymilvus import MilvusClient

from redline.core.redisconn import open_redis
from redline.exporters.drift_stats import (
    METHODS,
    CleanVectors,
    DriftDetector,
    DriftError,
    DriftMethod,
    DriftSettings,
    build_clean_vectors,
    effective_window_size,
)
from redline.exporters.probe import MetricDef, Sample
from redline.platform.index import connect_milvus
from redline.slo import catalog
from redline.slo.spec import Drift

log = logging.getLogger(__name__)

INVALID_REASONS = ("wrong_dimension", "non_finite", "undecodable")
MILVUS_QUERY_WINDOW = 16384  # Milvus caps offset + limit of one query at 16384 rows

DRIFT_METRICS = (
    MetricDef.of(catalog.EMBEDDING_DRIFT_SCORE),
    MetricDef.of(catalog.EMBEDDING_DRIFT_THRESHOLD),
    MetricDef.of(catalog.EMBEDDING_DRIFT_WINDOW_SAMPLES),
    MetricDef.of(catalog.EMBEDDING_DRIFT_INVALID_VECTORS_TOTAL),
)


class WindowSource(Protocol):
    """Where the recent vectors come from."""

    def fetch(self, count: int) -> list[Any]:
        """Up to `count` most recent vectors, newest first; `None` for an undecodable one."""
        ...


class ReferenceSource(Protocol):
    """Where the reference vectors come from."""

    def load(self) -> NDArray[Any] | list[Any]:
        """Every reference vector (rows of one dimension)."""
        ...


@dataclass(frozen=True)
class NpyReference:
    """Reference vectors in a `.npy` file of shape (rows, dim)."""

    path: Path

    def load(self) -> NDArray[Any]:
        """The array in the file; DriftError naming the file when it is missing or malformed."""
        return load_reference_npy(self.path)


def load_reference_npy(path: Path) -> NDArray[Any]:
    """Read a (rows, dim) numeric array from a `.npy` file, with a clear error otherwise."""
    try:
        array = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise DriftError(f"reference {path}: cannot read: {exc}") from None
    except ValueError as exc:
        raise DriftError(f"reference {path}: not a .npy array of numbers: {exc}") from None
    if not isinstance(array, np.ndarray) or array.ndim != 2 or array.dtype.kind not in "fiu":
        shape = getattr(array, "shape", None)
        raise DriftError(f"reference {path}: expected a 2-D numeric array (rows, dim), got {shape}")
    return array


@dataclass(frozen=True)
class MilvusSnapshot:
    """Reference vectors read once from a Milvus collection (optionally filtered)."""

    uri: str
    collection: str
    vector_field: str = "embedding"
    filter: str = ""
    limit: int = 100_000
    token: str = ""
    timeout_seconds: float = 30.0

    def load(self) -> list[Any]:
        """Every matching vector, up to `limit`."""
        return fetch_milvus_vectors(
            self.uri,
            self.collection,
            self.vector_field,
            filter=self.filter,
            limit=self.limit,
            token=self.token,
            timeout_seconds=self.timeout_seconds,
        )


def fetch_milvus_vectors(
    uri: str,
    collection: str,
    vector_field: str,
    *,
    filter: str = "",
    limit: int = 100_000,
    token: str = "",
    timeout_seconds: float = 30.0,
) -> list[Any]:
    """Read up to `limit` vectors of a collection with a query iterator."""
    client = connect_milvus(uri, token, timeout_seconds)
    try:
        iterator = client.query_iterator(
            collection,
            batch_size=1000,
            limit=limit,
            filter=filter,
            output_fields=[vector_field],
            timeout=timeout_seconds,
        )
        vectors: list[Any] = []
        try:
            while True:
                batch = iterator.next()
                if not batch:
                    break
                vectors.extend(row[vector_field] for row in batch)
        finally:
            iterator.close()
        return vectors
    finally:
        client.close()


@dataclass
class MilvusWindow:
    """The newest vectors of a Milvus collection, ordered by an int64 insert time in ms."""

    uri: str
    collection: str
    vector_field: str = "embedding"
    time_field: str = "ts_ms"
    token: str = ""
    timeout_seconds: float = 10.0
    clock: Callable[[], float] = time.time
    _span_hint_ms: int = field(default=1000, init=False, repr=False)

    def fetch(self, count: int) -> list[Any]:
        """Up to `count` newest vectors (by `time_field`), newest first."""
        if not 0 < count <= MILVUS_QUERY_WINDOW // 2:
            raise DriftError(f"window of {count}: expected 1..{MILVUS_QUERY_WINDOW // 2}")
        client = connect_milvus(self.uri, self.token, self.timeout_seconds)
        try:
            cutoff = self._cutoff(client, count)
            if cutoff is None:
                return []
            rows = client.query(
                self.collection,
                filter=f"{self.time_field} >= {cutoff}",
                output_fields=[self.vector_field, self.time_field],
                limit=MILVUS_QUERY_WINDOW,
                timeout=self.timeout_seconds,
            )
        finally:
            client.close()
        rows = sorted(rows, key=lambda row: int(row[self.time_field]), reverse=True)
        return [row.get(self.vector_field) for row in rows[:count]]

    def _count(self, client: MilvusClient, cutoff: int | None) -> int:
        rows = client.query(
            self.collection,
            filter="" if cutoff is None else f"{self.time_field} >= {cutoff}",
            output_fields=["count(*)"],
            timeout=self.timeout_seconds,
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def _cutoff(self, client: MilvusClient, count: int) -> int | None:
        """The latest insert time whose rows cover `count` rows (as few more as practical)."""
        total = self._count(client, None)
        if total == 0:
            return None
        now = int(self.clock() * 1000)
        wanted = min(count, total)
        # Widen the look-back until it covers the window, starting near last run's span...
        low, high = 0, max(self._span_hint_ms // 4, 1)
        found = self._count(client, now - high)
        while found < wanted and high < now:
            low, high = high, min(high * 4, now)
            found = self._count(client, now - high)
        if found < wanted:
            return 0  # rows older than the epoch or a wrong clock: take everything from 0
        # ...then narrow it so the fetch stays close to the window (bounded number of counts).
        for _ in range(24):
            if found <= wanted + max(wanted // 4, 16) or high - low <= 1:
                break
            middle = (low + high) // 2
            inside = self._count(client, now - middle)
            if inside >= wanted:
                high, found = middle, inside
            else:
                low = middle
        self._span_hint_ms = high
        return now - high


@dataclass(frozen=True)
class RedisStreamWindow:
    """The newest entries of a Redis stream, one vector per entry in `field`."""

    url: str
    stream: str
    field: str = "vector"
    encoding: Literal["float32", "json"] = "float32"
    timeout_seconds: float = 5.0

    def fetch(self, count: int) -> list[Any]:
        """Up to `count` newest vectors (XREVRANGE), newest first; `None` if undecodable."""
        client = open_redis(
            self.url,
            socket_timeout=self.timeout_seconds,
            socket_connect_timeout=self.timeout_seconds,
        )
        try:
            entries = client.xrevrange(self.stream, "+", "-", count=count)
        finally:
            client.close()
        key = self.field.encode()
        vectors: list[Any] = []
        for _, fields in entries or []:
            value = (fields or {}).get(key)
            vectors.append(
                decode_vector(value if isinstance(value, bytes) else None, self.encoding)
            )
        return vectors


def decode_vector(raw: bytes | None, encoding: Literal["float32", "json"]) -> NDArray[Any] | None:
    """A vector from a stream field; `None` when the field is missing or not decodable."""
    if raw is None:
        return None
    if encoding == "float32":
        if len(raw) % 4:
            return None
        return np.frombuffer(raw, dtype="<f4")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(value, list) or not all(
        isinstance(item, int | float) and not isinstance(item, bool) for item in value
    ):
        return None
    return np.asarray(value, dtype=np.float64)


def encode_vector(vector: Sequence[float] | NDArray[Any]) -> bytes:
    """The float32 little-endian bytes `RedisStreamWindow` reads by default."""
    return np.asarray(vector, dtype="<f4").tobytes()


class DriftProbe:
    """Scores the newest window of embeddings against a reference with calibrated thresholds."""

    def __init__(
        self,
        *,
        source: WindowSource,
        reference: ReferenceSource | NDArray[Any],
        collection: str,
        methods: Sequence[DriftMethod] = ("mmd",),
        window_size: int = 1000,
        min_window: int | None = None,
        interval_seconds: float = 60.0,
        settings: DriftSettings | None = None,
        fixed_thresholds: Mapping[DriftMethod, float] | None = None,
        name: str = "embedding_drift",
    ) -> None:
        unknown = [method for method in methods if method not in METHODS]
        if unknown or not methods:
            raise DriftError(
                f"drift methods {list(methods)}: expected one or more of {', '.join(METHODS)}"
            )
        if min_window is None:
            min_window = max(2, min(100, window_size // 4))
        if not 2 <= min_window <= window_size:
            raise DriftError(f"min_window must be in 2..{window_size}, got {min_window}")
        self.name = name
        self.interval_seconds = interval_seconds
        self.metrics = DRIFT_METRICS
        self.collection = collection
        self.methods = tuple(dict.fromkeys(methods))
        self.window_size = window_size
        self.min_window = min_window
        self.fixed_thresholds = dict(fixed_thresholds or {})
        self.settings = replace(settings or DriftSettings(), window_size=window_size)
        self._source = source
        self._reference = reference
        self._detector: DriftDetector | None = None
        self._invalid = dict.fromkeys(INVALID_REASONS, 0)
        self._lock = threading.Lock()

    def detector(self) -> DriftDetector:
        """The prepared reference (loaded and checked on first use, then kept)."""
        if self._detector is None:
            rows = (
                self._reference
                if isinstance(self._reference, np.ndarray)
                else self._reference.load()
            )
            clean = build_clean_vectors(rows, None)
            if clean.invalid:
                log.warning(
                    "embedding drift %s: skipped %d invalid reference vectors (%s)",
                    self.collection,
                    clean.invalid,
                    _reasons(clean),
                )
            self._detector = DriftDetector(clean.vectors, self.settings)
            log.info(
                "embedding drift %s: reference of %d vectors, dimension %d",
                self.collection,
                clean.vectors.shape[0],
                self._detector.dim,
            )
        return self._detector

    def run(self) -> list[Sample]:
        """Fetch the newest window, skip bad vectors, score it with every method."""
        with self._lock:
            detector = self.detector()
            # A little extra, so a few bad vectors do not shrink the window to the next size down.
            raw = self._source.fetch(self.window_size + self.window_size // 10)
            clean = build_clean_vectors(raw, detector.dim)
            for reason, count in clean.reasons().items():
                self._invalid[reason] += count
            if clean.invalid:
                log.warning(
                    "embedding drift %s: skipped %d of %d window vectors (%s; reference dim %d)",
                    self.collection,
                    clean.invalid,
                    len(raw),
                    _reasons(clean),
                    detector.dim,
                )
            samples = [
                Sample(
                    catalog.EMBEDDING_DRIFT_INVALID_VECTORS_TOTAL.family,
                    float(total),
                    {"collection": self.collection, "reason": reason},
                )
                for reason, total in self._invalid.items()
            ]
            valid = min(int(clean.vectors.shape[0]), self.window_size)
            size = effective_window_size(valid, self.window_size, self.min_window)
            window_label = {"collection": self.collection}
            if size == 0:
                log.info(
                    "embedding drift %s: %d valid vectors, fewer than %d: not scored",
                    self.collection,
                    valid,
                    self.min_window,
                )
                samples.append(
                    Sample(catalog.EMBEDDING_DRIFT_WINDOW_SAMPLES.family, valid, window_label)
                )
                return samples
            window = clean.vectors[:size]
            samples.append(
                Sample(catalog.EMBEDDING_DRIFT_WINDOW_SAMPLES.family, size, window_label)
            )
            for method in self.methods:
                result = detector.evaluate(window, method)
                threshold = self.fixed_thresholds.get(method, result.threshold)
                labels = {"collection": self.collection, "method": method}
                samples.append(Sample(catalog.EMBEDDING_DRIFT_SCORE.family, result.score, labels))
                samples.append(Sample(catalog.EMBEDDING_DRIFT_THRESHOLD.family, threshold, labels))
            return samples


def _reasons(clean: CleanVectors) -> str:
    return ", ".join(f"{reason}={count}" for reason, count in clean.reasons().items())


def build_drift_probe(
    drift: Drift,
    *,
    milvus_uri: str,
    token: str = "",
    vector_field: str = "embedding",
    time_field: str = "ts_ms",
    interval_seconds: float = 60.0,
    use_spec_threshold: bool = False,
) -> DriftProbe:
    """A Milvus-backed probe from the spec's `drift` section (its `.npy` reference).

    The threshold is calibrated on the reference unless `use_spec_threshold`: the spec's fixed
    `drift.threshold` is on no particular scale and would make the false-positive rate unknown.
    """
    if drift.reference is None:
        raise DriftError("spec drift.reference: set it to a .npy file of reference vectors")
    return DriftProbe(
        source=MilvusWindow(
            milvus_uri,
            drift.collection,
            vector_field=vector_field,
            time_field=time_field,
            token=token,
        ),
        reference=NpyReference(Path(drift.reference)),
        collection=drift.collection,
        methods=(drift.method,),
        window_size=drift.window,
        interval_seconds=interval_seconds,
        fixed_thresholds={drift.method: drift.threshold} if use_spec_threshold else None,
    )
