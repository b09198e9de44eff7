"""Two simulator pods and their service front, each its own process, as `redline up` runs them.

Requests through the front reach both pods in turn; a stream keeps the pod's pacing through it;
a pod killed is skipped without one failed request; a change made per pod (fault knobs, an
adapter loaded in place) shows through the front only once every pod has it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from redline.devstack.config import SERVICE_MODULE, render_settings
from redline.devstack.fakes.service import HEALTH_PATH
from redline.devstack.fakes.simulator import INSTANCE_HEADER
from redline.devstack.processes import Service, free_port, http_ok, start_service
from redline.platform.golden import MODEL_VERSION_HEADER

pytestmark = pytest.mark.integration

BASE = "redline-base"
ADAPTER = "chat-lora"


def _adapter(root: Path, version: str) -> Path:
    directory = root / "adapters" / version
    directory.mkdir(parents=True)
    (directory / "version").write_text(f"{version}\n")
    return directory


@dataclass
class Region:
    """The pods and the front of one region."""

    pods: list[Service]
    front: Service
    adapters: dict[str, Path]


def _start_pod(tmp_path: Path, index: int, adapter: Path) -> Service:
    port = free_port()
    config = tmp_path / f"pod-{index}.yaml"
    config.write_text(
        render_settings(
            {
                "host": "127.0.0.1",
                "port": port,
                "region": "primary",
                "seed": index,
                "adapters": {ADAPTER: str(adapter)},
                "log_level": "warning",
            }
        )
    )
    argv = (sys.executable, "-m", "redline.cli", "simulate", "upstream", "--config", str(config))
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / f"pod-{index}.log"
    return start_service(f"pod-{index}", argv, log, port, http_ok(f"{url}/healthz"), 60.0)


@pytest.fixture(scope="module")
def region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Region]:
    tmp_path = tmp_path_factory.mktemp("service")
    adapters = {v: _adapter(tmp_path, v) for v in ("v1", "v2")}
    pods = [_start_pod(tmp_path, i, adapters["v1"]) for i in range(2)]
    port = free_port()
    config = tmp_path / "service.yaml"
    settings = {
        "host": "127.0.0.1",
        "port": port,
        "region": "primary",
        "pods": [p.url for p in pods],
        "eject_seconds": 1.0,
        "log_level": "warning",
    }
    config.write_text(render_settings(settings))
    argv = (sys.executable, "-m", SERVICE_MODULE, "--config", str(config))
    ready = http_ok(f"http://127.0.0.1:{port}{HEALTH_PATH}")
    front = start_service("service", argv, tmp_path / "service.log", port, ready, 60.0)
    try:
        yield Region(pods, front, adapters)
    finally:
        for service in (front, *pods):
            service.stop()


def _chat(prompt: str = "hello there", **extra: object) -> dict[str, object]:
    return {"model": ADAPTER, "messages": [{"role": "user", "content": prompt}], **extra}


def test_requests_reach_both_pods_in_turn(region: Region) -> None:
    with httpx.Client(base_url=region.front.url, timeout=10, trust_env=False) as client:
        instances = Counter(
            client.post("/v1/chat/completions", json=_chat(max_tokens=2)).headers[INSTANCE_HEADER]
            for _ in range(10)
        )
    assert len(instances) == 2 and set(instances.values()) == {5}
    health = httpx.get(f"{region.front.url}{HEALTH_PATH}", trust_env=False).json()
    assert health["serving"] == 2


def test_a_stream_keeps_the_pods_pacing_through_the_front(region: Region) -> None:
    for pod in region.pods:
        httpx.post(f"{pod.url}/admin/faults", json={"tokens_per_second": 20}, trust_env=False)
    try:
        arrivals: list[float] = []
        lines: list[str] = []
        body = _chat(max_tokens=10, stream=True)
        started = time.monotonic()
        with (
            httpx.Client(timeout=10, trust_env=False) as client,
            client.stream("POST", f"{region.front.url}/v1/chat/completions", json=body) as answer,
        ):
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.monotonic() - started)
                    lines.append(line)
        assert lines[-1] == "data: [DONE]" and len(lines) >= 11
        # 10 tokens at 20/s: the first event arrives well before the last (not buffered).
        assert arrivals[-1] - arrivals[0] > 0.3, arrivals
    finally:
        for pod in region.pods:
            httpx.post(f"{pod.url}/admin/faults", json={}, trust_env=False)


def test_a_change_made_on_every_pod_shows_through_the_front_with_no_failed_request(
    region: Region,
) -> None:
    """What the rollback and the drills do: act on each pod, never through the front."""
    statuses: Counter[str] = Counter()
    versions: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(base_url=region.front.url, timeout=10, trust_env=False) as client:
            while not stop.is_set():
                answer = client.post("/v1/chat/completions", json=_chat(max_tokens=2))
                statuses[str(answer.status_code)] += 1
                versions.append(answer.headers.get(MODEL_VERSION_HEADER, "none"))

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        for pod in region.pods:
            body = {"lora_name": ADAPTER, "lora_path": str(region.adapters["v2"]),
                    "load_inplace": True}  # fmt: skip
            assert httpx.post(f"{pod.url}/v1/load_lora_adapter", json=body,
                              trust_env=False).status_code == 200  # fmt: skip
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join(10)
    assert set(statuses) == {"200"}, statuses
    assert versions[0] == "v1" and versions[-5:] == ["v2"] * 5


def test_a_killed_pod_is_skipped_without_a_failed_request(region: Region) -> None:
    victim = region.pods[1]
    victim.kill()
    with httpx.Client(base_url=region.front.url, timeout=10, trust_env=False) as client:
        answers = [client.post("/v1/chat/completions", json=_chat(max_tokens=2)) for _ in range(8)]
        health = client.get(HEALTH_PATH)
    assert [a.status_code for a in answers] == [200] * 8
    assert {a.headers[INSTANCE_HEADER] for a in answers} == {answers[0].headers[INSTANCE_HEADER]}
    assert health.status_code == 200 and health.json()["serving"] == 1
    region.pods[0].kill()
    with httpx.Client(base_url=region.front.url, timeout=10, trust_env=False) as client:
        down = client.get("/v1/models")
        assert down.status_code == 503 and "no pod accepted" in down.json()["message"]
        assert client.get(HEALTH_PATH).status_code == 503
