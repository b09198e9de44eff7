"""CRDT session sync between two regions' Redis (two databases of a real redis-server)."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from redline.devstack.processes import Process, spawn
from redline.platform import crdt
from redline.platform.session_sync import (
    CrdtLayout,
    CrdtSessionStore,
    SessionSync,
    WriteReceipt,
    divergent_sessions,
    measure_sync_lag,
    set_paused,
    wait_converged,
)
from redline.platform.sessions import open_redis


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll until `condition` holds; fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture()
def urls(redis_url: str) -> tuple[str, str]:
    """Region eu on db 0, region us on db 2 of the test's redis-server."""
    base = redis_url.rsplit("/", 1)[0]
    return f"{base}/0", f"{base}/2"


@pytest.fixture()
def regions(urls: tuple[str, str]) -> Iterator[tuple[CrdtSessionStore, CrdtSessionStore]]:
    """The two regions' stores."""
    clients = [open_redis(url, timeout_seconds=5.0) for url in urls]
    yield CrdtSessionStore(clients[0], "eu"), CrdtSessionStore(clients[1], "us")
    for client in clients:
        client.close()


def expected_state(receipts: list[WriteReceipt]) -> dict[str, crdt.SessionState]:
    """What the pure CRDT says each session holds after every acknowledged op."""
    states: dict[str, crdt.SessionState] = {}
    for receipt in receipts:
        states[receipt.session_id] = crdt.apply(
            states.get(receipt.session_id, crdt.EMPTY), receipt.op
        )
    return states


def test_lua_merge_delta_and_digest_agree_with_the_pure_crdt(
    regions: tuple[CrdtSessionStore, CrdtSessionStore],
) -> None:
    eu, us = regions
    rng = random.Random(3)
    elements = ["m:a", "m:b", "v:lang", "v:topic"]
    receipts: list[WriteReceipt] = []
    for n in range(200):
        store = rng.choice(regions)
        kind, name = rng.choice(elements).split(":")
        if kind == "m":
            if rng.random() < 0.7:
                receipts.append(store.add_message("s1", name, f"text {n} | with bars"))
            else:
                receipts.append(store.remove_message("s1", name))
        elif rng.random() < 0.7:
            receipts.append(store.set_variable("s1", name, f"value {n}"))
        else:
            receipts.append(store.unset_variable("s1", name))
        if rng.random() < 0.2:  # an occasional one-way delta sync
            src, dst = rng.sample(regions, 2)
            dst.merge_fields("s1", src.delta_since("s1", dst.version_vector("s1")))
    for src, dst in ((eu, us), (us, eu)):
        dst.merge_fields("s1", src.delta_since("s1", dst.version_vector("s1")))
    expected = expected_state(receipts)["s1"]
    for store in regions:
        state = store.state("s1")
        assert crdt.same_content(state, expected)
        assert state.clock == expected.clock
        assert store.digest("s1") == crdt.digest(expected)
    # Merging the same delta again changes nothing (idempotent in Redis too).
    assert us.merge_fields("s1", eu.delta_since("s1", {})) == 0


