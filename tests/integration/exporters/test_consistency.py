"""The consistency probe against two real simulators (one per region) and a real embedding API.

The simulators answer every golden prompt with its reference, so the regions agree; an accuracy
fault on the secondary's serving version makes it answer the known wrong answers instead, and the
figures are checked against what those texts give, computed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.exporters.consistency import (
    ConsistencyError,
    ConsistencyProbe,
    EmbeddingClient,
    EmbeddingEndpointSettings,
)
from redline.exporters.probe import ProbeCache, Sample
from redline.platform.golden import GOLDEN_SET, embed
from redline.slo import catalog

pytestmark = pytest.mark.integration

MODEL = "redline-base"
WRONG_ALL = {"versions": {"base": {"wrong_answer_probability": 1.0}}}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, ServerThread]]:
    servers = {
        region: serve_in_thread(build_simulator_app(SimulatorSettings(region=region, seed=i)))
        for i, region in enumerate(("primary", "secondary"))
    }
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture()
def urls(sims: dict[str, ServerThread]) -> Iterator[dict[str, str]]:
    found = {region: server.url for region, server in sims.items()}
    for url in found.values():
        httpx.post(f"{url}/admin/faults", json={}).raise_for_status()
    yield found
    for url in found.values():
        httpx.post(f"{url}/admin/faults", json={}).raise_for_status()


def _probe(urls: dict[str, str], embeddings: EmbeddingClient | None = None) -> ConsistencyProbe:
    return ConsistencyProbe(
        MODEL,
        ("primary", urls["primary"]),
        [("secondary", urls["secondary"])],
        max_tokens=32,
        embeddings=embeddings,
    )


def _values(samples: list[Sample]) -> dict[str, float]:
    out = {}
    for sample in samples:
        assert sample.labels == {"model": MODEL, "region": "secondary"}
        out[sample.name] = sample.value
    return out


def _wrong_similarities(dims: int = 256) -> list[float]:
    return [float(np.dot(embed(i.reference, dims), embed(i.wrong, dims))) for i in GOLDEN_SET]


def test_regions_that_answer_alike_agree_fully(urls: dict[str, str]) -> None:
    probe = _probe(urls)
    try:
        got = _values(probe.run())
    finally:
        probe.close()
    assert got == {
        catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO.family: 1.0,
        catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY.family: 1.0,
        catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN.family: 1.0,
    }


def test_a_region_answering_differently_falls_below_the_bar(urls: dict[str, str]) -> None:
    httpx.post(f"{urls['secondary']}/admin/faults", json=WRONG_ALL).raise_for_status()
    probe = _probe(urls)
    try:
        got = _values(probe.run())
    finally:
        probe.close()
    expected = _wrong_similarities()
    assert got[catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO.family] == 0.0
    mean = got[catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY.family]
    assert mean == pytest.approx(float(np.mean(expected)))
    assert mean < 0.97
    assert got[catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN.family] == pytest.approx(
        min(expected)
    )


def test_a_region_that_does_not_answer_fails_the_run_and_drops_the_gauges(
    urls: dict[str, str],
) -> None:
    probe = _probe(urls)
    cache = ProbeCache([probe])
    registry = CollectorRegistry()
    registry.register(cache)
    try:
        cache.run(probe.name)
        assert cache.status()[probe.name]["success"]
        httpx.post(
            f"{urls['secondary']}/admin/faults", json={"outage": "unavailable"}
        ).raise_for_status()
        with pytest.raises(ConsistencyError, match="secondary"):
            probe.run()
        cache.run(probe.name)
    finally:
        probe.close()
    assert not cache.status()[probe.name]["success"]
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    assert not families[catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY.name].samples


@pytest.fixture()
def embedder() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real OpenAI-compatible `/v1/embeddings` server (64-dim n-gram vectors), recording what
    it was asked."""
    seen: list[dict[str, Any]] = []
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append({"auth": request.headers.get("authorization"), **body})
        data = [
            {"object": "embedding", "index": i, "embedding": embed(text, 64).tolist()}
            for i, text in enumerate(body["input"])
        ]
        # Reversed: the client must order by `index`, not trust the list order.
        return JSONResponse({"object": "list", "data": data[::-1], "model": body["model"]})

    server = serve_in_thread(app)
    yield server.url, seen
    server.stop()


def test_embeddings_come_from_the_users_endpoint_when_configured(
    urls: dict[str, str], embedder: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = embedder
    httpx.post(f"{urls['secondary']}/admin/faults", json=WRONG_ALL).raise_for_status()
    client = EmbeddingClient(EmbeddingEndpointSettings(url=url, model="e5-small"), api_key="sk-1")
    probe = _probe(urls, client)
    try:
        got = _values(probe.run())
    finally:
        probe.close()
    # The 64-dimension vectors of the endpoint, not the local 256-dimension ones.
    expected = _wrong_similarities(64)
    assert expected != pytest.approx(_wrong_similarities(256))
    assert got[catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY.family] == pytest.approx(
        float(np.mean(expected))
    )
    assert [(s["auth"], s["model"], len(s["input"])) for s in seen] == [
        ("Bearer sk-1", "e5-small", len(GOLDEN_SET)),
        ("Bearer sk-1", "e5-small", len(GOLDEN_SET)),
    ]


def test_a_failing_embedding_endpoint_fails_the_run(urls: dict[str, str]) -> None:
    dead = EmbeddingClient(EmbeddingEndpointSettings(url="http://127.0.0.1:9", timeout_seconds=1))
    probe = _probe(urls, dead)
    try:
        with pytest.raises(ConsistencyError, match="v1/embeddings"):
            probe.run()
    finally:
        probe.close()
