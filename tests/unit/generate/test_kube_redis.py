"""deploy/kubernetes/redis-sentinel: generated like the rest (committed = built, a kustomization
listing every file), valid against Kubernetes' own schemas (strict), and consistent: the
StatefulSet's names are the ones the scripts and the documented URL use, every pod meets the
namespace's restricted Pod Security Standard. Running the scripts (and `sh -n` on them) is
tests/integration/generate/test_kube_redis_scripts.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.core.redisconn import parse_redis_url
from redline.generate.kube_redis import (
    REDIS_PASSWORD,
    REDIS_SENTINEL_DIR,
    build_redis_sentinel_manifests,
    build_redis_sentinel_outputs,
    pod_host,
    sentinel_url,
)
from redline.generate.kubernetes import KUSTOMIZATION, KubernetesOptions
from redline.rules.render import HEADER
from tests.unit.generate.test_kubernetes_schemas import ManifestInvalidError, validate_manifest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "kubernetes.md"
SOURCE = "slo/specs/default.yaml"


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return build_redis_sentinel_manifests()


def _statefulset(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = manifests["statefulset.yaml"]
    return found


def test_the_committed_directory_is_the_generated_one() -> None:
    outputs = build_redis_sentinel_outputs(SOURCE)
    on_disk = {p.relative_to(ROOT) for p in (ROOT / REDIS_SENTINEL_DIR).glob("*.yaml")}
    assert on_disk == set(outputs), "run `redline generate` (stale or missing files)"
    for path, text in outputs.items():
        assert text.startswith(HEADER), path
        assert (ROOT / path).read_text("utf-8") == text, f"{path}: run `redline generate`"
    kustomization = yaml.safe_load((ROOT / REDIS_SENTINEL_DIR / KUSTOMIZATION).read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in on_disk if p.name != KUSTOMIZATION
    )


@pytest.mark.parametrize("name", sorted(build_redis_sentinel_manifests()))
def test_every_manifest_validates_against_kubernetes_schemas(
    manifests: dict[str, dict[str, Any]], name: str
) -> None:
    validate_manifest(copy.deepcopy(manifests[name]), name)


def test_a_broken_statefulset_fails_validation(manifests: dict[str, dict[str, Any]]) -> None:
    broken = copy.deepcopy(_statefulset(manifests))
    broken["spec"]["volumeClaimTemplates"][0]["spec"]["accessMode"] = ["ReadWriteOnce"]
    with pytest.raises(ManifestInvalidError, match="accessMode"):
        validate_manifest(broken, "statefulset.yaml")


def test_names_ports_and_selectors_agree(manifests: dict[str, dict[str, Any]]) -> None:
    statefulset = _statefulset(manifests)
    service = manifests["headless-service.yaml"]
    template = statefulset["spec"]["template"]
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    labels = template["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert statefulset["spec"]["selector"]["matchLabels"] == labels
    pdb = manifests["pdb.yaml"]["spec"]
    assert pdb["selector"]["matchLabels"] == labels and pdb["maxUnavailable"] == 1
    ports = {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == ports == {"redis", "sentinel"}
    for container in template["spec"]["containers"]:
        env = {e["name"]: e for e in container["env"]}
        # The names the scripts compare are the headless Service's pod names.
        assert env["REDIS_SELF"]["value"] == "$(POD_NAME).redis-headless.$(POD_NAMESPACE).svc"
        peers = env["REDIS_PEERS"]["value"].split()
        assert peers == [
            pod_host(i, "$(POD_NAMESPACE)") for i in range(statefulset["spec"]["replicas"])
        ]
        secret = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert (secret["name"], secret["key"]) == (REDIS_PASSWORD.secret, REDIS_PASSWORD.key)
        assert env["REDISCLI_AUTH"]["valueFrom"] == env["REDIS_PASSWORD"]["valueFrom"]
        script = container["command"][-1].removeprefix("/scripts/")
        assert script in manifests["scripts-configmap.yaml"]["data"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert command[-1] == "ping" and str(container["ports"][0]["containerPort"]) in command


def test_every_pod_meets_the_restricted_standard(manifests: dict[str, dict[str, Any]]) -> None:
    pod = _statefulset(manifests)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["requests"] and container["resources"]["limits"]
        assert ":" in container["image"] and not container["image"].endswith(":latest")


def test_the_documented_url_parses_and_names_every_pod() -> None:
    options = KubernetesOptions(namespace="genai-sla")
    url = sentinel_url(options, 1, "pw")
    target = parse_redis_url(url, "redline-redis.url")
    assert target is not None
    assert [host for host, _ in target.sentinels] == [pod_host(i, "genai-sla") for i in range(3)]
    assert (target.master, target.db, target.password, target.sentinel_password) == (
        "redline", 1, "pw", "pw"
    )  # fmt: skip
    namespaced = build_redis_sentinel_manifests(options)
    assert {m["metadata"]["namespace"] for m in namespaced.values()} == {"genai-sla"}


def test_the_docs_say_how_to_create_the_password_and_the_url() -> None:
    text = DOCS.read_text("utf-8")
    assert f"kubectl -n redline create secret generic {REDIS_PASSWORD.secret}" in text
    assert f"--from-literal={REDIS_PASSWORD.key}=" in text
    assert "kubectl apply -k deploy/kubernetes/redis-sentinel" in text
    assert sentinel_url(KubernetesOptions(), 0, "$PASSWORD").split("?")[0] in text
