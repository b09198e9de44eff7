"""Shared fixtures: real services started on loopback, on free ports, in temp dirs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redline.devstack.processes import Service, start_milvus_lite, start_redis


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
