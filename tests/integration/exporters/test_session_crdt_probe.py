"""The CRDT session probe on a real redis-server: lag per direction, divergence, convergence."""

from __future__ import annotations

import time

from redline.exporters.probe import Sample
from redline.exporters.session_crdt import SessionCrdtProbe, SessionCrdtSettings
from redline.platform.session_sync import CrdtSessionStore, SessionSync, set_paused
from redline.platform.sessions import open_redis
from redline.slo import catalog


def _values(
    samples: list[Sample], metric: catalog.Metric
) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in samples if s.name == metric.name}


def test_a_cut_sync_shows_lag_and_divergence_and_the_heal_a_convergence_time(
    redis_url: str,
) -> None:
    base = redis_url.rsplit("/", 1)[0]
    urls = {"eu": f"{base}/0", "us": f"{base}/3"}
    settings = SessionCrdtSettings(enabled=True, regions=urls, settle_seconds=0.2)
    probe = SessionCrdtProbe.from_settings(settings)
    clients = {region: open_redis(url) for region, url in urls.items()}
    eu, us = (CrdtSessionStore(clients[r], r) for r in ("eu", "us"))
    try:
        first = probe.run()
        assert _values(first, catalog.SESSION_CRDT_DIVERGENT_SESSIONS) == {(): 0.0}
        assert _values(first, catalog.SESSION_CRDT_CONVERGENCE_SECONDS) == {(): 0.0}
        set_paused(us.client, True)
        eu.add_message("s", "m1", "hello")
        time.sleep(0.4)
        cut = probe.run()
        lags = _values(cut, catalog.SESSION_CRDT_SYNC_LAG_SECONDS)
        assert lags[(("source_region", "eu"), ("target_region", "us"))] >= 0.3
        assert lags[(("source_region", "us"), ("target_region", "eu"))] == 0.0
        assert _values(cut, catalog.SESSION_CRDT_DIVERGENT_SESSIONS) == {(): 1.0}
        set_paused(us.client, False)
        time.sleep(0.3)
        assert SessionSync(eu, us).step() == 1
        healed = probe.run()
        assert _values(healed, catalog.SESSION_CRDT_DIVERGENT_SESSIONS) == {(): 0.0}
        assert _values(healed, catalog.SESSION_CRDT_CONVERGENCE_SECONDS)[()] >= 0.3
        assert max(_values(healed, catalog.SESSION_CRDT_SYNC_LAG_SECONDS).values()) == 0.0
    finally:
        probe.close()
        for client in clients.values():
            client.close()
