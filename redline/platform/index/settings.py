"""Where an index lives: its two copies (TargetSpec), one logical collection (IndexConfig) and
the settings fields every settings class pointing at an index shares (IndexTargetsFields).

Credentials: a Milvus token (`milvus_token`, env only, or `milvus_token_file` of the settings
class), or `milvus_user` with `milvus_password` (env only) / `milvus_password_file`; a copy's own
`primary_token_file` / `replica_token_file` wins over both (two Zilliz clusters, two keys). They
are read once, kept out of every repr and never logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt, SecretStr

from redline.core.settings import ServiceSettings, SettingsError, read_secret
from redline.platform.index.entries import check_id, check_region
from redline.platform.index.errors import DeltaLogError
from redline.platform.index.ids import VectorIdGenerator
from redline.platform.index.schema import Bookkeeping

Replication = Literal["redline", "external"]


@dataclass(frozen=True)
class TargetSpec:
    """Where a copy of the index lives: a Milvus URI, a collection and a name for keys/labels,
    its credentials, which vector field the delta log carries (None: the only FLOAT_VECTOR),
    where row versions live (`schema.Bookkeeping`) and the gRPC keepalive (None: by URI)."""

    uri: str
    collection: str
    name: str
    token: str = field(default="", repr=False)
    vector_field: str | None = None
    bookkeeping: Bookkeeping = "auto"
    keepalive_seconds: float | None = None
    idle_pings: bool | None = None


@dataclass(frozen=True)
class IndexConfig:
    """One logical collection: its delta log, dimension, primary and replica."""

    collection: str
    dim: int
    primary: TargetSpec
    replica: TargetSpec
    region: str = "primary"
    metric_type: str = "COSINE"
    replication: Replication = "redline"
    """`redline`: redline's replicator copies the delta log; `external`: something else (Milvus
    CDC, a vendor's replication) copies the primary, redline only measures it."""

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
    replication: Replication = Field(
        "redline",
        description="Who copies primary to replica: redline's replicator (delta log, freeze, "
        "replay), or something else (external: the staleness canary only).",
    )
    vector_field: str | None = Field(
        None, description="FLOAT_VECTOR field the delta log carries (None: the only one)."
    )
    bookkeeping: Bookkeeping = Field(
        "auto",
        description="Where row versions live: columns ts_ms/region/checksum, dynamic fields, "
        "auto (columns if present, else dynamic), none (external replication only).",
    )
    milvus_user: str | None = Field(None, description="Milvus user (with a password).")
    milvus_password: SecretStr | None = Field(None, description="Milvus password (env only).")
    milvus_password_file: Path | None = Field(None, description="File holding the password.")
    primary_token_file: Path | None = Field(None, description="Token of the primary only.")
    replica_token_file: Path | None = Field(None, description="Token of the replica only.")
    milvus_keepalive_seconds: float | None = Field(
        None,
        ge=10.0,
        description="gRPC keepalive ping interval (None: 330 s on loopback/Milvus Lite, 60 s "
        "elsewhere). At least 10 s: Milvus answers faster pings with GOAWAY too_many_pings.",
    )
    milvus_idle_pings: bool | None = Field(
        None,
        description="Ping idle connections too (None: only off loopback; Milvus Lite refuses "
        "them, load balancers drop idle connections without them).",
    )

    def index_config(
        self, collection: str, dim: int, token: str = "", region: str = "primary"
    ) -> IndexConfig:
        """The IndexConfig of logical collection `collection`; DeltaLogError when invalid,
        SettingsError when a credential cannot be read."""
        shared = token or self._user_token()
        primary_token = read_secret(self.primary_token_file, None, "primary_token_file")
        replica_token = read_secret(self.replica_token_file, None, "replica_token_file")

        def spec(uri: str, name: str, coll: str | None, own: SecretStr | None) -> TargetSpec:
            return TargetSpec(
                uri,
                coll or collection,
                name,
                own.get_secret_value() if own is not None else shared,
                self.vector_field,
                "none" if self.replication == "external" else self.bookkeeping,
                self.milvus_keepalive_seconds,
                self.milvus_idle_pings,
            )

        return IndexConfig(
            collection=collection,
            dim=dim,
            primary=spec(self.primary_uri, self.primary_name, self.primary_collection,
                         primary_token),
            replica=spec(self.replica_uri, self.replica_name, self.replica_collection,
                         replica_token),
            region=region,
            metric_type=self.metric_type,
            replication=self.replication,
        )  # fmt: skip

    def _user_token(self) -> str:
        """`user:password` (what Milvus takes as a token) when a user is configured."""
        if not self.milvus_user:
            return ""
        password = read_secret(self.milvus_password_file, self.milvus_password, "milvus_password")
        if password is None:
            raise SettingsError(
                "milvus_user is set but no milvus_password (env) or milvus_password_file"
            )
        return f"{self.milvus_user}:{password.get_secret_value()}"