def test_concurrent_writers_in_both_regions_converge_with_every_acknowledged_op(
    regions: tuple[CrdtSessionStore, CrdtSessionStore],
) -> None:
    eu, us = regions
    syncs = [SessionSync(eu, us, block_ms=50), SessionSync(us, eu, block_ms=50)]
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,), daemon=True) for s in syncs]
    for thread in threads:
        thread.start()
    receipts: list[WriteReceipt] = []
    lock = threading.Lock()

    def writer(store: CrdtSessionStore, seed: int) -> None:
        rng = random.Random(seed)
        for n in range(300):
            session = f"s{rng.randrange(8)}"
            roll = rng.random()
            if roll < 0.6:
                r = store.add_message(session, f"{store.region}-{n}", f"hello {n}")
            elif roll < 0.7:
                # Both regions edit the same (shared) message ids: conflicting edits.
                r = store.add_message(session, f"shared-{rng.randrange(3)}", f"{store.region} {n}")
            elif roll < 0.8:
                r = store.remove_message(session, f"shared-{rng.randrange(3)}")
            else:
                r = store.set_variable(session, "topic", f"{store.region}-{n}")
            with lock:
                receipts.append(r)

    writers = [threading.Thread(target=writer, args=(s, i)) for i, s in enumerate(regions)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    sessions = {r.session_id for r in receipts}
    try:
        assert wait_converged(regions, sessions, timeout=20.0) is not None
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    expected = expected_state(receipts)
    for session in sessions:
        for store in regions:
            state = store.state(session)
            assert crdt.same_content(state, expected[session]), (store.region, session)
        own = [
            r.op.element.removeprefix("m:")
            for r in receipts
            if r.session_id == session and r.op.element.startswith(("m:eu-", "m:us-"))
        ]
        assert own  # (each session got some of its own messages)
        for store in regions:
            ids = {mid for mid, _ in crdt.messages(store.state(session))}
            assert set(own) <= ids  # no acknowledged message lost (none of these is removed)
    assert divergent_sessions(regions, window_seconds=60, settle_seconds=0)[0] == []
    assert measure_sync_lag(eu, us).lag_seconds == 0.0
    assert measure_sync_lag(us, eu).lag_seconds == 0.0


def test_pause_flag_holds_the_sync_and_the_lag_grows_until_resumed(
    regions: tuple[CrdtSessionStore, CrdtSessionStore],
) -> None:
    eu, us = regions
    sync = SessionSync(eu, us, block_ms=20)
    set_paused(us.client, True)
    eu.add_message("p1", "m1", "during the partition")
    assert sync.step() == 0
    time.sleep(0.3)
    lag = measure_sync_lag(eu, us)
    assert lag.lag_seconds >= 0.25 and lag.oldest_unsynced_id is not None
    assert divergent_sessions(regions, window_seconds=60, settle_seconds=0)[0] == ["p1"]
    set_paused(us.client, False)
    assert sync.step() == 1
    assert crdt.messages(us.state("p1")) == [("m1", "during the partition")]
    assert measure_sync_lag(eu, us).lag_seconds == 0.0


def _sync_process(
    tmp_path: Path, urls: tuple[str, str], delay: float, name: str
) -> tuple[Process, Path]:
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "redis_url": urls[1],
                "source_url": urls[0],
                "region": "us",
                "source_region": "eu",
                "sync_batch_size": 500,
                "sync_session_delay_seconds": delay,
            }
        )
    )
    argv = [sys.executable, "-m", "redline.cli", "sessions", "sync", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")}
    log = tmp_path / f"{name}.log"
    return spawn(argv, log, env), log


def test_a_sync_killed_mid_batch_resumes_without_loss_or_duplicates(
    regions: tuple[CrdtSessionStore, CrdtSessionStore], urls: tuple[str, str], tmp_path: Path
) -> None:
    eu, us = regions
    receipts = []
    for n in range(60):
        receipts.append(eu.add_message(f"k{n}", f"m{n}", f"first {n}"))
        receipts.append(eu.add_message(f"k{n}", f"n{n}", f"second {n}"))
        receipts.append(eu.set_variable(f"k{n}", "lang", "en"))
    checkpoint = us.layout.checkpoint_key("eu")
    slow, log = _sync_process(tmp_path, urls, delay=0.05, name="slow")
    try:
        # Mid-batch: some sessions merged into us, the batch's checkpoint not yet written.
        wait_for(
            lambda: us.client.zcard(us.layout.sessions_key) >= 10,
            30.0,
            f"the slow sync to merge some sessions ({log.read_text()[-500:]})",
        )
        assert us.client.get(checkpoint) is None
        slow.signal(signal.SIGKILL)
        wait_for(lambda: not slow.alive(), 5.0, "the killed sync to exit")
    finally:
        if slow.alive():
            slow.signal(signal.SIGKILL)
    merged_before = us.client.zcard(us.layout.sessions_key)
    assert 10 <= merged_before < 60
    assert us.client.get(checkpoint) is None
    fresh, log = _sync_process(tmp_path, urls, delay=0.0, name="fresh")
    try:
        sessions = {r.session_id for r in receipts}
        assert wait_converged(regions, sessions, timeout=30.0) is not None, log.read_text()
        wait_for(lambda: us.client.get(checkpoint) is not None, 10.0, "the checkpoint")
    finally:
        fresh.signal(signal.SIGTERM)
        wait_for(lambda: not fresh.alive(), 10.0, "the sync to stop")
    expected = expected_state(receipts)
    for n in range(60):
        state = us.state(f"k{n}")
        assert crdt.same_content(state, expected[f"k{n}"])
        assert crdt.messages(state) == [(f"m{n}", f"first {n}"), (f"n{n}", f"second {n}")]
        fields = us.client.hkeys(us.layout.state_key(f"k{n}"))
        assert len([f for f in fields if str(f).startswith("a:m:")]) == 2  # no duplicate
    assert "session sync eu->us stopped" in log.read_text()


def test_an_op_missing_from_the_stream_travels_with_the_sessions_next_change(
    regions: tuple[CrdtSessionStore, CrdtSessionStore],
) -> None:
    eu, us = regions
    sync = SessionSync(eu, us, block_ms=20)
    eu.add_message("lost", "m1", "kept")
    # A writer killed between its script and its XADD: the op is in the state only.
    eu.client.delete(eu.layout.stream("eu"))
    eu.add_message("lost", "m2", "next")
    sync.step()
    assert [m for m, _ in crdt.messages(us.state("lost"))] == ["m1", "m2"]


def test_keys_of_a_session_share_one_hash_tag() -> None:
    key = CrdtLayout().state_key("user-42")
    assert key == "crdt:{user-42}:state"
    with pytest.raises(crdt.CrdtError):
        CrdtLayout().state_key("a}b")
