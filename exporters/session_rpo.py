"""Session CDC RPO: age of the oldest change a replica's consumer group has not ACKed.

`session_cdc_rpo_seconds{stream,group}` counts both pending (delivered, unacked) and not yet
delivered entries, from XPENDING's summary, XINFO GROUPS and one XRANGE ... COUNT 1 per target:
never a scan, whatever the stream's length. A target whose stream or group is missing fails the
run with a message naming it (the replica is not replicating at all, which must not read as 0).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import redis
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from redline.exporters.probe import MetricDef, Sample
from redline.platform.sessions import (
    DEFAULT_GROUP,
    DEFAULT_STREAM,
    CdcTargetError,
    measure_cdc_rpo,
    open_redis,
)
from redline.slo import catalog

RPO_METRIC = catalog.SESSION_CDC_RPO_SECONDS.family


class CdcTarget(BaseModel):
    """One CDC stream and the consumer group that replicates it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: str = Field(DEFAULT_STREAM, min_length=1, description="The CDC stream key.")
    group: str = Field(DEFAULT_GROUP, min_length=1, description="The replica's consumer group.")


class SessionRpoSettings(BaseModel):
    """Settings of the session RPO probe (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Run the probe.")
    interval_seconds: PositiveFloat = Field(1.0, description="How often the probe runs.")
    redis_url: str | None = Field(None, description="Redis holding the streams; default: service.")
    targets: tuple[CdcTarget, ...] = Field(
        (CdcTarget(),), min_length=1, description="The (stream, group) pairs to measure."
    )
    timeout_seconds: PositiveFloat = Field(1.0, description="Redis connect and read timeout.")


class SessionRpoProbe:
    """Measures `session_cdc_rpo_seconds` for each configured (stream, group) pair."""

    metrics = (MetricDef.of(catalog.SESSION_CDC_RPO_SECONDS),)

    def __init__(
        self,
        redis_url: str,
        targets: Iterable[tuple[str, str]] = ((DEFAULT_STREAM, DEFAULT_GROUP),),
        *,
        interval_seconds: float = 1.0,
        timeout_seconds: float = 1.0,
        name: str = "session_rpo",
    ) -> None:
        self.targets = tuple((str(stream), str(group)) for stream, group in targets)
        if not self.targets:
            raise ValueError("SessionRpoProbe needs at least one (stream, group) target")
        self.name = name
        self.interval_seconds = interval_seconds
        self.redis_url = redis_url
        self.timeout_seconds = timeout_seconds
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: SessionRpoSettings, redis_url: str) -> SessionRpoProbe:
        """Build from settings; `redis_url` is the service default when the settings have none."""
        return cls(
            settings.redis_url or redis_url,
            [(t.stream, t.group) for t in settings.targets],
            interval_seconds=settings.interval_seconds,
            timeout_seconds=settings.timeout_seconds,
        )

    def _connection(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                self._client = open_redis(self.redis_url, self.timeout_seconds)
            return self._client

    def run(self) -> list[Sample]:
        """Measure every target; raise CdcTargetError naming all missing streams/groups."""
        client = self._connection()
        samples: list[Sample] = []
        missing: list[str] = []
        for stream, group in self.targets:
            try:
                lag = measure_cdc_rpo(client, stream, group)
            except CdcTargetError as exc:
                missing.append(str(exc))
                continue
            labels = {"stream": stream, "group": group}
            samples.append(Sample(RPO_METRIC, lag.rpo_seconds, labels))
        if missing:
            raise CdcTargetError("; ".join(missing))
        return samples

    def close(self) -> None:
        """Close the Redis connection pool."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
