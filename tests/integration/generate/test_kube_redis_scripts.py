"""The container scripts of deploy/kubernetes/redis-sentinel, as committed, run as they are: three
"pods" on three loopback addresses standing for the pods' DNS names, each a redis container and a
sentinel container started in the StatefulSet's order (`OrderedReady`). redis-0 becomes the
primary, the others its replicas, the Sentinels find each other; redline's connection factory
reaches the primary through them with the URL docs/kubernetes.md gives; a SIGKILLed primary is
replaced, and its pod restarted rejoins as a replica of the new one."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import yaml

from redline.core.redisconn import check_redis, open_redis, wait_for_replicas
from redline.devstack.processes import Service, find_binary, free_port, start_service
from redline.generate.kube_redis import REDIS_SENTINEL_DIR, SENTINEL_MASTER

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "s3cret-redis-password"
PODS = 3


def _scripts() -> dict[str, str]:
    configmap = yaml.safe_load((ROOT / REDIS_SENTINEL_DIR / "scripts-configmap.yaml").read_text())
    return cast(dict[str, str], configmap["data"])


def _prefix() -> str:
    """A 127.X.Y prefix nobody listens on (three pods: .1, .2, .3)."""
    rng = random.Random()
    for _ in range(50):
        prefix = f"127.{rng.randint(100, 250)}.{rng.randint(1, 250)}"
        with socket.socket() as probe:
            probe.settimeout(0.2)
            if probe.connect_ex((f"{prefix}.1", 6379)) != 0:
                return prefix
    raise AssertionError("no free 127.X.Y prefix")


def _ping(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        client = redis.Redis(host, port, password=PASSWORD, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    return check


@dataclass
class Pods:
    """Three pods' worth of containers: their addresses, ports and running scripts."""

    root: Path
    hosts: list[str]
    redis_port: int
    sentinel_port: int
    scripts: dict[str, str]
    running: dict[str, Service] = field(default_factory=dict)

    def env(self, index: int, container: str) -> dict[str, str]:
        """The container's environment, as the StatefulSet gives it (names -> addresses)."""
        pod = self.root / f"pod-{index}"
        (pod / "data").mkdir(parents=True, exist_ok=True)
        (pod / container).mkdir(parents=True, exist_ok=True)
        return {
            "PATH": os.environ["PATH"],
            "REDIS_SELF": self.hosts[index],
            "REDIS_PEERS": " ".join(self.hosts),
            "REDIS_PASSWORD": PASSWORD,
            "REDIS_BIND": self.hosts[index],
            "REDIS_PORT": str(self.redis_port),
            "SENTINEL_PORT": str(self.sentinel_port),
            "REDIS_DATA": str(pod / "data"),
            "CONF_DIR": str(pod / container),
        }

    def start(self, index: int, container: str) -> Service:
        """Run one container's script (`redis` or `sentinel`) until it answers PING."""
        script = self.root / f"{container}.sh"
        script.write_text(self.scripts[f"{container}.sh"])
        port = self.redis_port if container == "redis" else self.sentinel_port
        name = f"pod-{index}-{container}"
        service = start_service(
            name,
            [find_binary("sh"), str(script)],
            self.root / f"{name}.log",
            port,
            _ping(self.hosts[index], port),
            host=self.hosts[index],
            env=self.env(index, container),
        )
        self.running[name] = service
        return service

    def sentinel(self, index: int) -> redis.Redis:
        """A client of pod `index`'s Sentinel."""
        return redis.Redis(
            self.hosts[index], self.sentinel_port, password=PASSWORD, decode_responses=True
        )

    def states(self) -> list[dict[str, Any]]:
        """Each Sentinel's view of the master."""
        found = []
        for index in range(PODS):
            client = self.sentinel(index)
            try:
                found.append(cast(dict[str, Any], client.sentinel_master(SENTINEL_MASTER)))
            finally:
                client.close()
        return found

    def url(self, database: int = 0) -> str:
        """The URL of docs/kubernetes.md, with these pods' addresses for their names."""
        hosts = ",".join(f"{host}:{self.sentinel_port}" for host in self.hosts)
        return (
            f"redis+sentinel://:{PASSWORD}@{hosts}/{SENTINEL_MASTER}/{database}"
            f"?sentinel_password={PASSWORD}"
        )


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s: {what}"
        time.sleep(0.2)


