"""`redline status`'s line for a CRDT session sync part, on a real redis-server holding both
regions' stores: the lag of the other region's deltas and the divergent sessions, unhealthy while
a session written in one region has not reached the other, healthy once the sync merged it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import redis

from redline.devstack.health import CRDT_SETTLE_SECONDS, _Checker
from redline.devstack.layout import build_ported_parts, build_session_sync_parts
from redline.devstack.state import PartState, StackState
from redline.platform.session_sync import CrdtSessionStore, SessionSync
from redline.platform.sessions import open_redis

REGIONS = ["primary", "secondary"]


def test_the_sync_part_reports_lag_and_divergence_until_the_sync_merges(
    redis_url: str, tmp_path: Path
) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    # only Redis is reached; the other parts get distinct placeholder ports
    others = [p for p in build_ported_parts(REGIONS) if p != "redis"]
    ports = {p: 40_000 + i if 40_000 + i != port else 39_999 for i, p in enumerate(others)}
    ports["redis"] = port
    state = StackState(
        run_dir=str(tmp_path), spec=None, spec_source="default", host="127.0.0.1",
        regions=REGIONS, ports=ports, rate=1.0, seed=1, started_at=time.time(),
    )  # fmt: skip
    urls = state.endpoints().crdt_session_urls
    stores = {r: CrdtSessionStore(open_redis(urls[r], 2.0), r) for r in REGIONS}
    into_secondary = next(p for p in build_session_sync_parts(REGIONS) if p.endswith("secondary"))
    part = PartState(name=into_secondary, kind="redline", pid=1, log="", started_at=0.0)
    db = redis.Redis.from_url(redis_url)
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        checker = _Checker(state, http, db)
        assert checker.check(part) == (
            True, "lag primary→secondary 0.00 s (max 5), 0/0 recent sessions divergent"
        )  # fmt: skip
        stores["primary"].add_message("s-1", "m-1", "hello from primary")
        time.sleep(CRDT_SETTLE_SECONDS + 0.2)  # out of the sync's normal delay
        healthy, detail = checker.check(part)
        assert not healthy, detail
        assert detail.startswith("lag primary→secondary ") and detail.endswith(
            "1/1 recent sessions divergent"
        ), detail
        lag = float(detail.split()[2])
        assert CRDT_SETTLE_SECONDS <= lag < 30

        sync = SessionSync(stores["primary"], stores["secondary"])
        assert sync.step(block=None) == 1
        time.sleep(CRDT_SETTLE_SECONDS + 0.2)  # the merge touched the session: let it settle
        assert checker.check(part) == (
            True, "lag primary→secondary 0.00 s (max 5), 0/1 recent sessions divergent"
        )  # fmt: skip
    db.close()
    for store in stores.values():
        store.client.close()
