"""The spot agent's Kubernetes client: patch bodies, error messages, settings, and the calls
against the local fake API server (`redline/devstack/fakes/kubeapi.py`, in-process: no cluster
here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from redline.platform.spot import kubernetes as k8s
from redline.platform.spot.errors import KubernetesConflictError, KubernetesError
from redline.platform.spot.kubernetes import (
    Access,
    KubernetesClient,
    NodeActions,
    build_api_error,
    build_condition_patch,
    build_taint_patch,
    build_untaint_patch,
    has_taint,
    pod_condition,
    pod_has_gate,
)
from redline.platform.spot.kubernetes_settings import KubernetesSettings
from tests.support.kubeapi import (
    FakeKubernetes,
    app_client,
    build_kubeapi_app,
    match_labels,
    merge_patch,
    strategic_merge_patch,
)

KEY = "redline.dev/spot-preempted"
GATE = "redline.dev/spot-safe"
TOKEN = "sa-t0ken"
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


# ---- pure builders --------------------------------------------------------------------------


def node_of(*taints: dict[str, Any], version: str = "7") -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "resourceVersion": version},
        "spec": {"taints": list(taints)},
    }


def test_the_taint_patch_keeps_the_other_taints_and_carries_the_resource_version() -> None:
    patch = build_taint_patch(node_of(OTHER), KEY, "aws")
    assert patch == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"taints": [OTHER, {"key": KEY, "value": "aws", "effect": "NoSchedule"}]},
    }
    assert build_taint_patch({"metadata": {"resourceVersion": "1"}, "spec": {}}, KEY, "gcp") == {
        "metadata": {"resourceVersion": "1"},
        "spec": {"taints": [{"key": KEY, "value": "gcp", "effect": "NoSchedule"}]},
    }


def test_the_taint_patch_is_none_when_the_taint_is_there_whatever_its_value() -> None:
    tainted = node_of(OTHER, {"key": KEY, "value": "manual", "effect": "NoSchedule"})
    assert build_taint_patch(tainted, KEY, "aws") is None
    assert has_taint(tainted, KEY)
    # The same key with another effect is not ours: NoSchedule is added beside it.
    soft = node_of({"key": KEY, "effect": "PreferNoSchedule"})
    assert not has_taint(soft, KEY)
    assert build_taint_patch(soft, KEY, "aws") is not None


def test_a_node_without_a_resource_version_is_refused() -> None:
    with pytest.raises(KubernetesError, match="resourceVersion"):
        build_taint_patch({"metadata": {}, "spec": {}}, KEY, "aws")


def test_the_untaint_patch_removes_only_ours_and_deletes_an_empty_list() -> None:
    ours = {"key": KEY, "value": "aws", "effect": "NoSchedule"}
    assert build_untaint_patch(node_of(OTHER, ours), KEY) == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"taints": [OTHER]},
    }
    assert build_untaint_patch(node_of(ours), KEY) == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"taints": None},
    }
    assert build_untaint_patch(node_of(OTHER), KEY) is None


def test_the_condition_patch_is_one_condition_under_status() -> None:
    patch = build_condition_patch(GATE, False, "SpotPreemption", "aws notice", 1_700_000_000.0)
    assert patch == {
        "status": {
            "conditions": [
                {
                    "type": GATE,
                    "status": "False",
                    "reason": "SpotPreemption",
                    "message": "aws notice",
                    "lastTransitionTime": "2023-11-14T22:13:20Z",
                }
            ]
        }
    }
    ready = build_condition_patch(GATE, True, "SpotSafe", "x" * 900, 0.0)
    assert ready["status"]["conditions"][0]["status"] == "True"
    assert len(ready["status"]["conditions"][0]["message"]) == 500


def test_pod_condition_and_gate() -> None:
    pod = {
        "spec": {"readinessGates": [{"conditionType": GATE}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"},
                                  {"type": GATE, "status": "False"}]},
    }  # fmt: skip
    assert pod_condition(pod, GATE) == "False"
    assert pod_condition(pod, "Ready") == "True"
    assert pod_condition(pod, "Other") is None
    assert pod_has_gate(pod, GATE)
    assert not pod_has_gate({"spec": {}}, GATE)


def test_error_messages_name_the_token_the_rbac_rule_and_the_object(tmp_path: Path) -> None:
    token = tmp_path / "token"
    unauthorized = build_api_error(Access("get", "nodes", "n1"), 401, "Unauthorized", token)
    assert str(token) in str(unauthorized) and "401 Unauthorized" in str(unauthorized)
    forbidden = build_api_error(Access("patch", "nodes", "n1"), 403, "cannot patch")
    assert "may not `patch` `nodes`" in str(forbidden)
    assert 'ClusterRole (apiGroups: [""], resources: ["nodes"], verbs: ["patch"])' in str(forbidden)
    status = build_api_error(Access("patch", "pods/status", "chat-0", namespace="serving"), 403, "")
    assert "`pods/status` in namespace serving" in str(status) and "its Role (" in str(status)
    scale = build_api_error(
        Access("patch", "deployments/scale", "chat", "apps", "serving"), 403, "no"
    )
    assert 'apiGroups: ["apps"], resources: ["deployments/scale"]' in str(scale)
    missing = build_api_error(Access("get", "nodes", "ip-10-0-0-1"), 404, "not found")
    assert "node ip-10-0-0-1" in str(missing) and "404" in str(missing)
    conflict = build_api_error(Access("patch", "nodes", "n1"), 409, "modified")
    assert isinstance(conflict, KubernetesConflictError)


def test_the_rbac_rules_are_the_calls_the_client_makes() -> None:
    rules = {(r, v) for rule in k8s.RBAC_RULES for r in rule["resources"] for v in rule["verbs"]}
    assert rules == {("nodes", "get"), ("nodes", "patch"), ("pods", "list"),
                     ("pods/status", "patch")}  # fmt: skip
    (scale,) = k8s.SCALE_RBAC_RULES
    assert scale["apiGroups"] == ("apps",) and set(scale["verbs"]) == {"get", "patch"}


# ---- settings -------------------------------------------------------------------------------


def token_file(tmp_path: Path, value: str = TOKEN) -> Path:
    path = tmp_path / "token"
    path.write_text(value + "\n")
    return path


def test_in_cluster_settings_come_from_the_environment(tmp_path: Path) -> None:
    settings = KubernetesSettings(
        enabled=True, pod_selector="app=chat", token_file=token_file(tmp_path), ca_file=None
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "6443",
           "NODE_NAME": "ip-10-0-0-1", "POD_NAMESPACE": "serving"}  # fmt: skip
    target = settings.resolve(env)
    assert target.api_url == "https://10.96.0.1:6443"
    assert (target.node_name, target.namespace) == ("ip-10-0-0-1", "serving")
    assert target.verify is not False and not target.insecure
    ipv6 = settings.resolve({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert ipv6.api_url == "https://[fd00::1]:6443"


@pytest.mark.parametrize(
    ("values", "env", "message"),
    [
        ({}, {"NODE_NAME": "n", "POD_NAMESPACE": "s"}, "kubernetes.api_url: required"),
        ({"api_url": "http://k"}, {"POD_NAMESPACE": "s"}, "kubernetes.node_name: required"),
        ({"api_url": "http://k"}, {"NODE_NAME": "n"}, "kubernetes.namespace: required"),
        ({"api_url": "http://k", "pod_selector": None}, {"NODE_NAME": "n", "POD_NAMESPACE": "s"},
         "kubernetes.pod_selector: required"),
        ({"api_url": "https://k", "ca_file": "/nonexistent/ca.crt"},
         {"NODE_NAME": "n", "POD_NAMESPACE": "s"}, "kubernetes.ca_file: /nonexistent"),
        ({"api_url": "http://k", "token_file": "/nonexistent/token"},
         {"NODE_NAME": "n", "POD_NAMESPACE": "s"}, "kubernetes.token_file: /nonexistent"),
    ],
)  # fmt: skip
def test_missing_settings_are_named(
    tmp_path: Path, values: dict[str, Any], env: dict[str, str], message: str
) -> None:
    base = {"enabled": True, "pod_selector": "app=chat", "token_file": token_file(tmp_path),
            "namespace_file": tmp_path / "no-namespace"}  # fmt: skip
    settings = KubernetesSettings.model_validate({**base, **values})
    with pytest.raises(KubernetesError, match=message):
        settings.resolve(env)


def test_the_namespace_file_and_insecure_flag(tmp_path: Path) -> None:
    namespace = tmp_path / "namespace"
    namespace.write_text("serving\n")
    settings = KubernetesSettings(
        enabled=True,
        api_url="https://k:443",
        node_name="n1",
        pod_selector="app=chat",
        token_file=token_file(tmp_path),
        namespace_file=namespace,
        ca_file=tmp_path / "missing-but-skipped",
        insecure_skip_tls_verify=True,
    )
    target = settings.resolve({})
    assert target.namespace == "serving" and target.verify is False and target.insecure
    # Off, nothing but the connection is needed (the replacement provider's case).
    bare = KubernetesSettings(api_url="http://k:8001", token_file=token_file(tmp_path))
    assert bare.resolve({}).node_name is None
    with pytest.raises(ValueError, match="not an http"):
        KubernetesSettings(api_url="k:443")
    with pytest.raises(ValueError, match="blank"):
        KubernetesSettings(pod_selector=" ")


# ---- the client against the fake API server ------------------------------------------------


@pytest.fixture()
def fake() -> FakeKubernetes:
    api = FakeKubernetes()
    api.grant(TOKEN, ("*", "*"))
    api.add_node("n1", taints=[OTHER])
    api.add_node("n2")
    for name, node in (("chat-0", "n1"), ("chat-1", "n1"), ("chat-2", "n2")):
        api.add_pod("serving", name, node, {"app": "chat"})
    api.add_pod("serving", "agent-x", "n1", {"app": "spot-agent"}, gate=None)
    api.add_pod("other", "chat-9", "n1", {"app": "chat"})
    return api


@pytest.fixture()
def http(fake: FakeKubernetes) -> Iterator[httpx.Client]:
    with app_client(build_kubeapi_app(fake), "http://kube") as client:
        yield client


def client_of(http: httpx.Client, tmp_path: Path, token: str = TOKEN) -> KubernetesClient:
    return KubernetesClient("http://kube", token_file(tmp_path, token), client=http,
                            backoff_seconds=0.0)  # fmt: skip


def test_taint_is_added_once_and_keeps_the_nodes_taints(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    client = client_of(http, tmp_path)
    assert client.taint_node("n1", KEY, "aws") is True
    assert fake.taints("n1") == [OTHER, {"key": KEY, "value": "aws", "effect": "NoSchedule"}]
    assert client.taint_node("n1", KEY, "aws") is False  # idempotent: read, nothing to write
    [patch] = fake.calls_of("patch", "nodes")
    assert patch.content_type == k8s.MERGE_PATCH
    assert client.untaint_node("n1", KEY) is True
    assert fake.taints("n1") == [OTHER]
    assert client.untaint_node("n1", KEY) is False
    assert client.untaint_node("n2", KEY) is False


def test_a_concurrent_writer_is_not_overwritten(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    added = {"key": "autoscaler/scale-down", "effect": "PreferNoSchedule"}
    fake.interfere["nodes/n1"] = lambda node: node["spec"]["taints"].append(added)
    assert client_of(http, tmp_path).taint_node("n1", KEY, "gcp") is True
    assert [c.status for c in fake.calls_of("patch", "nodes")] == [409, 200]
    assert fake.taints("n1") == [OTHER, added, {"key": KEY, "value": "gcp",
                                                "effect": "NoSchedule"}]  # fmt: skip


def test_a_writer_that_always_wins_ends_in_a_conflict_error(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_of(http, tmp_path)
    real_get = client.get_node

    def get_then_interfere(name: str) -> dict[str, Any]:
        node = real_get(name)
        fake.interfere[f"nodes/{name}"] = lambda n: n["metadata"].setdefault("labels", {})
        real_get(name)  # the other writer's change lands after this read
        return node

    monkeypatch.setattr(client, "get_node", get_then_interfere)
    with pytest.raises(KubernetesConflictError, match="409"):
        client.taint_node("n1", KEY, "aws")
    assert len(fake.calls_of("patch", "nodes", 409)) == k8s.CONFLICT_RETRIES


def test_pods_of_the_node_and_selector_only_and_the_kubelets_conditions_kept(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    actions = NodeActions(client_of(http, tmp_path), "n1", "serving", "app=chat",
                          clock=lambda: 1_700_000_000.0)  # fmt: skip
    assert sorted(p["metadata"]["name"] for p in actions.pods()) == ["chat-0", "chat-1"]
    marks = actions.mark(False, "SpotPreemption", "aws notice")
    assert marks.changed == ["chat-0", "chat-1"] and marks.without_gate == []
    for name in ("chat-0", "chat-1"):
        assert fake.condition("serving", name, GATE) == "False"
        assert fake.condition("serving", name, "Ready") == "True"  # strategic merge kept it
    assert fake.condition("serving", "chat-2", GATE) is None  # another node
    assert fake.condition("other", "chat-9", GATE) is None  # another namespace
    assert fake.condition("serving", "agent-x", GATE) is None  # not selected
    assert {c.content_type for c in fake.calls_of("patch", "pods/status")} == {
        k8s.STRATEGIC_MERGE_PATCH
    }
    again = actions.mark(False, "SpotPreemption", "aws notice")
    assert again.changed == [] and again.unchanged == ["chat-0", "chat-1"]
    [listed, *_] = fake.calls_of("list", "pods")
    assert listed.path == "/api/v1/namespaces/serving/pods"


def test_pods_without_the_gate_are_reported(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    actions = NodeActions(client_of(http, tmp_path), "n1", "serving", "app in (chat,spot-agent)")
    marks = actions.mark(False, "SpotPreemption", "notice")
    assert marks.without_gate == ["agent-x"]
    assert sorted(marks.changed) == ["agent-x", "chat-0", "chat-1"]


def test_pod_lists_are_paged(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(k8s, "_PAGE", 1)
    pods = client_of(http, tmp_path).list_pods("serving", "n1", "app=chat")
    assert [p["metadata"]["name"] for p in pods] == ["chat-0", "chat-1"]
    assert len(fake.calls_of("list", "pods")) == 2


def test_preempt_restore_and_reconcile(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    actions = NodeActions(client_of(http, tmp_path), "n1", "serving", "app=chat")
    first = actions.reconcile()
    assert first["preempted"] is False and first["pods"]["changed"] == ["chat-0", "chat-1"]
    assert fake.condition("serving", "chat-0", GATE) == "True"
    assert actions.reconcile()["pods"]["changed"] == []  # only pods that lack it
    done = actions.preempt("aws", "spot aws notice")
    assert done["tainted"] is True and done["pods"]["changed"] == ["chat-0", "chat-1"]
    assert has_taint(fake.nodes["n1"], KEY)
    # A restarted agent on the preempted node sees its taint and leaves the pods out.
    assert actions.reconcile() == {"node": "n1", "preempted": True}
    assert fake.condition("serving", "chat-0", GATE) == "False"
    restored = actions.restore("replacement ready")
    assert restored["untainted"] is True and restored["pods"]["changed"] == ["chat-0", "chat-1"]
    assert fake.taints("n1") == [OTHER]
    assert fake.condition("serving", "chat-1", GATE) == "True"


def test_401_403_404_name_what_to_fix(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    with pytest.raises(KubernetesError, match="401 Unauthorized: the API server refused the token"):
        client_of(http, tmp_path, "forged").get_node("n1")
    fake.grant("read-only", ("get", "nodes"), ("list", "pods"))
    reader = client_of(http, tmp_path, "read-only")
    with pytest.raises(KubernetesError, match=r"may not `patch` `nodes`.*cannot patch resource"):
        reader.taint_node("n1", KEY, "aws")
    actions = NodeActions(reader, "n1", "serving", "app=chat")
    with pytest.raises(KubernetesError) as failed:
        actions.preempt("aws", "notice")
    # Both steps were tried; both failures are named.
    assert "`pods/status` in namespace serving" in str(failed.value)
    assert "`nodes`" in str(failed.value)
    with pytest.raises(KubernetesError, match="node ghost: 404"):
        client_of(http, tmp_path).get_node("ghost")


def test_the_token_is_read_on_every_request(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    client = client_of(http, tmp_path)
    client.get_node("n1")
    fake.tokens.clear()
    fake.grant("rotated", ("*", "*"))
    token_file = client.token_file
    assert token_file is not None
    token_file.write_text("rotated\n")  # the kubelet rotated the projected token
    assert client.get_node("n1")["metadata"]["name"] == "n1"
    token_file.write_text("")
    with pytest.raises(KubernetesError, match="is empty"):
        client.get_node("n1")


def test_5xx_is_retried_and_then_reported(
    fake: FakeKubernetes, http: httpx.Client, tmp_path: Path
) -> None:
    client = client_of(http, tmp_path)
    fake.fail_next["get nodes"] = [503, 500]
    assert client.get_node("n1")["metadata"]["name"] == "n1"
    fake.fail_next["get nodes"] = [503] * k8s.TRANSIENT_ATTEMPTS
    with pytest.raises(KubernetesError, match="HTTP 503"):
        client.get_node("n1")


def test_unreachable_api_names_the_url(tmp_path: Path) -> None:
    client = KubernetesClient("http://127.0.0.1:9", token_file(tmp_path), backoff_seconds=0.0)
    try:
        with pytest.raises(KubernetesError, match=r"get node n1: GET http://127.0.0.1:9/api/v1"):
            client.get_node("n1")
    finally:
        client.close()


# ---- the fake itself: what makes the tests above mean something -----------------------------


def test_the_fake_refuses_what_the_api_server_refuses(http: httpx.Client) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    body = b'{"spec": {"taints": []}}'
    wrong = http.patch("/api/v1/nodes/n1", content=body,
                       headers={**auth, "content-type": "application/json"})  # fmt: skip
    assert wrong.status_code == 415
    stale = http.patch(
        "/api/v1/nodes/n1",
        content=b'{"metadata": {"resourceVersion": "1"}, "spec": {"taints": []}}',
        headers={**auth, "content-type": k8s.MERGE_PATCH},
    )
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    field = http.get("/api/v1/namespaces/serving/pods", params={"fieldSelector": "status.phase=x"},
                     headers=auth)  # fmt: skip
    assert field.status_code == 400
    assert http.get("/api/v1/nodes/n1").status_code == 401


def test_a_merge_patch_on_pod_status_would_lose_the_kubelets_conditions(
    fake: FakeKubernetes, http: httpx.Client
) -> None:
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": k8s.MERGE_PATCH}
    patch = build_condition_patch(GATE, False, "r", "m", 0.0)
    http.patch("/api/v1/namespaces/serving/pods/chat-0/status", content=json.dumps(patch),
               headers=headers)  # fmt: skip
    assert fake.condition("serving", "chat-0", "Ready") is None  # why the client uses strategic


def test_merge_helpers_and_selectors() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == {
        "a": {"c": 2},
        "l": [2],
    }
    merged = strategic_merge_patch(
        {"s": {"c": [{"type": "A", "status": "1"}, {"type": "B", "status": "1"}]}},
        {"s": {"c": [{"type": "B", "status": "0"}, {"type": "C", "status": "1"}]}},
        {"s.c": "type"},
    )
    assert merged["s"]["c"] == [{"type": "A", "status": "1"}, {"type": "B", "status": "0"},
                                {"type": "C", "status": "1"}]  # fmt: skip
    labels = {"app": "chat", "tier": "gpu"}
    assert match_labels("app=chat,tier!=cpu", labels)
    assert match_labels("app in (chat, embed),!canary", labels)
    assert not match_labels("app notin (chat)", labels)
    assert not match_labels("missing", labels)
    with pytest.raises(ValueError):
        match_labels("app=(", labels)


@pytest.mark.parametrize(
    ("status", "permanent"), [(400, True), (401, True), (403, True), (404, True), (409, False),
                              (429, False), (500, False), (503, False)],
)  # fmt: skip
def test_refusals_are_permanent_and_busy_servers_are_not(status: int, permanent: bool) -> None:
    assert build_api_error(Access("get", "nodes", "n1"), status, "").permanent is permanent