class IndexSettings(IndexTargetsFields, ServiceSettings):
    """Settings of the `redline index` processes (flags > env > `--config` > defaults)."""

    collection: str = Field("documents", description="Logical collection (names the delta log).")
    dim: PositiveInt = Field(384, description="Vector dimension.")
    region: str = Field("primary", description="Region this process writes as.")
    region_code: int = Field(
        0,
        ge=0,
        le=63,
        description="The region's code in generated vector ids (0-63, unique "
        "per region, the same in every process of the region).",
    )
    node_id: int = Field(
        0,
        ge=0,
        le=63,
        description="This writer's code within its region in generated vector "
        "ids (0-63; two live writers of a region must not share one).",
    )
    id_salt: str = Field(
        "redline",
        min_length=1,
        description="Salt of re-mapped ids of conflicting writes (the "
        "same in every region of a collection).",
    )
    milvus_token: SecretStr | None = Field(None, description="Milvus token (env or token file).")
    milvus_timeout_seconds: PositiveFloat = Field(10.0, description="Timeout of Milvus calls.")
    batch_size: PositiveInt = Field(500, description="Delta-log entries applied per batch.")
    poll_interval_seconds: PositiveFloat = Field(0.1, description="Replicator idle poll interval.")
    lease_ttl_seconds: PositiveFloat = Field(15.0, description="Lease of an applier on a target.")
    retention_seconds: NonNegativeFloat = Field(
        3600.0,
        description="Delta-log history kept behind the slowest checkpoint, freeze point and "
        "replay (what a target restored from a backup can still replay); tombstones older than "
        "the trim point are pruned.",
    )
    trim_interval_seconds: PositiveFloat = Field(
        60.0, description="Seconds between two trims by the replicator."
    )
    trim_chunk: PositiveInt = Field(
        10_000, description="Entries removed per XTRIM call (Redis stays responsive between)."
    )
    origin: str | None = Field(
        None,
        description="Two writing regions: the region this process works for — whose delta log "
        "`write-demo` writes, whose copy `replicate` applies the other region's log to. Its copy "
        "is the primary settings' collection, named after the region. None: the one-log "
        "primary/replica pair.",
    )
    replicate_from: str | None = Field(
        None,
        description="Two writing regions: the other region, whose delta log `replicate` applies "
        "to this region's copy (the same Redis holds both logs, the heads and the conflict map).",
    )
    regions: tuple[str, ...] = Field(
        (),
        description="Two writing regions: every region writing the collection; when given, "
        "`origin` and `replicate_from` must be among them.",
    )
    heads_retention_seconds: NonNegativeFloat = Field(
        3600.0,
        description="Two writing regions: the conflict window — writes of one id from two "
        "regions at most this far apart are a conflict, further apart the later one wins — and "
        "how long the per-id heads are kept behind the oldest entry any region's log holds "
        "(itself the log's retention behind the slowest copy; then the trim prunes them). At "
        "least the longest replication lag plus clock skew; the same in every region (the "
        "first process records it in Redis, a process with another one stops).",
    )

    def collection_config(self, token: str = "") -> IndexConfig:
        """The IndexConfig these settings describe."""
        return self.index_config(self.collection, self.dim, token, self.region)

    def conflict_window_seconds(self) -> float:
        """The conflict window of two writing regions (`heads_retention_seconds`)."""
        return self.heads_retention_seconds

    def two_regions(self, needs_source: bool) -> tuple[str, str | None] | None:
        """(origin, the region replicated from) of a two-region process, None for the one-log
        pair; SettingsError naming the problem (a region named badly, not among `regions`, the
        same on both sides, or `replicate_from` without `origin` / missing when `needs_source`)."""
        origin, source = self.origin, self.replicate_from
        if origin is None:
            if source is not None:
                raise SettingsError(
                    f"--from {source} needs --origin: the region whose copy the log of "
                    f"{source} is applied to"
                )
            return None
        named = [("--origin", origin), ("--from", source)]
        named += [("--regions", r) for r in self.regions]
        for flag, region in named:
            try:
                if region is not None:
                    check_region(region)
            except DeltaLogError as exc:
                raise SettingsError(f"{flag}: {exc}") from None
        if needs_source and source is None:
            raise SettingsError(
                f"replication into {origin}'s copy needs --from REGION: the other region, whose "
                "delta log it applies"
            )
        if source is not None and source == origin:
            raise SettingsError(
                f"--origin and --from are both {origin}: a region's replicator applies the "
                "OTHER region's log to its own copy (its own writes reach it through its writer)"
            )
        known = set(self.regions)
        for flag, region in (("--origin", origin), ("--from", source)):
            if known and region is not None and region not in known:
                raise SettingsError(
                    f"{flag} {region} is not one of the collection's regions "
                    f"({', '.join(sorted(known))})"
                )
        if source is not None and not needs_source:
            raise SettingsError(f"--from {source} only applies to `redline index replicate`")
        return origin, source

    def id_generator(self) -> VectorIdGenerator:
        """The vector id generator of this process (region code, node id)."""
        return VectorIdGenerator(self.region_code, self.node_id)