@pytest.fixture()
def pods(tmp_path: Path) -> Iterator[Pods]:
    prefix = _prefix()
    running = Pods(
        tmp_path,
        [f"{prefix}.{i + 1}" for i in range(PODS)],
        free_port(),
        free_port(),
        _scripts(),
    )
    try:
        for index in range(PODS):  # OrderedReady: pod by pod, each ready before the next
            running.start(index, "redis")
            running.start(index, "sentinel")
        yield running
    finally:
        for service in reversed(list(running.running.values())):
            service.kill()


def _settled(pods: Pods, primary: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            states = pods.states()
        except (redis.RedisError, OSError):
            return False
        return all(
            s["ip"] == primary and s["num-slaves"] == PODS - 1 and s["num-other-sentinels"] == 2
            and not s["is_sdown"]
            for s in states
        )  # fmt: skip

    return check


def test_the_first_pod_is_the_primary_and_redline_reaches_it_through_the_sentinels(
    pods: Pods,
) -> None:
    _wait(_settled(pods, pods.hosts[0]), 60, "3 Sentinels agreeing on pod-0 and its 2 replicas")
    check_redis(pods.url())  # the start-up check every redline service runs
    client = open_redis(pods.url(), decode_responses=True)
    try:
        client.set("k8s:probe", "1")
        assert wait_for_replicas(client, 2, 5000) == 2  # min_replicas_ack up to 2 holds
        replica = redis.Redis(pods.hosts[1], pods.redis_port, password=PASSWORD)
        assert replica.info("replication")["role"] == "slave"
        replica.close()
    finally:
        client.close()
    # The configuration redline needs: persistence, no eviction, keyspace events.
    primary = redis.Redis(pods.hosts[0], pods.redis_port, password=PASSWORD, decode_responses=True)
    config = primary.config_get("*")
    primary.close()
    assert config["appendonly"] == "yes" and config["maxmemory-policy"] == "noeviction"
    assert set("Exge") <= set(config["notify-keyspace-events"].replace("A", "g$lshzxe"))


def test_a_killed_primary_is_replaced_and_rejoins_as_a_replica(pods: Pods) -> None:
    _wait(_settled(pods, pods.hosts[0]), 60, "the set to settle on pod-0")
    client = open_redis(pods.url(), decode_responses=True, socket_timeout=1.0)
    client.set("before", "1")
    assert wait_for_replicas(client, 2, 5000) == 2
    pods.running["pod-0-redis"].kill()
    promoted: list[str] = []

    def replaced() -> bool:
        try:
            host, _ = pods.sentinel(1).sentinel_get_master_addr_by_name(SENTINEL_MASTER)
        except (redis.RedisError, OSError):
            return False
        if host == pods.hosts[0]:
            return False
        promoted.append(str(host))
        return True

    _wait(replaced, 60, "a Sentinel failover away from the killed pod-0")
    deadline = time.monotonic() + 30
    while True:  # the factory follows: writes land on the promoted replica
        try:
            client.set("after", "1")
            break
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            assert time.monotonic() < deadline, "no write after the failover"
            time.sleep(0.2)
    assert client.get("before") == "1"  # acknowledged by both replicas before the kill
    # pod-0's redis container restarts: it asks the Sentinels and replicates the new primary.
    pods.start(0, "redis")
    _wait(_settled(pods, promoted[-1]), 60, "pod-0 back as a replica of the new primary")
    old = redis.Redis(pods.hosts[0], pods.redis_port, password=PASSWORD, decode_responses=True)
    try:
        assert old.info("replication")["role"] == "slave"
        _wait(lambda: old.get("after") == "1", 30, "pod-0 to hold the write made after")
    finally:
        old.close()
        client.close()


@pytest.mark.parametrize("script", ["redis.sh", "sentinel.sh"])
def test_the_scripts_parse_in_posix_sh(script: str) -> None:
    done = subprocess.run(
        [find_binary("sh"), "-n"], input=_scripts()[script], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
