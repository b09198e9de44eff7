"""A real local Redis Cluster for tests: cluster-enabled redis-servers on loopback, on free ports,
in temp dirs, joined by `redis-cli --cluster create` (or by hand, with slots left out).

Started through the devstack's spawner (`start_service`), like `start_redis`, so a node that
fails to start names its log; `stop()` stops every node.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from redline.devstack.processes import (
    Service,
    ServiceError,
    find_binary,
    free_port,
    start_service,
)

HOST = "127.0.0.1"
SLOTS = 16384
NODE_TIMEOUT_MS = 2000
"""`cluster-node-timeout`: short, so a cluster of fresh nodes settles quickly."""


@dataclass
class LocalCluster:
    """The nodes of a local Redis Cluster and how to reach them."""

    nodes: list[Service] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        """`host:port` of every node."""
        return [f"{node.host}:{node.port}" for node in self.nodes]

    @property
    def url(self) -> str:
        """The `redis+cluster://` URL naming every node as a start-up node."""
        return f"redis+cluster://{','.join(self.addresses)}/"

    def client(self, node: int) -> redis.Redis:
        """A plain client of one node (its own view of the cluster)."""
        service = self.nodes[node]
        return redis.Redis(host=service.host, port=service.port, socket_timeout=5.0)

    def flush(self) -> None:
        """FLUSHALL and SCRIPT FLUSH on every node (each holds its own slots' keys), so every
        test starts with nodes that know no script, as after a restart."""
        for index in range(len(self.nodes)):
            client = self.client(index)
            try:
                client.flushall()
                client.script_flush()
            finally:
                client.close()

    def stop(self) -> None:
        """Stop every node."""
        for node in reversed(self.nodes):
            node.stop()


def _node_ready(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        client = redis.Redis(host=host, port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    return check


def start_cluster_node(workdir: Path, port: int | None = None, host: str = HOST) -> Service:
    """One `redis-server --cluster-enabled yes` node, no persistence, in `workdir`.

    The cluster bus gets a free port of its own (`cluster-port`): the default, port + 10000,
    limits the port to 55535 and may be taken."""
    port = port or free_port(host)
    bus = free_port(host)
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        find_binary("redis-server"),
        "--cluster-enabled", "yes",
        "--cluster-config-file", str(workdir / "nodes.conf"),
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        "--cluster-port", str(bus),
        "--port", str(port),
        "--bind", host,
        "--dir", str(workdir),
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
    ]  # fmt: skip
    log = workdir / "redis-cluster-node.log"
    node = start_service("redis-cluster-node", argv, log, port, _node_ready(host, port), host=host)
    node.extra["bus_port"] = str(bus)
    return node


def cluster_info(client: redis.Redis) -> dict[str, str]:
    """CLUSTER INFO of one node as a dict of strings."""
    raw = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
    if isinstance(raw, dict):  # redis-py parses the reply already
        return {str(name): _text(value) for name, value in raw.items()}
    fields = (line.split(":", 1) for line in _text(raw).splitlines() if ":" in line)
    return {name.strip(): value.strip() for name, value in fields}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def wait_settled(
    cluster: LocalCluster, state: str, slots: int, timeout: float = 30.0
) -> dict[str, str]:
    """Wait until every node knows every other and reports `state` with `slots` assigned; the
    last node's CLUSTER INFO. ServiceError naming what each node said on timeout."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        seen = []
        for index in range(len(cluster.nodes)):
            client = cluster.client(index)
            try:
                seen.append(cluster_info(client))
            except redis.RedisError:
                seen.append({})
            finally:
                client.close()
        if all(
            info.get("cluster_state") == state
            and info.get("cluster_slots_assigned") == str(slots)
            and info.get("cluster_known_nodes") == str(len(cluster.nodes))
            for info in seen
        ):
            return seen[-1]
        time.sleep(0.05)
    raise ServiceError(
        f"Redis Cluster not settled ({state}, {slots} slots) after {timeout} s: {seen}"
    )


def _start_nodes(workdir: Path, count: int) -> LocalCluster:
    cluster = LocalCluster()
    try:
        for index in range(count):
            cluster.nodes.append(start_cluster_node(workdir / f"node-{index}"))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_redis_cluster(workdir: Path, primaries: int = 3) -> LocalCluster:
    """`primaries` nodes joined by `redis-cli --cluster create` (no replicas), every slot
    assigned, `cluster_state:ok` on every node."""
    cluster = _start_nodes(workdir, primaries)
    try:
        argv = [find_binary("redis-cli"), "--cluster", "create", *cluster.addresses,
                "--cluster-replicas", "0", "--cluster-yes"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise ServiceError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        wait_settled(cluster, "ok", SLOTS)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_partial_cluster(workdir: Path, ranges: Sequence[tuple[int, int] | None]) -> LocalCluster:
    """A cluster whose node i holds the slot range `ranges[i]` (None: no slots), joined by
    CLUSTER MEET and ADDSLOTSRANGE: a cluster without the right slots when they leave gaps."""
    cluster = _start_nodes(workdir, len(ranges))
    try:
        first = cluster.client(0)
        try:
            for node in cluster.nodes[1:]:
                first.execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER MEET", node.host, node.port, node.extra["bus_port"]
                )
        finally:
            first.close()
        assigned = 0
        for index, span in enumerate(ranges):
            if span is None:
                continue
            client = cluster.client(index)
            try:
                client.execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER ADDSLOTSRANGE", span[0], span[1]
                )
            finally:
                client.close()
            assigned += span[1] - span[0] + 1
        wait_settled(cluster, "ok" if assigned == SLOTS else "fail", assigned)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def node_id(client: redis.Redis) -> str:
    """The node's own id (CLUSTER MYID)."""
    raw = client.execute_command("CLUSTER MYID")  # type: ignore[no-untyped-call]
    return _text(raw)


def add_replica(
    cluster: LocalCluster, workdir: Path, primary: int, timeout: float = 30.0
) -> Service:
    """A new node joined as the replica of node `primary`, in sync (`master_link_status:up`).

    It is appended to `cluster.nodes` (so `stop()` stops it); `flush()` on such a cluster fails
    (a replica refuses FLUSHALL): give it a cluster of its own.
    """
    replica = start_cluster_node(workdir)
    cluster.nodes.append(replica)
    leader = cluster.client(primary)
    joined = cluster.client(len(cluster.nodes) - 1)
    try:
        owner = node_id(leader)
        leader.execute_command(  # type: ignore[no-untyped-call]
            "CLUSTER MEET", replica.host, replica.port, replica.extra["bus_port"]
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                joined.execute_command("CLUSTER REPLICATE", owner)  # type: ignore[no-untyped-call]
                break
            except redis.ResponseError:  # the new node does not know the primary yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        while joined.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise ServiceError(f"replica {replica.port} never synced with node {primary}")
            time.sleep(0.1)
    finally:
        leader.close()
        joined.close()
    return replica
