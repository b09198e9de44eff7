"""One copy of the index on Milvus: the collection's schema, strongly consistent reads by id,
idempotent upserts and deletes, flush and compaction."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient, MilvusException

from redline.platform.index.entries import Entry, Vector, Version
from redline.platform.index.errors import IndexSchemaError
from redline.platform.index.settings import TargetSpec

log = logging.getLogger(__name__)

ROW_FIELDS = ("id", "vector", "ts_ms", "region", "checksum")
FETCH_CHUNK = 1000
"""Ids per read by primary key."""

# pymilvus' channels ping every 10 s, idle or not. A gRPC server on default settings (Milvus
# Lite's) accepts a ping at most every 5 minutes during a call and next to none between calls;
# past two early pings it answers GOAWAY `too_many_pings`, and grpc logs that as an error on every
# client left idle for ~2 minutes. So ping only during calls, and no faster than the server allows.
KEEPALIVE_OPTIONS: dict[str, int] = {
    "grpc.keepalive_time_ms": 330_000,
    "grpc.keepalive_permit_without_calls": 0,
}


def connect_milvus(uri: str, token: str = "", timeout_seconds: float = 10.0) -> MilvusClient:
    """A pymilvus client whose keepalive pings stay within what the server accepts."""
    return MilvusClient(
        uri=uri, token=token, timeout=timeout_seconds, grpc_options=dict(KEEPALIVE_OPTIONS)
    )


@dataclass(frozen=True)
class RowState:
    """What a target holds for one id: its version and checksum (and vector when fetched)."""

    version: Version
    checksum: str
    vector: Vector | None = None


class MilvusTarget:
    """One collection on one Milvus (standalone, distributed or a Milvus Lite server)."""

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
                self._client = connect_milvus(self.spec.uri, self.spec.token, self.timeout_seconds)
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

    def ensure_collection(self) -> None:
        """Create the collection (id, vector, ts_ms, region, checksum) or check an existing one."""
        client = self.client()
        t = self.timeout_seconds
        if client.has_collection(self.collection, timeout=t):
            described = client.describe_collection(self.collection, timeout=t)
            fields = {f["name"]: f for f in described["fields"]}
            missing = [name for name in ROW_FIELDS if name not in fields]
            if missing:
                raise IndexSchemaError(
                    f"collection {self.collection} on {self.name} lacks fields {missing}; "
                    f"the index write path needs {list(ROW_FIELDS)}"
                )
            dim = int(fields["vector"].get("params", {}).get("dim", -1))
            if dim != self.dim:
                raise IndexSchemaError(
                    f"collection {self.collection} on {self.name} has dim {dim}, "
                    f"expected {self.dim}"
                )
            self._call(lambda c: c.load_collection(self.collection, timeout=t))
            return
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dim)
        schema.add_field("ts_ms", DataType.INT64)
        schema.add_field("region", DataType.VARCHAR, max_length=64)
        schema.add_field("checksum", DataType.VARCHAR, max_length=64)
        index = client.prepare_index_params()
        index.add_index("vector", index_type="AUTOINDEX", metric_type=self.metric_type)
        client.create_collection(
            self.collection,
            schema=schema,
            index_params=index,
            consistency_level="Strong",
            timeout=t,
        )

    def fetch(self, ids: Sequence[str], with_vectors: bool = False) -> dict[str, RowState]:
        """The rows present among `ids` (strongly consistent read by primary key)."""
        fields = ["id", "ts_ms", "region", "checksum"] + (["vector"] if with_vectors else [])
        found: dict[str, RowState] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), FETCH_CHUNK):
            chunk = unique[start : start + FETCH_CHUNK]
            rows = self._call(partial(self._get, chunk, fields))
            for row in rows:
                vector = np.asarray(row["vector"], dtype=np.float32) if with_vectors else None
                found[str(row["id"])] = RowState(
                    Version(int(row["ts_ms"]), str(row["region"])), str(row["checksum"]), vector
                )
        return found

    def _get(self, ids: list[str], fields: list[str], client: MilvusClient) -> list[Any]:
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
        """Upsert the entries' rows (idempotent)."""
        if not entries:
            return
        rows = [
            {
                "id": e.id,
                "vector": e.vector,
                "ts_ms": e.ts_ms,
                "region": e.region,
                "checksum": e.checksum,
            }
            for e in entries
        ]
        self._call(lambda c: c.upsert(self.collection, rows, timeout=self.timeout_seconds))

    def delete(self, ids: Sequence[str]) -> None:
        """Delete rows by id (deleting an absent id is a no-op)."""
        if not ids:
            return
        self._call(lambda c: c.delete(self.collection, ids=list(ids), timeout=self.timeout_seconds))

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
