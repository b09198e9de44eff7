"""The output-mutation probe against two real simulators (one per region) and a real Redis.

The simulators answer the built-in canaries (golden prompts) with their references, so the
first run accepts them and the next ones see no change; a wrong-answer fault on the secondary's
serving version makes it answer the known wrong answers, which the probe must report with their
diff, keep reporting while they last (the accepted answer is kept), and drop when the fault is
lifted. A reformatted accepted answer is no change; a region that does not answer fails the run.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.exporters.canary_file import DEFAULT_CANARIES
from redline.exporters.mutation import AcceptedStore, MutationProbe, MutationProbeError
from redline.exporters.probe import ProbeCache, Sample
from redline.platform.golden import find_golden
from redline.platform.sessions import open_redis
from redline.slo import catalog

pytestmark = pytest.mark.integration

MODEL = "redline-base"
WRONG = {"versions": {"base": {"wrong_answer_probability": 1.0}}}
PREFIX = "test:mutation"


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


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    found = open_redis(redis_url)
    for key in found.scan_iter(f"{PREFIX}:*"):
        found.delete(key)
    yield found
    found.close()


def _probe(region: str, url: str, redis_url: str) -> MutationProbe:
    return MutationProbe(region, url, [MODEL], DEFAULT_CANARIES, redis_url, key_prefix=PREFIX)


def _by(samples: list[Sample], name: str) -> dict[str, float]:
    return {s.labels["prompt"]: s.value for s in samples if s.name == name}


def _diffs(samples: list[Sample]) -> dict[str, str]:
    info = catalog.LLM_OUTPUT_CONSISTENCY_DIFF_INFO.family
    return {s.labels["prompt"]: s.labels["diff"] for s in samples if s.name == info}


def test_a_mutated_version_is_reported_until_its_answers_come_back(
    urls: dict[str, str], redis_url: str, client: redis.Redis
) -> None:
    primary = _probe("primary", urls["primary"], redis_url)
    secondary = _probe("secondary", urls["secondary"], redis_url)
    changes = catalog.LLM_OUTPUT_CONSISTENCY_CHANGES.family
    score = catalog.LLM_OUTPUT_MUTATION_SCORE.family
    try:
        for probe in (primary, secondary):
            first = probe.run()
            assert set(_by(first, changes).values()) == {0.0}
            assert {s.labels["model_version"] for s in first} == {"base"}
        httpx.post(f"{urls['secondary']}/admin/faults", json=WRONG).raise_for_status()
        for _ in range(2):  # the accepted answer is kept: the mutation shows on every run
            mutated = secondary.run()
            assert all(v >= 4 for v in _by(mutated, changes).values()), mutated
            assert all(v > 0.5 for v in _by(mutated, score).values()), mutated
        diffs = _diffs(mutated)
        assert diffs["capital-france"] == "-the capital of france +i believe it | -paris +lyon"
        assert set(diffs) == {c.id for c in DEFAULT_CANARIES}
        assert set(_by(primary.run(), changes).values()) == {0.0}  # the other region is fine
        httpx.post(f"{urls['secondary']}/admin/faults", json={}).raise_for_status()
        back = secondary.run()
        assert set(_by(back, changes).values()) == {0.0} and not _diffs(back)
        store = AcceptedStore(client, PREFIX)
        kept = store.accepted(MODEL, "base", "secondary", "capital-france")
        reference = find_golden("What is the capital of France?")
        assert kept is not None and reference is not None and kept.text == reference.reference
    finally:
        primary.close()
        secondary.close()


def test_a_reformatted_accepted_answer_is_no_change(
    urls: dict[str, str], redis_url: str, client: redis.Redis
) -> None:
    store = AcceptedStore(client, PREFIX)
    store.accept(MODEL, "base", "primary", "hexagon", " a HEXAGON has  six sides!!", 1.0)
    store.accept(MODEL, "base", "primary", "capital-france", "the capital of FRANCE: paris", 1.0)
    probe = _probe("primary", urls["primary"], redis_url)
    try:
        samples = probe.run()
    finally:
        probe.close()
    found = _by(samples, catalog.LLM_OUTPUT_CONSISTENCY_CHANGES.family)
    assert found["hexagon"] == 0  # case, punctuation, spacing and six = 6
    assert found["capital-france"] == 1  # "is" is a word, not formatting
    assert _diffs(samples) == {"capital-france": "+is"}


def test_a_region_down_fails_the_run_and_its_gauges_go_unknown(
    urls: dict[str, str], redis_url: str, client: redis.Redis
) -> None:
    probe = _probe("secondary", urls["secondary"], redis_url)
    cache = ProbeCache([probe])
    try:
        cache.run(probe.name)
        assert cache.status()[probe.name]["success"]
        httpx.post(f"{urls['secondary']}/admin/faults", json={"outage": "unavailable"})
        with pytest.raises(MutationProbeError, match="HTTP 503"):
            probe.run()
        cache.run(probe.name)
        assert not cache.status()[probe.name]["success"]
        names = {m.name for m in cache.collect() for _ in m.samples}
        assert catalog.LLM_OUTPUT_CONSISTENCY_CHANGES.family not in names
    finally:
        probe.close()


def test_redis_down_fails_the_run(urls: dict[str, str]) -> None:
    probe = _probe("primary", urls["primary"], "redis://127.0.0.1:1/0")
    try:
        with pytest.raises(redis.ConnectionError):
            probe.run()
    finally:
        probe.close()
