"""CRDT session sync between regions: its RPO, divergent sessions and time to converge.

- `session_crdt_sync_lag_seconds{source_region,target_region}`: per direction, the age of the
  oldest delta of the source region's stream after the target's checkpoint (one XRANGE COUNT 1).
- `session_crdt_divergent_sessions`: sessions changed within `window_seconds` but not within
  the last `settle_seconds` (the normal sync delay) whose digests differ between the regions;
  the digests are computed by Redis (a Lua script per session, pipelined), at most
  `max_sessions` of them a run.
- `session_crdt_convergence_seconds`: the length of the last divergence, from the first run
  that saw divergent sessions to the first that saw none again.
"""

from __future__ import annotations

import itertools
import threading
import time

import redis
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from redline.exporters.probe import MetricDef, Sample
from redline.platform.session_sync import (
    DEFAULT_PREFIX,
    CrdtLayout,
    CrdtSessionStore,
    divergent_sessions,
    measure_sync_lag,
)
from redline.platform.sessions import open_redis
from redline.slo import catalog

LAG = catalog.SESSION_CRDT_SYNC_LAG_SECONDS
DIVERGENT = catalog.SESSION_CRDT_DIVERGENT_SESSIONS
CONVERGENCE = catalog.SESSION_CRDT_CONVERGENCE_SECONDS


class SessionCrdtSettings(BaseModel):
    """Settings of the CRDT session probe (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Run the probe (it needs `regions`).")
    interval_seconds: PositiveFloat = Field(1.0, description="How often the probe runs.")
    regions: dict[str, str] = Field(
        default_factory=dict, description="Region -> its session Redis URL (two or more)."
    )
    prefix: str = Field(DEFAULT_PREFIX, min_length=1, description="CRDT key prefix.")
    window_seconds: PositiveFloat = Field(600.0, description="Sessions changed this recently.")
    settle_seconds: PositiveFloat = Field(
        2.0, description="Sessions changed more recently are not compared (normal sync delay)."
    )
    max_sessions: PositiveInt = Field(2000, description="At most this many compared a run.")
    timeout_seconds: PositiveFloat = Field(2.0, description="Redis connect and read timeout.")


class SessionCrdtProbe:
    """Measures the sync lag of every direction, divergent sessions, and the last convergence."""

    metrics = (MetricDef.of(LAG), MetricDef.of(DIVERGENT), MetricDef.of(CONVERGENCE))

    def __init__(
        self,
        regions: dict[str, str],
        *,
        prefix: str = DEFAULT_PREFIX,
        interval_seconds: float = 1.0,
        window_seconds: float = 600.0,
        settle_seconds: float = 2.0,
        max_sessions: int = 2000,
        timeout_seconds: float = 2.0,
        name: str = catalog.PROBE_SESSION_CRDT,
    ) -> None:
        if len(regions) < 2:
            raise ValueError("session_crdt: `regions` needs two or more region -> Redis URL")
        self.name = name
        self.interval_seconds = interval_seconds
        self.regions = dict(regions)
        self.layout = CrdtLayout(prefix)
        self.window_seconds = window_seconds
        self.settle_seconds = settle_seconds
        self.max_sessions = max_sessions
        self.timeout_seconds = timeout_seconds
        self._stores: list[CrdtSessionStore] | None = None
        self._lock = threading.Lock()
        self._diverged_since: float | None = None
        self.convergence_seconds = 0.0

    @classmethod
    def from_settings(cls, settings: SessionCrdtSettings) -> SessionCrdtProbe:
        """Build from its settings section."""
        return cls(
            settings.regions,
            prefix=settings.prefix,
            interval_seconds=settings.interval_seconds,
            window_seconds=settings.window_seconds,
            settle_seconds=settings.settle_seconds,
            max_sessions=settings.max_sessions,
            timeout_seconds=settings.timeout_seconds,
        )

    def _connections(self) -> list[CrdtSessionStore]:
        with self._lock:
            if self._stores is None:
                self._stores = [
                    CrdtSessionStore(open_redis(url, self.timeout_seconds), region, self.layout)
                    for region, url in self.regions.items()
                ]
            return self._stores

    def run(self) -> list[Sample]:
        """Measure every direction's lag, then compare the regions' recent sessions."""
        stores = self._connections()
        samples = []
        for source, target in itertools.permutations(stores, 2):
            lag = measure_sync_lag(source, target, self.layout)
            labels = {"source_region": source.region, "target_region": target.region}
            samples.append(Sample(LAG.name, lag.lag_seconds, labels))
        divergent, _compared = divergent_sessions(
            stores, self.window_seconds, self.settle_seconds, self.max_sessions
        )
        now = time.time()
        if divergent and self._diverged_since is None:
            self._diverged_since = now
        elif not divergent and self._diverged_since is not None:
            self.convergence_seconds = now - self._diverged_since
            self._diverged_since = None
        samples.append(Sample(DIVERGENT.name, float(len(divergent))))
        samples.append(Sample(CONVERGENCE.name, self.convergence_seconds))
        return samples

    def close(self) -> None:
        """Close the Redis connection pools."""
        with self._lock:
            for store in self._stores or ():
                client: redis.Redis = store.client
                client.close()
            self._stores = None
