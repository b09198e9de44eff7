"""An acknowledged index write survives the Redis primary's death: with `redis.min_replicas_ack`
the delta-log append returns only once the replica holds it (WAIT), and without the replica it
is reported as not acknowledged, never as done. Real primary + replica, real Milvus Lite."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import redis
import yaml
from typer.testing import CliRunner

from redline.cli.main import app as cli_app
from redline.devstack.processes import Service, free_port
from redline.platform.index import AppendNotAcknowledgedError, DeltaLog, DeltaLogError
from tests.support.index import close_index, open_index
from tests.support.replicas import MASTER as SENTINEL_MASTER
from tests.support.replicas import Replicated, replicated_redis, sentinels_without_primary

pytestmark = pytest.mark.integration

DIM = 8
TIMEOUT_MS = 300


@pytest.fixture()
def pair(tmp_path: Path) -> Iterator[Replicated]:
    with replicated_redis(tmp_path) as running:
        yield running


def _vector(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def _replica_ids(replica: Service, stream: str) -> list[str]:
    client = redis.Redis.from_url(replica.extra["url"])
    try:
        entries = cast(list[tuple[bytes, Any]], client.xrange(stream))
        return [sid.decode() for sid, _ in entries]
    finally:
        client.close()


def test_an_acknowledged_append_is_already_on_the_replica(pair: Replicated) -> None:
    client = redis.Redis.from_url(pair.url)
    log = DeltaLog(client, "acked", DIM, min_replicas_ack=1, ack_timeout_ms=2000)
    assert pair.replica is not None
    for batch in range(5):
        appended = log.append(
            [("upsert", f"doc-{batch}-{i}", _vector(i)) for i in range(20)], "eu", batch
        )
        # WAIT returned: the replica holds every entry before the caller hears "appended".
        on_replica = set(_replica_ids(pair.replica, log.stream_key))
        assert {sid for sid, _ in appended} <= on_replica
    client.close()


def test_without_the_replica_the_append_is_not_acknowledged(pair: Replicated) -> None:
    client = redis.Redis.from_url(pair.url)
    log = DeltaLog(client, "unacked", DIM, min_replicas_ack=1, ack_timeout_ms=TIMEOUT_MS)
    pair.stop_replica()
    started = time.monotonic()
    with pytest.raises(AppendNotAcknowledgedError, match=r"only 0 of 1 replica.*min_replicas_ack"):
        log.append([("upsert", "doc-1", _vector(1)), ("delete", "doc-2", None)], "eu", 1)
    assert time.monotonic() - started >= TIMEOUT_MS / 1000 * 0.9  # WAIT waited its timeout
    try:
        log.append([("upsert", "doc-3", _vector(3))], "eu", 2)
    except AppendNotAcknowledgedError as exc:
        # The entries are in the primary's log (not lost, just not acknowledged).
        assert [sid for sid, _ in exc.appended] == [log.last_id()]
    else:
        pytest.fail("an append without a replica was acknowledged")
    # A ConnectionError: whoever answers 503 on an unreachable Redis does so here too.
    assert issubclass(AppendNotAcknowledgedError, redis.ConnectionError)
    # The replica back: acknowledged again (a roomy timeout: right after its sync the replica
    # forks for its first AOF rewrite, which a loaded machine makes slow).
    pair.start_replica()
    log.ack_timeout_ms = 5000
    assert log.append([("upsert", "doc-4", _vector(4))], "eu", 3)
    client.close()


def test_without_acknowledgements_asked_nothing_waits(pair: Replicated) -> None:
    client = redis.Redis.from_url(pair.url)
    pair.stop_replica()
    started = time.monotonic()
    DeltaLog(client, "plain", DIM).append([("upsert", "doc-1", _vector(1))], "eu", 1)
    assert time.monotonic() - started < 0.25
    with pytest.raises(DeltaLogError, match="min_replicas_ack"):
        DeltaLog(client, "bad", DIM, min_replicas_ack=-1)
    client.close()


def test_the_writer_applies_an_unacknowledged_write_and_reports_it(
    pair: Replicated, milvus_service: Service
) -> None:
    index = open_index(pair.url, milvus_service.extra["uri"], "unacked_writer", DIM, "eu")
    try:
        index.writer.log.min_replicas_ack = 1
        index.writer.log.ack_timeout_ms = 5000
        acked = index.writer.upsert("doc-ok", _vector(1))
        assert acked.applied
        pair.stop_replica()
        index.writer.log.ack_timeout_ms = TIMEOUT_MS
        with pytest.raises(AppendNotAcknowledgedError, match="not acknowledged"):
            index.writer.upsert("doc-unacked", _vector(2))
        # In the log and on the primary: the copies agree whether or not the entry survives.
        entries = index.log.read_after("0-0", 10)
        assert [e.id for e in entries] == ["doc-ok", "doc-unacked"]
        rows = index.primary.client().get(index.primary.collection, ids=["doc-unacked"])
        assert len(rows) == 1
    finally:
        close_index(index)


def test_index_write_demo_takes_the_specs_setting(
    pair: Replicated, milvus_service: Service, tmp_path: Path
) -> None:
    spec = yaml.safe_load((Path(__file__).parents[3] / "slo/specs/default.yaml").read_text())
    spec["redis"] = {"min_replicas_ack": 1, "ack_timeout_ms": 3000}
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    config = tmp_path / "index.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "redis_url": pair.url,
                "spec": str(spec_path),
                "collection": "cliacked",
                "dim": DIM,
                "primary_uri": milvus_service.extra["uri"],
                "primary_collection": "cliacked_p",
                "replica_uri": milvus_service.extra["uri"],
                "replica_collection": "cliacked_r",
            }
        )
    )
    runner = CliRunner()
    args = ["index", "write-demo", "--config", str(config), "--count", "3", "--batch", "3"]
    done = runner.invoke(cli_app, args)
    assert done.exit_code == 0, done.output
    pair.stop_replica()
    refused = runner.invoke(cli_app, args)
    assert refused.exit_code == 1, refused.output
    assert "AppendNotAcknowledgedError" in refused.output
    assert "not acknowledged" in refused.output


def test_index_commands_refuse_a_sentinel_url_they_cannot_use(tmp_path: Path) -> None:
    runner = CliRunner()
    dead = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/redline/0"
    refused = runner.invoke(cli_app, ["index", "status", "--redis-url", dead])
    assert refused.exit_code == 2, refused.output
    assert "redis_url" in refused.output and "no sentinel reachable" in refused.output
    with sentinels_without_primary(tmp_path) as url:
        unknown = runner.invoke(cli_app, ["index", "status", "--redis-url", url.replace(
            f"/{SENTINEL_MASTER}/", "/nope/")])  # fmt: skip
    assert unknown.exit_code == 2, unknown.output
    assert "unknown master name 'nope'" in unknown.output
