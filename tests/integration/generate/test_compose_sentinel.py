"""compose-as-processes with the Sentinel topology: `redline compose init --demo --redis sentinel`
selects the `ha` profile; its replica and three Sentinels run from the compose file's own
commands and the config files init wrote (tests/support/compose_processes.py says how), with the
receiver, the gateway and the session CDC consumer configured with the `redis+sentinel://` URL.
They connect through the Sentinels, and when the primary is SIGKILLed the Sentinels promote the
replica and the receiver accepts alerts again, answering 503 (never 500) in between."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import redis
import yaml

from redline.generate.compose_config import SENTINEL_MASTER, SENTINELS
from tests.support.compose_processes import ComposeRun, run_compose, wait_for
from tests.support.remediation import alert, payload

pytestmark = pytest.mark.integration

HA = {"redis-replica", *SENTINELS}
CLIENTS = {"remediation", "gateway", "session-replica"}
SENTINEL_PORT = 26379


@pytest.fixture(scope="module")
def ha_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeRun]:
    root = tmp_path_factory.mktemp("compose-ha")
    yield from run_compose(root, ("--redis", "sentinel"), only=HA | CLIENTS)


def _sentinel(run: ComposeRun, name: str) -> redis.Redis:
    return redis.Redis(run.addresses[name], SENTINEL_PORT, decode_responses=True, socket_timeout=2)


def _master(run: ComposeRun) -> str:
    client = _sentinel(run, SENTINELS[0])
    try:
        found = cast(tuple[str, int], client.sentinel_get_master_addr_by_name(SENTINEL_MASTER))
        return found[0]
    finally:
        client.close()


def _post(run: ComposeRun, fingerprint: str) -> httpx.Response:
    token = (run.compose_dir / "secrets" / "webhook-token").read_text().strip()
    return httpx.post(
        f"{run.url('remediation', 9095)}/alerts",
        json=payload(alert(fingerprint, playbook="compose-ha-check")),
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_the_ha_profile_runs_a_replica_and_three_sentinels(ha_run: ComposeRun) -> None:
    assert set(ha_run.started) == {"redis", *HA, *CLIENTS}
    env = (ha_run.compose_dir / ".env").read_text()
    assert env.strip().endswith("COMPOSE_PROFILES=demo,ha,milvus")
    for name in ("remediation.yml", "gateway.yml", "sessions.yml"):
        settings = yaml.safe_load((ha_run.compose_dir / "config" / name).read_text())
        assert settings["redis_url"].startswith("redis+sentinel://sentinel-1:26379,"), name

    def discovered() -> bool:
        for name in SENTINELS:
            client = _sentinel(ha_run, name)
            try:
                state = cast(dict[str, Any], client.sentinel_master(SENTINEL_MASTER))
            finally:
                client.close()
            # The primary by its announced name (an address here), its replica and the peers.
            if state["ip"] != ha_run.addresses["redis"] or state["num-slaves"] != 1:
                return False
            if state["num-other-sentinels"] != 2:
                return False
        return True

    wait_for(discovered, 60.0, "every Sentinel to know the primary, its replica and its peers")


def test_the_services_connect_through_the_sentinels(ha_run: ComposeRun) -> None:
    ready = httpx.get(f"{ha_run.url('remediation', 9095)}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    health = httpx.get(f"{ha_run.url('gateway', 8080)}/healthz", timeout=10).json()
    assert health["routing_store_up"] is True
    answer = _post(ha_run, "c0ffee0000000001")
    assert answer.status_code == 202, answer.text
    # The job is on the primary the Sentinels name (what the URL resolves to).
    primary = redis.Redis(_master(ha_run), 6379, decode_responses=True)
    try:
        assert any("jobs" in key for key in primary.scan_iter(count=1000))
    finally:
        primary.close()


def test_a_killed_primary_is_replaced_and_the_receiver_follows(ha_run: ComposeRun) -> None:
    old = ha_run.addresses["redis"]
    assert _master(ha_run) == old
    primary = redis.Redis(old, 6379)
    before = _post(ha_run, "c0ffee0000000002")
    assert before.status_code == 202, before.text
    assert primary.wait(1, 5000) == 1  # the replica holds the job before the kill
    primary.close()
    ha_run.started["redis"].kill()
    killed_at = time.monotonic()
    statuses: list[int] = []
    deadline = killed_at + 90.0
    index = 0
    while True:
        index += 1
        answer = _post(ha_run, f"c0ffee1{index:011x}")
        statuses.append(answer.status_code)
        if answer.status_code == 202:
            break
        assert answer.status_code == 503, answer.text  # never a 500
        assert answer.headers["Retry-After"] == "1"
        assert time.monotonic() < deadline, f"no 202 within 90 s of the kill: {statuses}"
        time.sleep(0.5)
    assert _master(ha_run) == ha_run.addresses["redis-replica"]
    # What was acknowledged before the kill is on the promoted replica.
    token = (ha_run.compose_dir / "secrets" / "webhook-token").read_text().strip()
    jobs = httpx.get(
        f"{ha_run.url('remediation', 9095)}/jobs",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()["jobs"]
    fingerprints = {job["alert"]["fingerprint"] for job in jobs}
    assert {"c0ffee0000000001", "c0ffee0000000002"} <= fingerprints
    print(f"failover: 202 again {time.monotonic() - killed_at:.1f} s after the kill, "
          f"{statuses.count(503)} answers 503")  # fmt: skip
