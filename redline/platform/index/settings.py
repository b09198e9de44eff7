"""Where an index lives: its two copies (TargetSpec), one logical collection (IndexConfig) and
the settings fields every settings class pointing at an index shares (IndexTargetsFields)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt, SecretStr

from redline.core.settings import ServiceSettings
from redline.platform.index.entries import check_id, check_region
from redline.platform.index.errors import DeltaLogError


@dataclass(frozen=True)
class TargetSpec:
    """Where a copy of the index lives: a Milvus URI, a collection and a name for keys/labels."""

    uri: str
    collection: str
    name: str
    token: str = field(default="", repr=False)


@dataclass(frozen=True)
class IndexConfig:
    """One logical collection: its delta log, dimension, primary and replica."""

    collection: str
    dim: int
    primary: TargetSpec
    replica: TargetSpec
    region: str = "primary"
    metric_type: str = "COSINE"

    def __post_init__(self) -> None:
        check_id(self.collection)
        check_region(self.region)
        if self.dim <= 0:
            raise DeltaLogError(f"dim must be positive, got {self.dim}")
        if self.primary.name == self.replica.name:
            raise DeltaLogError(f"primary and replica need different names ({self.primary.name})")
        if (self.primary.uri, self.primary.collection) == (
            self.replica.uri,
            self.replica.collection,
        ):
            raise DeltaLogError("primary and replica are the same collection on the same Milvus")


class IndexTargetsFields(BaseModel):
    """The settings fields naming an index's two copies, shared by every settings class that
    points at one (the exporter's staleness probe, `redline index`, the index playbooks)."""

    primary_uri: str = Field("http://127.0.0.1:19530", description="Milvus URI of the primary.")
    primary_collection: str | None = Field(None, description="Primary collection (= collection).")
    primary_name: str = Field("primary", description="Name of the primary (keys, labels).")
    replica_uri: str = Field("http://127.0.0.1:19531", description="Milvus URI of the replica.")
    replica_collection: str | None = Field(None, description="Replica collection (= collection).")
    replica_name: str = Field("replica", description="Name of the replica (keys, labels).")
    metric_type: str = Field("COSINE", description="Metric type of the vector index.")

    def index_config(
        self, collection: str, dim: int, token: str = "", region: str = "primary"
    ) -> IndexConfig:
        """The IndexConfig of logical collection `collection`; DeltaLogError when invalid."""
        return IndexConfig(
            collection=collection,
            dim=dim,
            primary=TargetSpec(
                self.primary_uri,
                self.primary_collection or collection,
                self.primary_name,
                token,
            ),
            replica=TargetSpec(
                self.replica_uri,
                self.replica_collection or collection,
                self.replica_name,
                token,
            ),
            region=region,
            metric_type=self.metric_type,
        )


class IndexSettings(IndexTargetsFields, ServiceSettings):
    """Settings of the `redline index` processes (flags > env > `--config` > defaults)."""

    collection: str = Field("documents", description="Logical collection (names the delta log).")
    dim: PositiveInt = Field(384, description="Vector dimension.")
    region: str = Field("primary", description="Region this process writes as.")
    milvus_token: SecretStr | None = Field(None, description="Milvus token (env or token file).")
    milvus_timeout_seconds: PositiveFloat = Field(10.0, description="Timeout of Milvus calls.")
    batch_size: PositiveInt = Field(500, description="Delta-log entries applied per batch.")
    poll_interval_seconds: PositiveFloat = Field(0.1, description="Replicator idle poll interval.")
    lease_ttl_seconds: PositiveFloat = Field(15.0, description="Lease of an applier on a target.")

    def collection_config(self, token: str = "") -> IndexConfig:
        """The IndexConfig these settings describe."""
        return self.index_config(self.collection, self.dim, token, self.region)
