"""`semantic_rollback` on two simulated vLLM pods per region, while clients hammer the model.

Each region is two simulator pods behind a round-robin proxy (what a Kubernetes Service does),
the proxies are the real gateway's upstreams; the playbook finds the pods through a local server
speaking the Kubernetes EndpointSlice API (primary) or a static list (secondary). Clients ask
for the served adapter through the gateway and of every pod directly during every rollback:
not one request may fail. Crashes are injected at every record and step boundary (the process
"dies" there), then the job runs again: it must converge.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.golden import GOLDEN_SET, MODEL_VERSION_HEADER
from redline.platform.snapshots import Baselines, Snapshot, SnapshotRegistry
from redline.remediation.models import Alert
from redline.remediation.playbook import PlaybookContext, StepResult
from redline.remediation.playbooks import SemanticRollback
from redline.remediation.settings import RemediationSettings
from redline.slo.load import load_spec
from redline.slo.spec import PlaybookPolicy
from tests.support.playbook import playbook_settings, records, run_jobs
from tests.support.remediation import alert

MODEL = "chat-lora"
VERSIONS = ("v1", "v2", "v3")
REGIONS = ("primary", "secondary")
TOKEN = "k8s-service-account-token"
NAMESPACE = "serving"
SERVICE = "chat-primary"


def _adapter(root: Path, version: str) -> Path:
    directory = root / "adapters" / version
    directory.mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(f"weights of {version}".encode() * 64)
    (directory / "adapter_config.json").write_text(f'{{"r": 8, "version": "{version}"}}\n')
    (directory / "version").write_text(f"{version}\n")
    return directory


Refusal = Callable[[str, dict[str, Any]], Response | None]


def _proxy(urls: list[str], refuse: Refusal | None = None) -> FastAPI:
    """Round-robin over `urls` (a Service in front of pods); `refuse(path, body)` may answer
    instead (a pod whose volume lacks a version, an engine without in-place loads)."""
    app = FastAPI()
    turn = itertools.count()
    clients: list[httpx.AsyncClient] = []

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        if refuse is not None and body:
            refused = refuse("/" + path, json.loads(body))
            if refused is not None:
                return refused
        if not clients:
            clients.append(httpx.AsyncClient(trust_env=False, timeout=30))
        url = urls[next(turn) % len(urls)]
        answer = await clients[0].request(
            request.method,
            f"{url}/{path}",
            params=dict(request.query_params),
            content=body,
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )
        kept = {
            k: v for k, v in answer.headers.items() if k.lower().startswith(("content-t", "x-"))
        }
        return Response(answer.content, answer.status_code, headers=kept)

    return app


def _endpoint_slices(pods: list[tuple[str, int]], seen: list[dict[str, str]]) -> FastAPI:
    """A Kubernetes API server that knows one Service's EndpointSlices (one per pod, since the
    simulated pods share 127.0.0.1 and differ by port), plus a pod that is not ready."""
    app = FastAPI()

    @app.get("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices")
    async def slices(namespace: str, request: Request) -> JSONResponse:
        seen.append(
            {
                "auth": request.headers.get("authorization", ""),
                "selector": request.query_params.get("labelSelector", ""),
                "namespace": namespace,
            }
        )
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"kind": "Status", "code": 401}, status_code=401)
        items = [
            {
                "metadata": {"name": f"{SERVICE}-{index}"},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
                "endpoints": [
                    {
                        "addresses": [host],
                        "conditions": {"ready": True, "serving": True, "terminating": False},
                        "targetRef": {"kind": "Pod", "name": f"chat-{index}"},
                    }
                ],
            }
            for index, (host, port) in enumerate(pods)
        ]
        items.append(
            {
                "metadata": {"name": f"{SERVICE}-starting"},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
                "endpoints": [
                    {
                        "addresses": ["10.0.0.9"],
                        "conditions": {"ready": False},
                        "targetRef": {"kind": "Pod", "name": "chat-starting"},
                    }
                ],
            }
        )
        return JSONResponse({"kind": "EndpointSliceList", "metadata": {}, "items": items})

    return app


class Hammer:
    """Clients asking for the served adapter in a loop, through the gateway and of every pod."""

    def __init__(self, targets: dict[str, str], interval: float) -> None:
        self.targets = targets
        self.interval = interval
        self.stop_event = threading.Event()
        self.statuses: dict[str, Counter[str]] = {name: Counter() for name in targets}
        self.versions: dict[str, Counter[str]] = {name: Counter() for name in targets}
        self.threads = [
            threading.Thread(target=self._run, args=(name, url), daemon=True)
            for name, url in targets.items()
        ]

    def _run(self, name: str, url: str) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        with httpx.Client(timeout=10, trust_env=False) as client:
            while not self.stop_event.is_set():
                try:
                    answer = client.post(f"{url}/v1/chat/completions", json=body)
                    status = str(answer.status_code)
                    version = answer.headers.get(MODEL_VERSION_HEADER, "none")
                except httpx.HTTPError as exc:
                    status, version = type(exc).__name__, "none"
                self.statuses[name][status] += 1
                if status == "200":
                    self.versions[name][version] += 1
                time.sleep(self.interval)

    def __enter__(self) -> Hammer:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=15)

    def failures(self) -> dict[str, dict[str, int]]:
        """Target -> non-200 outcomes and their counts."""
        failed = {
            name: {status: n for status, n in counter.items() if status != "200"}
            for name, counter in self.statuses.items()
        }
        return {name: counts for name, counts in failed.items() if counts}

    def total(self) -> int:
        """Requests made so far."""
        return sum(sum(counter.values()) for counter in self.statuses.values())


@dataclass
class PodFleet:
    """v1..v3 verified, v3 active and served on two pods per region, behind the gateway."""

    registry: SnapshotRegistry
    snapshots: dict[str, Snapshot]
    pods: dict[str, list[str]]
    gateway: str
    settings: RemediationSettings
    client: httpx.Client
    k8s_requests: list[dict[str, str]]
    servers: list[ServerThread] = field(default_factory=list)

    def adapter_dir(self, version: str) -> str:
        """The adapter directory of a version."""
        return str(Path(self.snapshots[version].weights_path).parent)

    def adapters(self, url: str) -> dict[str, str]:
        """What one pod serves: adapter name -> path."""
        cards = self.client.get(f"{url}/v1/models").json()["data"]
        return {card["id"]: card["root"] for card in cards if card.get("parent")}

    def everywhere(self) -> dict[str, dict[str, str]]:
        """Pod URL -> what it serves, for every pod."""
        return {url: self.adapters(url) for urls in self.pods.values() for url in urls}

    def serving(self, version: str) -> dict[str, dict[str, str]]:
        """What every pod serves when it serves only `version` under the adapter's name."""
        return {
            url: {MODEL: self.adapter_dir(version)} for urls in self.pods.values() for url in urls
        }

    def active(self) -> str:
        """The version the active pointer names."""
        pointer = self.registry.active_pointer(MODEL)
        assert pointer is not None
        return self.registry.get(MODEL, pointer.snapshot_id).version

    def reset(self, version: str = "v3") -> None:
        """Back to `version` on the pointer and every pod, no staged copy (between runs)."""
        self.registry.activate(MODEL, self.snapshots[version].snapshot_id, verify=False)
        for url, served in self.everywhere().items():
            for name in served:
                if name != MODEL:
                    self.client.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name})
            answer = self.client.post(
                f"{url}/v1/load_lora_adapter",
                json={
                    "lora_name": MODEL,
                    "lora_path": self.adapter_dir(version),
                    "load_inplace": True,
                },
            )
            assert answer.status_code == 200, answer.text
        assert self.everywhere() == self.serving(version)

    def wrong_answers(self, version: str) -> None:
        """Every pod answers golden prompts wrongly when serving `version`."""
        faults = {"versions": {version: {"wrong_answer_probability": 1.0}}}
        for url in self.everywhere():
            answer = self.client.post(f"{url}/admin/faults", json=faults)
            assert answer.status_code == 200, answer.text

    def hammer(self, interval: float = 0.004) -> Hammer:
        """Clients of the gateway and of every pod, each asking every `interval` seconds."""
        targets = {"gateway": self.gateway}
        targets.update({url: url for urls in self.pods.values() for url in urls})
        return Hammer(targets, interval)


