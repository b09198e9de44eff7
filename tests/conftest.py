"""Shared fixtures (real services started on loopback, on free ports, in temp dirs) and the
marks every test gets from its directory: `unit`, `integration` or `e2e`.

`--e2e=without` leaves the e2e drills out and `--e2e=only` runs nothing else: `make test` runs
the rest in parallel workers first, then the drills in one process, since they share one local
stack and their deadlines must not compete with other tests for the cores.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redline.devstack.processes import Service, start_milvus_lite, start_redis
from redline.devstack.tether import claim_ownership, reap_orphans

TESTS = Path(__file__).resolve().parent
KINDS = ("unit", "integration", "e2e")
"""The test directories; each names the mark its tests get."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--e2e=with|without|only`: run the e2e drills too (default), leave them out, or only them."""
    parser.addoption(
        "--e2e",
        choices=("with", "without", "only"),
        default="with",
        help="with (default), without or only the tests under tests/e2e",
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"pytest interrupted by {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """Nothing a test starts outlives the run: SIGTERM and SIGHUP end it as Ctrl-C does (the
    fixtures tear down), and this process owns every process started under it, so a worker or
    a whole run killed outright is cleaned up by its tether (`redline.devstack.tether`). The
    first process of a run also stops what an earlier run killed outright left behind."""
    if not hasattr(config, "workerinput"):
        reap_orphans()
    claim_ownership()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


def kind_of(item: pytest.Item) -> str | None:
    """`unit`, `integration` or `e2e`: the directory under tests/ the test lives in."""
    if not item.path.is_relative_to(TESTS):
        return None
    kind = item.path.relative_to(TESTS).parts[0]
    return kind if kind in KINDS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its directory; keep or drop the e2e tests as `--e2e` says."""
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        kind = kind_of(item)
        if kind is not None:
            item.add_marker(kind)
        # The e2e tests share one session-scoped stack: under xdist (`--dist loadgroup`) they
        # all run in the same worker.
        if kind == "e2e" and grouped:
            item.add_marker(pytest.mark.xdist_group("e2e"))
    wanted = config.getoption("--e2e")
    if wanted == "with":
        return
    keep, dropped = [], []
    for item in items:
        is_e2e = kind_of(item) == "e2e"
        (keep if is_e2e == (wanted == "only") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def redis_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One real redis-server for the session."""
    service = start_redis(tmp_path_factory.mktemp("redis"))
    yield service
    service.stop()


@pytest.fixture()
def redis_url(redis_service: Service) -> Iterator[str]:
    """A redis URL on a freshly flushed database."""
    url = redis_service.extra["url"]
    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()
    yield url


@pytest.fixture(scope="session")
def milvus_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One real Milvus Lite server for the session; tests use their own collection names."""
    service = start_milvus_lite(tmp_path_factory.mktemp("milvus"))
    yield service
    service.stop()


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    """A per-test scratch directory."""
    return tmp_path
