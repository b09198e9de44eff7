"""One copy of the index on Milvus: the collection's schema as Milvus describes it, strongly
consistent reads by id, idempotent upserts and deletes of whole rows, flush and compaction; and
the connection (credentials, gRPC keepalive) to Milvus Lite, Milvus standalone or Zilliz Cloud."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlparse

import numpy as np
from pymilvus import CollectionSchema, DataType, MilvusClient, MilvusException

from redline.platform.index.entries import Entry, Vector, Version
from redline.platform.index.errors import IndexSchemaError
from redline.platform.index.schema import RowSchema, build_row_schema
from redline.platform.index.settings import TargetSpec

log = logging.getLogger(__name__)

ROW_FIELDS = ("id", "vector", "ts_ms", "region", "checksum")
"""The schema redline creates for a collection that does not exist yet."""
FETCH_CHUNK = 1000
"""Ids per read by primary key."""

# pymilvus' own channel options ping every 10 s, idle or not. Milvus standalone/distributed (Go)
# accepts a ping every 5 s, idle or not; a server on gRPC's C++ defaults (Milvus Lite) accepts one
# at most every 5 minutes during a call and none between calls, and past two early pings answers
# GOAWAY `too_many_pings` (logged as an error on every client left idle ~2 minutes). So: on
# loopback and local files, ping only during calls, no faster than 330 s; elsewhere ping idle
# connections every 60 s (above the server's 5 s minimum, below the 4-10 minute idle timeouts of
# cloud load balancers that would otherwise drop a long-lived client's connection silently).
LOCAL_KEEPALIVE_SECONDS = 330.0
REMOTE_KEEPALIVE_SECONDS = 60.0
MIN_KEEPALIVE_SECONDS = 10.0
KEEPALIVE_OPTIONS: dict[str, int] = {
    "grpc.keepalive_time_ms": int(LOCAL_KEEPALIVE_SECONDS * 1000),
    "grpc.keepalive_permit_without_calls": 0,
}
"""The options of a local connection (kept for callers of the previous release)."""
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


def is_local_uri(uri: str) -> bool:
    """True for a Milvus Lite file, a unix socket or a loopback address."""
    if uri.endswith(".db") or uri.startswith("unix:"):
        return True
    host = urlparse(uri).hostname or "localhost"
    try:
        return host in _LOOPBACK or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def keepalive_options(
    uri: str, keepalive_seconds: float | None = None, idle_pings: bool | None = None
) -> dict[str, int]:
    """The gRPC keepalive options of a connection to `uri` (see the module's comment)."""
    local = is_local_uri(uri)
    seconds = keepalive_seconds or (LOCAL_KEEPALIVE_SECONDS if local else REMOTE_KEEPALIVE_SECONDS)
    if seconds < MIN_KEEPALIVE_SECONDS:
        raise ValueError(
            f"keepalive of {seconds:g} s is below {MIN_KEEPALIVE_SECONDS:g} s: Milvus answers "
            "such pings with GOAWAY too_many_pings"
        )
    idle = (not local) if idle_pings is None else idle_pings
    options = {
        "grpc.keepalive_time_ms": int(seconds * 1000),
        "grpc.keepalive_timeout_ms": 20_000,
        "grpc.keepalive_permit_without_calls": 1 if idle else 0,
    }
    if idle:
        # gRPC stops pinging after two pings without data unless told otherwise; an idle
        # connection kept alive must go on pinging (at the interval above, which Milvus accepts).
        options["grpc.http2.max_pings_without_data"] = 0
    return options


def connect_milvus(
    uri: str,
    token: str = "",
    timeout_seconds: float = 10.0,
    keepalive_seconds: float | None = None,
    idle_pings: bool | None = None,
) -> MilvusClient:
    """A pymilvus client for a Milvus Lite file or server, Milvus standalone or Zilliz Cloud
    (`https://…`, TLS), authenticated with `token` (an API key, or `user:password`), whose
    keepalive pings stay within what the server accepts."""
    return MilvusClient(
        uri=uri,
        token=token,
        timeout=timeout_seconds,
        grpc_options=keepalive_options(uri, keepalive_seconds, idle_pings),
    )


@dataclass(frozen=True)
class RowState:
    """What a target holds for one id: its version and stored checksum, and when fetched with
    vectors the vector and the canonical JSON of its other fields. A row redline did not write
    has version (-1, "") and no checksum."""

    version: Version
    checksum: str
    vector: Vector | None = None
    payload: bytes = b""


class MilvusTarget:
    """One collection on one Milvus (standalone, distributed, Zilliz or a Milvus Lite server)."""

    def __init__(
        self,
        spec: TargetSpec,
        dim: int,
        timeout_seconds: float = 10.0,
        metric_type: str = "COSINE",
    ) -> None:
        self.spec = spec
        self.dim = dim
        self.timeout_seconds = timeout_seconds
        self.metric_type = metric_type
        self._client: MilvusClient | None = None
        self._schema: RowSchema | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The target's name (checkpoint keys, metric labels)."""
        return self.spec.name

    @property
    def collection(self) -> str:
        """The Milvus collection name."""
        return self.spec.collection

    def client(self) -> MilvusClient:
        """The (lazily connected) pymilvus client; connecting fails fast when Milvus is down."""
        with self._lock:
            if self._client is None:
                self._client = connect_milvus(
                    self.spec.uri,
                    self.spec.token,
                    self.timeout_seconds,
                    self.spec.keepalive_seconds,
                    self.spec.idle_pings,
                )
            return self._client

    def close(self) -> None:
        """Release the connection."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _call(self, fn: Callable[[MilvusClient], Any]) -> Any:
        client = self.client()
        try:
            return fn(client)
        except MilvusException as exc:
            # A restarted Milvus keeps collections released until someone loads them again.
            if "load" not in str(exc).lower() or "released" not in str(exc).lower():
                raise
            log.info("loading released collection %s on %s", self.collection, self.name)
            client.load_collection(self.collection, timeout=self.timeout_seconds)
            return fn(client)

    # schema ------------------------------------------------------------------------------

    def schema(self) -> RowSchema:
        """The collection's row schema, described once (IndexSchemaError when unusable)."""
        if self._schema is None:
            self._schema = self.describe()
        return self._schema

    def describe(self) -> RowSchema:
        """Describe the collection now; IndexSchemaError naming it and the field at fault."""
        described = self._call(
            lambda c: c.describe_collection(self.collection, timeout=self.timeout_seconds)
        )
        schema = build_row_schema(
            described,
            self.collection,
            self.name,
            self.dim,
            self.spec.vector_field,
            self.spec.bookkeeping,
        )
        self._schema = schema
        return schema

    def ensure_collection(self, like: MilvusTarget | None = None) -> RowSchema:
        """Check an existing collection (and load it), or create it: with the schema of `like`
        (a replica of a user's collection), else redline's own `id, vector, ts_ms, region,
        checksum`. Returns its row schema; IndexSchemaError when the write path cannot use it."""
        client = self.client()
        t = self.timeout_seconds
        if client.has_collection(self.collection, timeout=t):
            schema = self.describe()
            self._call(lambda c: c.load_collection(self.collection, timeout=t))
            return schema
        if like is not None:
            source = like.schema()
            described = like.client().describe_collection(like.collection, timeout=t)
            try:
                copied = CollectionSchema.construct_from_dict(described)
            except (KeyError, TypeError, ValueError, MilvusException) as exc:
                raise IndexSchemaError(
                    f"collection {self.collection} on {self.name} does not exist and the schema "
                    f"of {like.collection} on {like.name} cannot be copied ({exc}): create it"
                ) from None
            vector = source.vector
        else:
            vector = self.spec.vector_field or "vector"
            copied = client.create_schema(auto_id=False, enable_dynamic_field=False)
            copied.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
            copied.add_field(vector, DataType.FLOAT_VECTOR, dim=self.dim)
            copied.add_field("ts_ms", DataType.INT64)
            copied.add_field("region", DataType.VARCHAR, max_length=64)
            copied.add_field("checksum", DataType.VARCHAR, max_length=64)
        index = client.prepare_index_params()
        index.add_index(vector, index_type="AUTOINDEX", metric_type=self.metric_type)
        client.create_collection(
            self.collection,
            schema=copied,
            index_params=index,
            consistency_level="Strong",
            timeout=t,
        )
        return self.describe()

    # reads and writes --------------------------------------------------------------------

    def fetch(self, ids: Sequence[str], with_vectors: bool = False) -> dict[str, RowState]:
        """The rows present among `ids` (strongly consistent read by primary key); with vectors,
        every field is read back (vector, scalars, dynamic fields) for verification."""
        schema = self.schema()
        fields = ["*"] if with_vectors else schema.version_fields()
        found: dict[str, RowState] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), FETCH_CHUNK):
            chunk = [schema.key(i) for i in unique[start : start + FETCH_CHUNK]]
            rows = self._call(partial(self._get, chunk, fields))
            for row in rows:
                version, checksum = schema.version_of(row)
                if with_vectors:
                    vector = np.asarray(row[schema.vector], dtype=np.float32)
                    state = RowState(version, checksum, vector, schema.payload_of(row))
                else:
                    state = RowState(version, checksum)
                found[str(row[schema.pk])] = state
        return found

    def _get(self, ids: list[Any], fields: list[str], client: MilvusClient) -> list[Any]:
        return list(
            client.get(
                self.collection,
                ids=ids,
                output_fields=fields,
                timeout=self.timeout_seconds,
                consistency_level="Strong",
                strict_float32=True,  # vectors as float32 arrays: exact, and decoded in bulk
            )
        )

    def upsert(self, entries: Sequence[Entry]) -> None:
        """Upsert the entries' whole rows with their versions (idempotent)."""
        if not entries:
            return
        schema = self.schema()
        rows = [schema.to_row(e) for e in entries]
        self._call(lambda c: c.upsert(self.collection, rows, timeout=self.timeout_seconds))

    def upsert_plain(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Upsert rows as given, without versions (the canary of an externally replicated pair)."""
        if rows:
            data = [dict(r) for r in rows]
            self._call(lambda c: c.upsert(self.collection, data, timeout=self.timeout_seconds))

    def delete(self, ids: Sequence[str]) -> None:
        """Delete rows by id (deleting an absent id is a no-op)."""
        if not ids:
            return
        keys = [self.schema().key(i) for i in ids]
        self._call(lambda c: c.delete(self.collection, ids=keys, timeout=self.timeout_seconds))

    def flush(self) -> None:
        """Seal the growing segments."""
        self._call(lambda c: c.flush(self.collection, timeout=self.timeout_seconds))

    def compact(self, wait_seconds: float = 30.0) -> bool:
        """Compact and wait for it; False when the server does not support it or it times out."""
        client = self.client()
        try:
            job = client.compact(self.collection, timeout=self.timeout_seconds)
            deadline = time.monotonic() + wait_seconds
            while time.monotonic() < deadline:
                state = client.get_compaction_state(job, timeout=self.timeout_seconds)
                if state == "Completed":
                    return True
                time.sleep(0.1)
        except MilvusException as exc:
            log.info("compaction of %s on %s not done: %s", self.collection, self.name, exc)
        return False

    def count(self) -> int:
        """Number of rows (strongly consistent)."""
        rows = self._call(
            lambda c: c.query(
                self.collection,
                filter="",
                output_fields=["count(*)"],
                timeout=self.timeout_seconds,
                consistency_level="Strong",
            )
        )
        return int(rows[0]["count(*)"])