def _serve(app: FastAPI, fleet_servers: list[ServerThread]) -> ServerThread:
    server = serve_in_thread(app)
    fleet_servers.append(server)
    return server


@pytest.fixture()
def fleet(redis_url: str, tmp_path: Path) -> Iterator[PodFleet]:
    registry = SnapshotRegistry(tmp_path / "registry")
    references = {item.id: item.reference for item in GOLDEN_SET}
    snapshots: dict[str, Snapshot] = {}
    for version in VERSIONS:
        directory = _adapter(tmp_path, version)
        created = registry.create(
            MODEL,
            version,
            directory / "adapter_model.safetensors",
            directory / "adapter_config.json",
            adapter=MODEL,
        )
        baselines = Baselines(
            p99_seconds=0.4, accuracy_ratio=1.0, samples=2000, reference_answers=references
        )
        snapshots[version] = registry.mark_verified(MODEL, created.snapshot_id, baselines)
    registry.activate(MODEL, snapshots["v3"].snapshot_id)
    served = {MODEL: str(Path(snapshots["v3"].weights_path).parent)}
    servers: list[ServerThread] = []
    client = httpx.Client(timeout=10, trust_env=False)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    k8s_requests: list[dict[str, str]] = []
    try:
        pods: dict[str, list[str]] = {}
        services: dict[str, str] = {}
        for seed, region in enumerate(REGIONS):
            pods[region] = []
            for replica in range(2):
                engine = SimulatorSettings(
                    region=region, seed=seed * 10 + replica, adapters=dict(served)
                )
                pods[region].append(_serve(build_simulator_app(engine), servers).url)
            services[region] = _serve(_proxy(pods[region]), servers).url
        hosts = [(httpx.URL(url).host, httpx.URL(url).port or 80) for url in pods["primary"]]
        api = _serve(_endpoint_slices(hosts, k8s_requests), servers)
        gateway_settings = GatewaySettings(upstreams=services, redis_url=redis_url)
        gateway = _serve(build_gateway_app(gateway_settings, load_spec(None).spec), servers)
        settings = playbook_settings(
            redis_url,
            serving={
                "gateway_url": gateway.url,
                "upstreams": services,
                "pods": {
                    "primary": {
                        "kubernetes": {
                            "service": SERVICE,
                            "namespace": NAMESPACE,
                            "api_url": api.url,
                            "token_file": str(token),
                        }
                    },
                    "secondary": {"urls": pods["secondary"]},
                },
            },
            rollback={"snapshot_root": str(registry.root)},
        )
        yield PodFleet(
            registry, snapshots, pods, gateway.url, settings, client, k8s_requests, servers
        )
    finally:
        for server in reversed(servers):
            server.stop()
        client.close()


