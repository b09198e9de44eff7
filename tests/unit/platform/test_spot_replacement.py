"""Replacement requests at notice time: the Deployment scale-up and the cloud hook against local
fakes (in-process), the request and its id, the settings, and `ClusterActions` never making the
caller wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from redline.platform.spot import ClusterActions, NodeRecord, Notice
from redline.platform.spot.errors import KubernetesConflictError, KubernetesError
from redline.platform.spot.kubernetes import CONFLICT_RETRIES, KubernetesClient, NodeActions
from redline.platform.spot.kubernetes_settings import KubernetesSettings
from redline.platform.spot.replacement import (
    IDEMPOTENCY_HEADER,
    KubernetesScaleUp,
    ReplacementError,
    ReplacementOutcome,
    ReplacementRequest,
    ReplacementResult,
    ReplacementRunner,
    ReplacementSettings,
    WebhookReplacement,
    build_replacement_provider,
    build_replacement_request,
    build_scale_patch,
)
from tests.support.kubeapi import (
    FakeHook,
    FakeKubernetes,
    app_client,
    build_hook_app,
    build_kubeapi_app,
)

TOKEN = "sa-t0ken"
HOOK_TOKEN = "hook-t0ken"
NOTICE = Notice("spot-a", "aws", "interruption", "terminate", 1000.0, 1000.4, 1120.0, "aws notice")


def secret(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    return path


# ---- the request ----------------------------------------------------------------------------


def test_the_request_id_is_stable_per_notice_and_differs_between_preemptions() -> None:
    request = build_replacement_request(NOTICE, "ip-10-0-0-1")
    assert request.request_id == "spot-a:aws:1120.000"
    assert build_replacement_request(NOTICE).request_id == request.request_id
    later = Notice("spot-a", "aws", "interruption", "terminate", 5000.0, 5000.1, 5120.0)
    assert build_replacement_request(later).request_id != request.request_id
    gcp = Notice("spot-b", "gcp", "interruption", "terminate", 77.5, 77.6, None)
    assert build_replacement_request(gcp).request_id == "spot-b:gcp:77.500"
    payload = request.payload()
    assert payload == {
        "version": "1",
        "event": "spot_replacement",
        "request_id": "spot-a:aws:1120.000",
        "node": "spot-a",
        "kubernetes_node": "ip-10-0-0-1",
        "provider": "aws",
        "kind": "interruption",
        "action": "terminate",
        "noticed_at": "1970-01-01T00:16:40.000Z",
        "deadline": "1970-01-01T00:18:40.000Z",
        "deadline_unix": 1120.0,
        "reason": "aws notice",
    }
    assert build_replacement_request(gcp).payload()["deadline"] is None


# ---- Kubernetes scale-up ---------------------------------------------------------------------


def scale(replicas: int, version: str = "9") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version}, "spec": {"replicas": replicas}}


def test_the_scale_patch() -> None:
    assert build_scale_patch(scale(3)) == (
        {"metadata": {"resourceVersion": "9"}, "spec": {"replicas": 4}}, 3, 4,
    )  # fmt: skip
    assert build_scale_patch(scale(3), by=2)[2] == 5
    assert build_scale_patch(scale(3), replicas=6)[2] == 6
    assert build_scale_patch(scale(6), replicas=6) == (None, 6, 6)  # already there
    assert build_scale_patch(scale(8), replicas=6) == (None, 8, 8)  # never down
    assert build_scale_patch(scale(4), max_replicas=4) == (None, 4, 4)
    assert build_scale_patch(scale(3), by=5, max_replicas=4)[2] == 4
    with pytest.raises(KubernetesError, match="resourceVersion"):
        build_scale_patch({"spec": {"replicas": 1}})


@pytest.fixture()
def fake() -> FakeKubernetes:
    api = FakeKubernetes()
    api.grant(TOKEN, ("get", "deployments/scale"), ("patch", "deployments/scale"))
    api.grant("no-scale", ("get", "deployments/scale"))
    api.add_deployment("serving", "chat", 3)
    return api


@pytest.fixture()
def kube(fake: FakeKubernetes, tmp_path: Path) -> Iterator[KubernetesClient]:
    with app_client(build_kubeapi_app(fake), "http://kube") as http:
        yield KubernetesClient("http://kube", secret(tmp_path, "token", TOKEN), client=http,
                               backoff_seconds=0.0)  # fmt: skip


def test_scale_up_adds_a_replica_and_survives_a_concurrent_change(
    fake: FakeKubernetes, kube: KubernetesClient
) -> None:
    request = build_replacement_request(NOTICE)
    up = KubernetesScaleUp(kube, "serving", "chat")
    assert up.request(request) == ("requested", "deployment serving/chat: 3 -> 4 replicas")
    assert fake.replicas("serving", "chat") == 4
    # An HPA moves it between our read and our write: 409, read again, +1 on its value.
    fake.interfere["deployments/serving/chat"] = lambda s: s["spec"].update(replicas=6)
    assert up.request(request)[1] == "deployment serving/chat: 6 -> 7 replicas"
    assert [c.status for c in fake.calls_of("patch", "deployments/scale")] == [200, 409, 200]
    capped = KubernetesScaleUp(kube, "serving", "chat", max_replicas=7)
    assert capped.request(request) == (
        "unchanged", "deployment serving/chat: already 7 replicas, max_replicas 7",
    )  # fmt: skip
    target = KubernetesScaleUp(kube, "serving", "chat", replicas=7)
    assert target.request(request)[0] == "unchanged"


def test_scale_up_conflicts_end_after_the_retries(
    fake: FakeKubernetes, kube: KubernetesClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = kube.get_scale

    def read_then_interfere(namespace: str, name: str) -> dict[str, Any]:
        answer = real(namespace, name)
        fake.interfere[f"deployments/{namespace}/{name}"] = lambda s: None
        real(namespace, name)
        return answer

    monkeypatch.setattr(kube, "get_scale", read_then_interfere)
    with pytest.raises(KubernetesConflictError):
        KubernetesScaleUp(kube, "serving", "chat").request(build_replacement_request(NOTICE))
    assert len(fake.calls_of("patch", "deployments/scale", 409)) == CONFLICT_RETRIES
    assert fake.replicas("serving", "chat") == 3


def test_scale_up_errors_name_the_rbac_rule_and_the_deployment(
    fake: FakeKubernetes, kube: KubernetesClient
) -> None:
    kube.token_file.write_text("no-scale")
    with pytest.raises(KubernetesError, match=r"may not `patch` `deployments/scale` in namespace"):
        KubernetesScaleUp(kube, "serving", "chat").request(build_replacement_request(NOTICE))
    kube.token_file.write_text(TOKEN)
    with pytest.raises(KubernetesError, match="deployment serving/ghost: 404"):
        KubernetesScaleUp(kube, "serving", "ghost").request(build_replacement_request(NOTICE))


# ---- the cloud hook --------------------------------------------------------------------------


def hook_provider(
    hook: FakeHook, tmp_path: Path, sleeps: list[float], attempts: int = 4, token: str = HOOK_TOKEN
) -> WebhookReplacement:
    return WebhookReplacement(
        "http://hook/replace",
        secret(tmp_path, "hook-token", token),
        app_client(build_hook_app(hook), "http://hook"),
        attempts=attempts,
        backoff_seconds=0.5,
        max_backoff_seconds=0.8,
        sleep=sleeps.append,
    )


def test_the_hook_gets_the_payload_with_the_token_and_an_idempotency_key(tmp_path: Path) -> None:
    hook = FakeHook(HOOK_TOKEN)
    sleeps: list[float] = []
    outcome = hook_provider(hook, tmp_path, sleeps).request(build_replacement_request(NOTICE))
    assert outcome == ("requested", "http://hook/replace: HTTP 202 (attempt 1)")
    [delivery] = hook.deliveries
    assert delivery.headers["authorization"] == f"Bearer {HOOK_TOKEN}"
    assert delivery.headers[IDEMPOTENCY_HEADER.lower()] == "spot-a:aws:1120.000"
    assert delivery.body["node"] == "spot-a" and delivery.body["deadline_unix"] == 1120.0
    assert sleeps == []


def test_the_hook_is_retried_with_backoff_on_503(tmp_path: Path) -> None:
    hook = FakeHook(HOOK_TOKEN, fail_first=3)
    sleeps: list[float] = []
    provider = hook_provider(hook, tmp_path, sleeps)
    assert provider.request(build_replacement_request(NOTICE))[1].endswith("(attempt 4)")
    assert sleeps == [0.5, 0.8, 0.8]  # doubled, capped
    assert [d.status for d in hook.deliveries] == [503, 503, 503, 202]
    given_up = FakeHook(HOOK_TOKEN, fail_first=10)
    with pytest.raises(ReplacementError, match="gave up after 2 attempts: HTTP 503"):
        hook_provider(given_up, tmp_path, [], attempts=2).request(build_replacement_request(NOTICE))


def test_a_refused_token_fails_at_once_naming_the_file(tmp_path: Path) -> None:
    hook = FakeHook(HOOK_TOKEN)
    sleeps: list[float] = []
    provider = hook_provider(hook, tmp_path, sleeps, token="wrong")
    with pytest.raises(ReplacementError, match=r"HTTP 401.*refused the token in .*hook-token"):
        provider.request(build_replacement_request(NOTICE))
    assert len(hook.deliveries) == 1 and sleeps == []


# ---- the runner ------------------------------------------------------------------------------


class Scripted:
    """A provider answering from a script (what the runner does with each answer is tested)."""

    via = "scripted"

    def __init__(self, *answers: tuple[ReplacementOutcome, str] | Exception) -> None:
        self.answers = list(answers)
        self.seen: list[ReplacementRequest] = []

    def request(self, request: ReplacementRequest) -> tuple[ReplacementOutcome, str]:
        self.seen.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        pass


def test_the_runner_times_records_and_never_raises() -> None:
    results: list[ReplacementResult] = []
    ticks = iter([10.0, 10.5, 20.0, 20.25, 30.0, 30.1])
    runner = ReplacementRunner(
        Scripted(("requested", "done"), ReplacementError("refused"), httpx.ConnectError("down")),
        clock=lambda: next(ticks),
        on_result=results.append,
    )
    request = build_replacement_request(NOTICE)
    first = runner.run(request)
    assert (first.outcome, first.detail, first.started_at, first.finished_at) == (
        "requested", "done", 10.0, 10.5,
    )  # fmt: skip
    assert runner.run(request).outcome == "failed"
    assert runner.run(request).detail == "down"
    assert [r.outcome for r in results] == ["requested", "failed", "failed"]
    assert first.as_dict()["via"] == "scripted"


# ---- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kind": "kubernetes"}, "replacement.deployment: required"),
        ({"kind": "webhook", "token_file": "/t"}, "replacement.url: required"),
        ({"kind": "webhook", "url": "https://hook"}, "replacement.token_file: required"),
        ({"kind": "none", "url": "https://hook"}, "replacement.url: only with"),
        ({"kind": "webhook", "url": "hook", "token_file": "/t"}, "not an http"),
        ({"kind": "kubernetes", "deployment": "d", "replicas": 9, "max_replicas": 4},
         "above replacement.max_replicas"),
        ({"kind": "azure"}, "kind"),
    ],
)  # fmt: skip
def test_settings_name_what_is_missing(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ReplacementSettings.model_validate(values)


def test_building_the_provider(tmp_path: Path) -> None:
    kube = KubernetesSettings(api_url="http://127.0.0.1:9", token_file=secret(tmp_path, "t", "x"))
    assert build_replacement_provider(ReplacementSettings(), kube) is None
    hook = ReplacementSettings(kind="webhook", url="http://h/replace",
                               token_file=tmp_path / "missing")  # fmt: skip
    with pytest.raises(ReplacementError, match="replacement.token_file: .*does not exist"):
        build_replacement_provider(hook, kube)
    scale_up = ReplacementSettings(kind="kubernetes", deployment="chat")
    with pytest.raises(ReplacementError, match="replacement.namespace: required"):
        build_replacement_provider(scale_up, kube, {})
    provider = build_replacement_provider(scale_up, kube, {"POD_NAMESPACE": "serving"})
    assert isinstance(provider, KubernetesScaleUp) and provider.namespace == "serving"
    provider.close()
    no_api = KubernetesSettings(token_file=secret(tmp_path, "t", "x"))
    with pytest.raises(KubernetesError, match="kubernetes.api_url: required"):
        build_replacement_provider(scale_up, no_api, {})


# ---- ClusterActions --------------------------------------------------------------------------


class Blocking(Scripted):
    """A provider that does not answer until released: a slow cloud."""

    def __init__(self) -> None:
        super().__init__(("requested", "late"))
        self.release = threading.Event()
        self.entered = threading.Event()

    def request(self, request: ReplacementRequest) -> tuple[ReplacementOutcome, str]:
        self.entered.set()
        self.release.wait(10)
        return super().request(request)


def test_a_notice_returns_at_once_however_slow_the_provider() -> None:
    provider = Blocking()
    errors: list[str] = []
    cluster = ClusterActions(replacement=ReplacementRunner(provider), on_error=errors.append)
    assert cluster.enabled
    started = time.monotonic()
    cluster.notice(NOTICE)
    assert time.monotonic() - started < 0.5
    assert provider.entered.wait(5)
    assert "replacement" not in cluster.last  # still waiting on the cloud
    provider.release.set()
    cluster.join(5)
    assert cluster.last["replacement"]["outcome"] == "requested"
    assert cluster.state()["replacement"] == "scripted" and errors == []


def test_a_failed_replacement_is_reported() -> None:
    errors: list[str] = []
    runner = ReplacementRunner(Scripted(ReplacementError("no capacity")))
    cluster = ClusterActions(replacement=runner, on_error=errors.append)
    cluster.notice(NOTICE)
    cluster.join(5)
    assert errors == ["replacement: no capacity"]


def test_node_actions_beside_the_drain_and_the_undo(tmp_path: Path) -> None:
    api = FakeKubernetes()
    api.grant(TOKEN, ("*", "*"))
    api.add_node("n1")
    api.add_pod("serving", "chat-0", "n1", {"app": "chat"})
    gate = "redline.dev/spot-safe"
    with app_client(build_kubeapi_app(api), "http://kube") as http:
        client = KubernetesClient("http://kube", secret(tmp_path, "token", TOKEN), client=http)
        cluster = ClusterActions(NodeActions(client, "n1", "serving", "app=chat"))
        stop = threading.Event()
        cluster.start(stop)
        deadline = time.monotonic() + 5
        while api.condition("serving", "chat-0", gate) != "True" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.condition("serving", "chat-0", gate) == "True"
        cluster.notice(NOTICE)
        assert cluster.preempted.is_set()
        stop.set()
        cluster.join(5)
        assert api.condition("serving", "chat-0", gate) == "False"
        assert cluster.last["kubernetes"]["tainted"] is True
        cluster.reconcile()  # the flag and the taint both keep it out
        assert api.condition("serving", "chat-0", gate) == "False"
        cluster.preempted.clear()
        cluster.reconcile()  # a restarted agent: the taint alone does
        assert api.condition("serving", "chat-0", gate) == "False"
        assert cluster.preempted.is_set()
        cluster.recovered(NodeRecord("spot-a"))
        assert api.condition("serving", "chat-0", gate) == "True"
        assert api.taints("n1") == [] and not cluster.preempted.is_set()
