"""Every manifest in deploy/kubernetes against the schema the API server would check it with:
Kubernetes' own (kubernetes-validate, strict: an unknown field fails, as `kubectl apply`'s
server-side field validation does) at a pinned Kubernetes version, and prometheus-operator's CRD
schemas (tests/data/crds, see the README there) for ServiceMonitor, PodMonitor, PrometheusRule
and AlertmanagerConfig, made strict the same way. Deliberately broken manifests must fail.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from redline.generate.kubernetes import KUBERNETES_DIR, KUSTOMIZATION, build_kubernetes_manifests
from redline.slo.load import load_spec
from tests.unit.generate.test_kubernetes import SOURCE, escalation_spec

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "tests" / "data" / "crds"
KUBERNETES_VERSION = "1.33.0"
"""The Kubernetes version the manifests are validated against (kubernetes-validate's schemas)."""

CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json",
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): "alertmanagerconfig-v1alpha1.json",
}


class ManifestInvalidError(Exception):
    """A manifest its schema rejects; the message names the file, the path and the reason."""


def strict(schema: Any) -> Any:
    """The schema with unknown properties rejected wherever it lists properties, as the API
    server's strict field validation does (x-kubernetes-preserve-unknown-fields excepted)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CRDS / name).read_text("utf-8"))
    return strict(loaded)


def _child_routes(route: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for child in route.get("routes", []):
        found += [child, *_child_routes(child)]
    return found


def validate_manifest(resource: dict[str, Any], where: str) -> None:
    """ManifestInvalidError unless `resource` passes its schema (Kubernetes' or the CRD's)."""
    key = (resource.get("apiVersion"), resource.get("kind"))
    if key in CRD_SCHEMAS:
        schema = crd_schema(CRD_SCHEMAS[key])  # type: ignore[index]
        checks = [(schema, resource)]
        if key[1] == "AlertmanagerConfig":
            # Child routes are preserve-unknown-fields in the CRD (it cannot recurse); the
            # operator parses each as a route, so each is held to the route's schema here.
            route_schema = schema["properties"]["spec"]["properties"]["route"]
            route = resource.get("spec", {}).get("route", {})
            checks += [(route_schema, child) for child in _child_routes(route)]
        # The CRD schema types metadata as an object; it is ObjectMeta, checked as a core one.
        meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": resource.get("metadata")}
        _core(meta, where)
        for schema_part, value in checks:
            error = jsonschema.exceptions.best_match(
                jsonschema.Draft7Validator(schema_part).iter_errors(value)
            )
            if error is not None:
                path = ".".join(str(p) for p in error.absolute_path)
                raise ManifestInvalidError(f"{where}: {path}: {error.message}")
        return
    _core(resource, where)


def _core(resource: dict[str, Any], where: str) -> None:
    try:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise ManifestInvalidError(f"{where}: {path}: {exc.message}") from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise ManifestInvalidError(f"{where}: no schema: {exc.message}") from None


@functools.cache
def committed() -> dict[str, dict[str, Any]]:
    """deploy/kubernetes as committed (every manifest but the kustomization), by file name."""
    found = {}
    for path in sorted((ROOT / KUBERNETES_DIR).glob("*.yaml")):
        if path.name != KUSTOMIZATION:
            found[path.name] = yaml.safe_load(path.read_text("utf-8"))
    return found


def test_the_pinned_version_is_one_kubernetes_validate_has() -> None:
    # Asked for a version it lacks, kubernetes-validate silently uses an older one.
    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize("name", sorted(committed()))
def test_every_committed_manifest_validates(name: str) -> None:
    validate_manifest(copy.deepcopy(committed()[name]), name)


def test_every_crd_schema_is_exercised_and_an_unknown_kind_fails() -> None:
    kinds = {(m["apiVersion"], m["kind"]) for m in committed().values()}
    assert set(CRD_SCHEMAS) <= kinds
    # A kind with no schema here is an error, not a silent pass (kubernetes-validate's own
    # command line only warns).
    with pytest.raises(ManifestInvalidError, match="no schema"):
        validate_manifest({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {}}, "w")


def test_the_manifests_of_a_spec_with_every_receiver_kind_validate() -> None:
    built = build_kubernetes_manifests(escalation_spec(), SOURCE)
    receivers = built["alertmanagerconfig.yaml"]["spec"]["receivers"]
    kinds = {key for r in receivers for key in r if key.endswith("Configs")}
    assert kinds == {"webhookConfigs", "slackConfigs", "pagerdutyConfigs", "emailConfigs"}
    for name, resource in built.items():
        validate_manifest(resource, name)


# ---- the check can fail ---------------------------------------------------------------------


def _broken(name: str, change: Any) -> dict[str, Any]:
    resource = copy.deepcopy(build_kubernetes_manifests(load_spec().spec, SOURCE)[name])
    change(resource)
    return resource


def _container(resource: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = resource["spec"]["template"]["spec"]["containers"][0]
    return found


BROKEN = {
    "a misspelt Deployment field": (
        "gateway-deployment.yaml",
        lambda r: r["spec"].update({"replica": 2}),
    ),
    "a port number as a string": (
        "gateway-deployment.yaml",
        lambda r: _container(r)["ports"][0].update({"containerPort": "8080"}),
    ),
    "a probe without a handler field name": (
        "exporters-deployment.yaml",
        lambda r: _container(r)["readinessProbe"].update({"httpget": {"path": "/healthz"}}),
    ),
    "a Service port missing its port": (
        "gateway-service.yaml",
        lambda r: r["spec"]["ports"][0].pop("port"),
    ),
    "a PodDisruptionBudget field in the wrong case": (
        "gateway-pdb.yaml",
        lambda r: r["spec"].update({"minavailable": 1}),
    ),
    "a ServiceMonitor endpoint field that does not exist": (
        "gateway-servicemonitor.yaml",
        lambda r: r["spec"]["endpoints"][0].update({"portName": "http"}),
    ),
    "a ServiceMonitor without its selector": (
        "gateway-servicemonitor.yaml",
        lambda r: r["spec"].pop("selector"),
    ),
    "a bad scrape interval": (
        "spot-agent-podmonitor.yaml",
        lambda r: r["spec"]["podMetricsEndpoints"][0].update({"interval": "15 seconds"}),
    ),
    "a rule field in the wrong case": (
        "prometheusrule.yaml",
        lambda r: r["spec"]["groups"][0]["rules"][0].update({"Record": "x"}),
    ),
    "alertmanager.yml's snake_case in an AlertmanagerConfig": (
        "alertmanagerconfig.yaml",
        lambda r: r["spec"]["receivers"][0]["webhookConfigs"][0].update({"send_resolved": True}),
    ),
    "a child route with alertmanager.yml's matchers": (
        "alertmanagerconfig.yaml",
        lambda r: r["spec"]["route"]["routes"][0].update({"matchers": ['playbook="reroute"']}),
    ),
    "an unknown match type": (
        "alertmanagerconfig.yaml",
        lambda r: r["spec"]["inhibitRules"][0]["sourceMatch"][0].update({"matchType": "=="}),
    ),
    "a label value that is not a string": (
        "dashboard-spot.yaml",
        lambda r: r["metadata"]["labels"].update({"grafana_dashboard": 1}),
    ),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_manifest_fails_validation(what: str) -> None:
    name, change = BROKEN[what]
    with pytest.raises(ManifestInvalidError):
        validate_manifest(_broken(name, change), name)