def _alert(fingerprint: str) -> dict[str, Any]:
    return alert(
        fingerprint,
        playbook="semantic_rollback",
        starts_at=datetime.now(UTC),
        labels={"alertname": "SemanticRegression", "model": MODEL, "model_version": "v3"},
    )


def _pod_keys(fleet: PodFleet) -> set[str]:
    keys = {f"primary/chat-{index}" for index in range(2)}
    keys |= {f"secondary/{httpx.URL(url).netloc.decode()}" for url in fleet.pods["secondary"]}
    return keys


def test_every_pod_switches_with_zero_failed_requests(fleet: PodFleet) -> None:
    with fleet.hammer() as hammer:
        time.sleep(0.3)
        before = hammer.total()
        [job] = run_jobs(fleet.settings, _alert("b0000000000000b1"), timeout=120)
        during = hammer.total() - before
        time.sleep(0.3)
    assert job.status == "succeeded", job.error
    assert hammer.failures() == {}, "requests failed during the switch"
    assert during > 100, f"only {during} requests during the rollback"
    # Clients got v3 before and v2 after, and nothing else, from every pod and the gateway.
    for target, versions in hammer.versions.items():
        assert set(versions) <= {"v3", "v2"}, target
        assert versions["v2"] > 0, target
    assert fleet.active() == "v2"
    assert fleet.everywhere() == fleet.serving("v2")
    # The pods came from the EndpointSlices (the not-ready one left alone) and the static list.
    [discovered] = [s for s in job.steps if s["name"] == "discover_pods"]
    assert set(discovered["data"]["pods"]) == _pod_keys(fleet)
    assert discovered["data"]["skipped"] == {"primary/chat-starting": "not ready"}
    assert {r["auth"] for r in fleet.k8s_requests} == {f"Bearer {TOKEN}"}
    assert {r["selector"] for r in fleet.k8s_requests} == {f"kubernetes.io/service-name={SERVICE}"}
    # Per pod, in order: staged beside, checked, switched in place, staged copy unloaded.
    for pod in _pod_keys(fleet):
        mine = [s["name"] for s in job.steps if s.get("data", {}).get("pod") == pod]
        assert mine == ["stage_adapter", "precheck", "switch_adapter", "unload_staged"], pod
    [chosen] = [s for s in job.steps if s["name"] == "try_snapshot" and s["data"].get("chosen")]
    report = chosen["data"]["pods"]
    assert set(report) == _pod_keys(fleet) | {"primary/chat-starting"}
    for pod in _pod_keys(fleet):
        assert report[pod]["loaded"] == f"{MODEL}@v2 loaded"
        assert report[pod]["switched"] == "reloaded in place"
        assert report[pod]["verified"] == "serves v2"
        assert report[pod]["unloaded"] == f"{MODEL}@v2"
        assert "error" not in report[pod]
    verify = next(s for s in job.steps if s["phase"] == "verify")
    assert verify["ok"] and set(verify["data"]["pods"]) >= _pod_keys(fleet)


def _refuse_v2_volume(fleet: PodFleet) -> Refusal:
    def refuse(path: str, body: dict[str, Any]) -> Response | None:
        if path == "/v1/load_lora_adapter" and body.get("lora_path") == fleet.adapter_dir("v2"):
            message = f"No adapter found for {body['lora_path']}"
            return JSONResponse(
                {"error": {"message": message, "type": "NotFoundError", "code": 404}},
                status_code=404,
            )
        return None

    return refuse


def _refuse_inplace(path: str, body: dict[str, Any]) -> Response | None:
    # A vLLM without load_inplace: the field is ignored and a loaded name is refused.
    if path == "/v1/load_lora_adapter" and body.get("load_inplace"):
        message = f"The lora adapter '{body['lora_name']}' has already been loaded."
        return JSONResponse(
            {"error": {"message": message, "type": "InvalidUserInput", "code": 400}},
            status_code=400,
        )
    return None


@pytest.mark.parametrize("fault", ["volume", "inplace"])
def test_a_pod_that_cannot_load_fails_the_job_and_every_pod_keeps_a_working_adapter(
    fleet: PodFleet, fault: str
) -> None:
    # The last pod of the last region refuses: when it is reached, the others were changed.
    refuse = _refuse_v2_volume(fleet) if fault == "volume" else _refuse_inplace
    bad = serve_in_thread(_proxy([fleet.pods["secondary"][1]], refuse))
    fleet.servers.append(bad)
    pods = dict(fleet.settings.serving.pods)
    pods["secondary"] = pods["secondary"].model_copy(
        update={"urls": [fleet.pods["secondary"][0], bad.url]}
    )
    settings = fleet.settings.model_copy(
        update={"serving": fleet.settings.serving.model_copy(update={"pods": pods})}
    )
    bad_key = f"secondary/{httpx.URL(bad.url).netloc.decode()}"
    with fleet.hammer() as hammer:
        [job] = run_jobs(settings, _alert("b0000000000000b2"), timeout=120)
    assert hammer.failures() == {}
    assert job.status == "failed"
    assert job.error is not None and bad_key in job.error and "ERROR" in job.error
    [tried] = [s for s in job.steps if s["name"] == "try_snapshot"]
    report = tried["data"]["pods"]
    assert set(report) == _pod_keys(fleet) - {
        f"secondary/{httpx.URL(fleet.pods['secondary'][1]).netloc.decode()}"
    } | {bad_key, "primary/chat-starting"}
    if fault == "volume":
        # Refused while loading beside: nothing was switched anywhere.
        assert "No adapter found" in report[bad_key]["error"]
        assert report[bad_key]["loaded"] == "failed"
        assert records(job, "switch_adapter") == []
    else:
        # Refused the in-place reload after three pods were switched: they were put back.
        assert "load_inplace needs a vLLM release" in report[bad_key]["error"]
        assert report[bad_key]["switched"] == "failed"
        assert len(records(job, "switch_adapter")) == 4
        assert {r["data"]["action"] for r in records(job, "restore_adapter")} == {
            "reloaded in place",
            "already served",
        }
    # Every pod serves the original under the adapter's name; no staged copy is left behind.
    assert fleet.everywhere() == fleet.serving("v3")
    assert fleet.active() == "v3"
    assert job.attempts == 1, "a pod's refusal is not retried"


def test_shadow_runs_the_checks_and_changes_nothing(fleet: PodFleet) -> None:
    settings = fleet.settings.model_copy(
        update={"policies": {"semantic_rollback": PlaybookPolicy(mode="shadow")}}
    )
    fleet.wrong_answers("v3")
    [job] = run_jobs(settings, _alert("b0000000000000b3"))
    assert job.status == "shadowed", job.error
    checked = [s["name"] for s in job.steps if s["phase"] == "check"]
    assert checked == ["discover_pods", "check_pods", "check_golden", "select_snapshot"]
    # The evidence: v3 as served now fails its own baselines' gates (wrong answers).
    [golden] = [s for s in job.steps if s["name"] == "check_golden"]
    assert golden["data"]["regressed"] is True
    assert golden["data"]["served_versions"] == {"v3": len(GOLDEN_SET)}
    assert "fails: accuracy 0.0000 < 0.9920" in golden["detail"]
    [pods] = [s for s in job.steps if s["name"] == "check_pods"]
    assert {entry["serving"] for entry in pods["data"]["pods"].values() if "serving" in entry} == {
        f"{MODEL} from {fleet.adapter_dir('v3')}"
    }
    would = [s for s in job.steps if s["phase"] == "shadow"]
    assert [s["name"] for s in would] == ["try_snapshot", "try_snapshot"]
    assert "would:" in would[0]["detail"] and f"{MODEL}@v2" in would[0]["detail"]
    assert fleet.active() == "v3"
    assert fleet.everywhere() == fleet.serving("v3")
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        assert client.keys(f"{settings.key_prefix}:playbook:rollback:*") == []
    finally:
        client.close()


class Crash(BaseException):
    """The process dies here (a BaseException: no `except Exception` can swallow it)."""


class Ticker:
    """Counts the points where a process could die (records, step boundaries); raises `Crash`
    at point `crash_at`."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at = crash_at
        self.seen = 0

    def __call__(self) -> None:
        self.seen += 1
        if self.seen == self.crash_at:
            raise Crash(f"killed at point {self.crash_at}")


def _context(
    client: redis.Redis, job_id: str, attempt: int, tick: Callable[[], None]
) -> PlaybookContext:
    def recorder(name: str, detail: str, data: Any) -> None:
        tick()

    return PlaybookContext(
        job_id=job_id,
        playbook="semantic_rollback",
        alert=Alert.model_validate(_alert("b0000000000000b4")),
        target=f"model={MODEL}",
        dry_run=False,
        attempt=attempt,
        redis=client,
        firing_job=None,
        log=logging.getLogger("test.rollback"),
        recorder=recorder,
        lease_check=lambda: None,
    )


def _run(playbook: SemanticRollback, ctx: PlaybookContext, tick: Callable[[], None]) -> StepResult:
    """What the worker does with a firing job: plan, each step, verify (a step boundary ticks)."""
    for step in playbook.plan(ctx):
        tick()
        result = playbook.execute(ctx, step)
        if not result.ok:
            return result
    tick()
    return playbook.verify(ctx)


def test_a_crash_at_any_point_then_a_rerun_converges_without_a_failed_request(
    fleet: PodFleet,
) -> None:
    settings = fleet.settings
    # Three golden prompts keep the ~30 runs short; the gates are the same.
    playbook = SemanticRollback(
        settings.rollback, settings.serving, f"{settings.key_prefix}:playbook", 3600, GOLDEN_SET[:3]
    )
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    with fleet.hammer(interval=0.05) as hammer:
        counter = Ticker()
        clean = _run(playbook, _context(client, "clean", 1, counter), counter)
        assert clean.ok, clean.detail
        assert fleet.everywhere() == fleet.serving("v2")
        # Every pod's load, check, switch and unload, the pointer, the gateway check, the steps.
        assert counter.seen > 20
        for crash_at in range(1, counter.seen + 1):
            fleet.reset("v3")
            job = f"crash-{crash_at}"
            crash = Ticker(crash_at)
            with pytest.raises(Crash):
                _run(playbook, _context(client, job, 1, crash), crash)
            # Whatever the moment, every pod still serves a version under the adapter's name.
            for url, served in fleet.everywhere().items():
                assert served.get(MODEL) in {fleet.adapter_dir("v3"), fleet.adapter_dir("v2")}, url
            rerun = _run(playbook, _context(client, job, 2, Ticker()), Ticker())
            assert rerun.ok, f"point {crash_at}: {rerun.detail}"
            assert fleet.active() == "v2", crash_at
            assert fleet.everywhere() == fleet.serving("v2"), crash_at
    client.close()
    assert hammer.failures() == {}
