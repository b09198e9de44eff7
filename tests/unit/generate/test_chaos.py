"""`redline generate --chaos`: the game-day experiments. Every Chaos Mesh object validates against
its kind's published CRD schema (tests/data/chaos-mesh), every FIS template against the
CreateExperimentTemplate request of AWS's SDK model (tests/data/aws-fis) with botocore's own
validator and its documented actions; the selectors select the pods of the generated
deploy/kubernetes; every duration is bounded and long enough for its alert; the output is
deterministic; bad options fail naming the option and what is allowed."""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

import botocore.session
import jsonschema
import pytest
import yaml
from botocore.model import ServiceModel, Shape
from botocore.stub import Stubber
from botocore.validate import ParamValidator
from typer.testing import CliRunner

from redline.cli.main import app as cli_app
from redline.devstack.drills.registry import DRILL_NAMES
from redline.generate.chaos import (
    CHAOS_MESH_API,
    CHAOS_MESH_DRILLS,
    DRILL_LABEL,
    FIS_ACTION_IDS,
    FIS_EXPERIMENTS,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_DURATION_SECONDS,
    ChaosBuildError,
    ChaosOptions,
    FisOptions,
    build_chaos_mesh_experiments,
    build_chaos_outputs,
    build_fis_templates,
    drill_needs,
    parse_durations,
    parse_labels,
)
from redline.generate.kube_redis import build_redis_sentinel_manifests
from redline.generate.kubernetes import (
    EXPORTERS,
    REPLICATOR,
    SERVING_POD_SELECTOR,
    SESSIONS,
    KubernetesOptions,
    build_kubernetes_manifests,
)
from redline.generate.outputs import build_outputs
from redline.rules.render import HEADER
from redline.slo.load import load_spec
from redline.slo.spec import Spec
from tests.unit.generate.test_kubernetes_schemas import (
    ManifestInvalidError,
    strict,
    validate_manifest,
)

ROOT = Path(__file__).resolve().parents[3]
CHAOS_MESH_SCHEMAS = ROOT / "tests" / "data" / "chaos-mesh"
FIS_DATA = ROOT / "tests" / "data" / "aws-fis"
SOURCE = "slo/specs/default.yaml"
SCHEMA_FILES = {
    "PodChaos": "podchaos-v1alpha1.json",
    "NetworkChaos": "networkchaos-v1alpha1.json",
    "HTTPChaos": "httpchaos-v1alpha1.json",
    "StressChaos": "stresschaos-v1alpha1.json",
}
ROLE = "arn:aws:iam::123456789012:role/redline-fis"
ALARM = "arn:aws:cloudwatch:us-east-1:123456789012:alarm:redline-gameday-stop"
FIS = FisOptions(ROLE, "us-east-1a")
GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
ISO_DURATION = re.compile(r"^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?$")
GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


@functools.cache
def spec() -> Spec:
    return load_spec().spec


def custom_options() -> ChaosOptions:
    """Every option away from its default."""
    return ChaosOptions(
        kubernetes=KubernetesOptions(namespace="genai-sla", serving_namespace="serving"),
        region="secondary",
        serving_selector=(("app.kubernetes.io/component", "lora-router"), ("zone", "{region}")),
        milvus_replica_selector=(("app", "milvus-b"),),
        redis_selector=(("app.kubernetes.io/name", "redis"),),
        durations=(("latency", 600.0), ("az-power", 900.0)),
        fis=FisOptions(ROLE, "eu-west-2b", ALARM, "gameday"),
    )


OPTIONS = {"defaults": ChaosOptions(), "defaults+fis": ChaosOptions(fis=FIS), "custom": None}


def options_for(name: str) -> ChaosOptions:
    return OPTIONS[name] or custom_options()


# ---- Chaos Mesh: schemas -------------------------------------------------------------------


@functools.cache
def chaos_schema(kind: str) -> dict[str, Any]:
    loaded = json.loads((CHAOS_MESH_SCHEMAS / SCHEMA_FILES[kind]).read_text())
    schema: dict[str, Any] = strict(loaded)
    return schema


def go_seconds(text: str) -> float:
    assert GO_DURATION.match(text), f"{text!r} is not a Go duration"
    return sum(
        float(n) * GO_UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)", text)
    )


def validate_chaos(resource: dict[str, Any], where: str) -> None:
    """ManifestInvalidError unless `resource` passes its kind's CRD schema, its metadata is a
    valid ObjectMeta, and the values Chaos Mesh's webhook parses parse."""
    kind = resource.get("kind")
    if resource.get("apiVersion") != CHAOS_MESH_API or kind not in SCHEMA_FILES:
        raise ManifestInvalidError(f"{where}: no schema for {resource.get('apiVersion')} {kind}")
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": resource.get("metadata")}
    validate_manifest(meta, where)
    validator = jsonschema.Draft7Validator(chaos_schema(str(kind)))
    error = jsonschema.exceptions.best_match(validator.iter_errors(resource))
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path)
        raise ManifestInvalidError(f"{where}: {path}: {error.message}")
    body = resource["spec"]
    try:
        go_seconds(body["duration"])
        if "delay" in body:
            go_seconds(body["delay"]["latency"])
    except (AssertionError, KeyError) as exc:
        raise ManifestInvalidError(f"{where}: duration: {exc}") from None
    if body["mode"] in ("fixed", "fixed-percent", "random-max-percent"):
        value = body.get("value", "")
        if not value.isdigit() or (body["mode"] != "fixed" and int(value) > 100):
            raise ManifestInvalidError(f"{where}: value {value!r} for mode {body['mode']}")


def built(name: str) -> dict[str, dict[str, Any]]:
    return build_chaos_mesh_experiments(spec(), options_for(name))


@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_every_chaos_mesh_object_validates_against_its_crd_schema(options: str) -> None:
    objects = built(options)
    assert [name.removesuffix(".yaml") for name in objects] == list(CHAOS_MESH_DRILLS)
    for name, resource in objects.items():
        validate_chaos(copy.deepcopy(resource), name)
    assert {r["kind"] for r in objects.values()} == set(SCHEMA_FILES)


def _broken(drill: str, change: Any) -> dict[str, Any]:
    resource = copy.deepcopy(built("defaults")[f"{drill}.yaml"])
    change(resource)
    return resource


BROKEN = {
    "an action Chaos Mesh does not have": ("latency", lambda r: r["spec"].update(action="lag")),
    "a delay without its latency": ("latency", lambda r: r["spec"]["delay"].pop("latency")),
    "a misspelt selector field": (
        "staleness",
        lambda r: r["spec"]["selector"].update(labelSelector={"a": "b"}),
    ),
    "a partition target without its mode": (
        "session-rpo",
        lambda r: r["spec"]["target"].pop("mode"),
    ),
    "an unknown pod action": ("exporter-down", lambda r: r["spec"].update(action="pod-stop")),
    "a negative grace period": ("redis-failover", lambda r: r["spec"].update(gracePeriod=-1)),
    "an HTTPChaos without its target": ("breaker", lambda r: r["spec"].pop("target")),
    "a status code as a string": ("breaker", lambda r: r["spec"]["replace"].update(code="500")),
    "a percent over 100": ("breaker", lambda r: r["spec"].update(value="130")),
    "too many stress workers": (
        "regression-negative",
        lambda r: r["spec"]["stressors"]["cpu"].update(workers=10000),
    ),
    "a duration Go cannot parse": ("latency", lambda r: r["spec"].update(duration="5 minutes")),
    "a label value that is not a string": (
        "latency",
        lambda r: r["metadata"]["labels"].update({DRILL_LABEL: 1}),
    ),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_chaos_mesh_object_fails_validation(what: str) -> None:
    drill, change = BROKEN[what]
    with pytest.raises(ManifestInvalidError):
        validate_chaos(_broken(drill, change), what)


# ---- Chaos Mesh: selectors, labels, durations -----------------------------------------------


def _selects(selector: dict[str, Any], namespace: str, labels: dict[str, str]) -> bool:
    wanted = selector["labelSelectors"].items()
    return selector["namespaces"] == [namespace] and wanted <= labels.items()


def _pod_labels(resource: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = resource["spec"]["template"]["metadata"]["labels"]
    return found


@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_the_selectors_select_the_generated_workloads_pods(options: str) -> None:
    chosen = options_for(options)
    k8s = chosen.kubernetes
    objects = built(options)
    manifests = build_kubernetes_manifests(spec(), SOURCE, k8s)
    pods = {name: _pod_labels(manifests[f"{name}-deployment.yaml"]) for name in
            (REPLICATOR, SESSIONS, EXPORTERS)}  # fmt: skip
    assert _selects(objects["staleness.yaml"]["spec"]["selector"], k8s.namespace, pods[REPLICATOR])
    assert _selects(objects["session-rpo.yaml"]["spec"]["selector"], k8s.namespace, pods[SESSIONS])
    exporters = objects["exporter-down.yaml"]["spec"]["selector"]
    assert _selects(exporters, k8s.namespace, pods[EXPORTERS])
    # Each selects its workload only, not every redline pod.
    for drill, name in (("staleness", REPLICATOR), ("session-rpo", SESSIONS)):
        others = [p for n, p in pods.items() if n != name]
        selector = objects[f"{drill}.yaml"]["spec"]["selector"]
        assert not any(_selects(selector, k8s.namespace, p) for p in others)
    redis_pods = _pod_labels(build_redis_sentinel_manifests(k8s)["statefulset.yaml"])
    for drill, selector in (
        ("session-rpo", objects["session-rpo.yaml"]["spec"]["target"]["selector"]),
        ("redis-failover", objects["redis-failover.yaml"]["spec"]["selector"]),
    ):
        if chosen.redis_selector:
            assert selector["labelSelectors"] == dict(chosen.redis_selector), drill
        else:
            assert _selects(selector, k8s.namespace, redis_pods), drill


def test_the_default_serving_selector_is_the_spot_agents_plus_the_region() -> None:
    manifests = build_kubernetes_manifests(spec(), SOURCE)
    settings = yaml.safe_load(manifests["settings-configmap.yaml"]["data"]["spot-agent.yaml"])
    key, _, value = settings["kubernetes"]["pod_selector"].partition("=")
    assert settings["kubernetes"]["pod_selector"] == SERVING_POD_SELECTOR
    objects = built("defaults")
    for drill in ("latency", "latency-persistent", "breaker", "regression-negative"):
        selector = objects[f"{drill}.yaml"]["spec"]["selector"]
        assert selector == {
            "namespaces": [settings["kubernetes"]["namespace"]],
            "labelSelectors": {key: value, "redline.dev/region": spec().regions[0]},
        }, drill


def test_custom_selectors_namespaces_and_region_are_used() -> None:
    objects = built("custom")
    serving = {"namespaces": ["serving"],
               "labelSelectors": {"app.kubernetes.io/component": "lora-router",
                                  "zone": "secondary"}}  # fmt: skip
    for drill in ("latency", "breaker", "regression-negative"):
        assert objects[f"{drill}.yaml"]["spec"]["selector"] == serving
    milvus = objects["staleness.yaml"]["spec"]["target"]["selector"]
    assert milvus == {"namespaces": ["serving"], "labelSelectors": {"app": "milvus-b"}}
    assert {o["metadata"]["namespace"] for o in objects.values()} == {"genai-sla"}
    assert objects["latency.yaml"]["spec"]["duration"] == "10m"


@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_every_experiment_is_labelled_named_and_bounded(options: str) -> None:
    chosen = options_for(options)
    needs = drill_needs(spec())
    for name, resource in built(options).items():
        drill = name.removesuffix(".yaml")
        meta = resource["metadata"]
        assert meta["name"] == f"redline-{drill}"
        assert meta["namespace"] == chosen.kubernetes.namespace
        assert meta["labels"][MANAGED_BY_LABEL] == MANAGED_BY
        assert meta["labels"][DRILL_LABEL] == drill
        assert meta["annotations"]["redline.dev/expects"]
        seconds = go_seconds(resource["spec"]["duration"])
        assert needs[drill].seconds <= seconds <= MAX_DURATION_SECONDS, drill


def test_the_latency_fault_crosses_the_red_line() -> None:
    threshold = spec().red_lines.latency_p99.threshold_seconds
    for drill in ("latency", "latency-persistent"):
        delay = built("defaults")[f"{drill}.yaml"]["spec"]["delay"]["latency"]
        assert go_seconds(delay) > threshold
    persistent = built("defaults")["latency-persistent.yaml"]["spec"]["duration"]
    assert go_seconds(persistent) > go_seconds(
        built("defaults")["latency.yaml"]["spec"]["duration"]
    )


def test_every_experiment_is_named_after_a_drill_of_the_local_stack() -> None:
    assert set(CHAOS_MESH_DRILLS) <= set(DRILL_NAMES)
    assert set(FIS_EXPERIMENTS) - {"az-power"} <= set(DRILL_NAMES)


# ---- AWS FIS --------------------------------------------------------------------------------


@functools.cache
def fis_model() -> ServiceModel:
    loaded = json.loads((FIS_DATA / "fis-2020-12-01-create-experiment-template.json").read_text())
    return ServiceModel(loaded, service_name="fis")


@functools.cache
def documented_actions() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIS_DATA / "actions.json").read_text())
    return loaded


class TemplateInvalidError(Exception):
    """A FIS template the request schema or the documented actions reject."""


def _java_pattern(pattern: str) -> str:
    # The model's patterns are Java's; its one class of Unicode letters, separators, digits
    # and `_` is re's `\w\s`.
    converted = pattern.replace(r"\p{L}\p{Z}\p{N}_", r"\w\s")
    assert r"\p{" not in converted, f"no re equivalent for {pattern}"
    return converted


def _lengths_and_patterns(value: Any, shape: Shape, where: str) -> list[str]:
    """What botocore's validator leaves to the service: `max` lengths and `pattern`s."""
    problems = []
    limit = shape.metadata.get("max")
    if shape.type_name in ("string", "list", "map") and limit is not None and len(value) > limit:
        problems.append(f"{where}: longer than {limit}")
    if shape.type_name == "string" and "pattern" in shape.metadata:
        pattern = _java_pattern(shape.metadata["pattern"])
        if not re.fullmatch(pattern, value):  # the service matches a whole value
            problems.append(f"{where}: {value!r} does not match {shape.metadata['pattern']}")
    if shape.type_name == "structure":
        for name, member in shape.members.items():
            if name in value:
                problems += _lengths_and_patterns(value[name], member, f"{where}.{name}")
    elif shape.type_name == "list":
        for i, item in enumerate(value):
            problems += _lengths_and_patterns(item, shape.member, f"{where}[{i}]")
    elif shape.type_name == "map":
        for key, item in value.items():
            problems += _lengths_and_patterns(key, shape.key, f"{where} key")
            problems += _lengths_and_patterns(item, shape.value, f"{where}.{key}")
    return problems


def iso_seconds(text: str) -> int:
    match = ISO_DURATION.match(text)
    assert match is not None and any(match.groups()), f"{text!r} is not an ISO 8601 duration"
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def validate_template(template: dict[str, Any], where: str) -> None:
    """TemplateInvalidError unless `template` is a valid CreateExperimentTemplate request
    (botocore's validator over the pinned model, lengths and patterns) using documented
    actions, parameters and targets."""
    shape = fis_model().operation_model("CreateExperimentTemplate").input_shape
    # The SDK and the CLI fill the idempotency token in before validating (botocore's
    # generate_idempotent_uuid handler); the files leave it to them.
    request = {**template, "clientToken": "redline-test"}
    report = ParamValidator().validate(request, shape)
    if report.has_errors():
        raise TemplateInvalidError(f"{where}: {report.generate_report()}")
    problems = _lengths_and_patterns(request, shape, where)
    if problems:
        raise TemplateInvalidError("; ".join(problems))
    targets = template["targets"]
    for name, action in template["actions"].items():
        known = documented_actions().get(action["actionId"])
        if known is None:
            raise TemplateInvalidError(f"{where}: {name}: undocumented {action['actionId']}")
        for parameter, value in action.get("parameters", {}).items():
            rule = known["parameters"].get(parameter)
            if rule is None:
                raise TemplateInvalidError(f"{where}: {name}: no parameter {parameter}")
            if "values" in rule and value not in rule["values"]:
                raise TemplateInvalidError(f"{where}: {name}: {parameter} {value!r}")
            if rule.get("iso8601"):
                seconds = iso_seconds(value)
                low, high = rule.get("min_seconds", 1), rule.get("max_seconds", 43200)
                if not low <= seconds <= high:
                    raise TemplateInvalidError(f"{where}: {name}: {parameter} {value} out of range")
        for parameter, rule in known["parameters"].items():
            if rule["required"] and parameter not in action.get("parameters", {}):
                raise TemplateInvalidError(f"{where}: {name}: {parameter} missing")
        for key, target in action.get("targets", {}).items():
            if key not in known["targets"] or target not in targets:
                raise TemplateInvalidError(f"{where}: {name}: target {key}={target}")
            if targets[target]["resourceType"] != known["targets"][key]:
                raise TemplateInvalidError(
                    f"{where}: {name}: {target} is not {known['targets'][key]}"
                )


def fis_templates(options: str) -> dict[str, dict[str, Any]]:
    return build_fis_templates(spec(), SOURCE, options_for(options))


@pytest.mark.parametrize("options", ["defaults+fis", "custom"])
def test_every_fis_template_is_a_valid_create_experiment_template_request(options: str) -> None:
    templates = fis_templates(options)
    assert [name.removesuffix(".json") for name in templates] == list(FIS_EXPERIMENTS)
    for name, template in templates.items():
        validate_template(copy.deepcopy(template), name)


@pytest.mark.parametrize("options", ["defaults+fis", "custom"])
def test_every_fis_template_passes_a_real_botocore_client(options: str) -> None:
    # The installed SDK's model, through the path a real call takes (token filled in,
    # parameters validated), answered by the stubber instead of AWS.
    client = botocore.session.get_session().create_client(
        "fis", region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    )
    with Stubber(client) as stub:
        for template in fis_templates(options).values():
            stub.add_response("create_experiment_template", {})
            client.create_experiment_template(**template)
        stub.assert_no_pending_responses()


def test_the_fis_templates_use_only_the_documented_actions_listed() -> None:
    used = {a["actionId"] for t in fis_templates("defaults+fis").values()
            for a in t["actions"].values()}  # fmt: skip
    assert used == set(FIS_ACTION_IDS) == set(documented_actions())


def test_the_fis_templates_carry_role_stop_condition_tags_and_the_notice() -> None:
    notice = spec().spot.notice_seconds.aws
    alarm = {"source": "aws:cloudwatch:alarm", "value": ALARM}
    for options, stop in (("defaults+fis", {"source": "none"}), ("custom", alarm)):
        for name, template in fis_templates(options).items():
            experiment = name.removesuffix(".json")
            assert template["roleArn"] == ROLE
            assert template["stopConditions"] == [stop]
            assert template["tags"][MANAGED_BY_LABEL] == MANAGED_BY
            assert template["tags"][DRILL_LABEL] == experiment
            assert "DO NOT EDIT" in template["description"]
            for action in template["actions"].values():
                if action["actionId"] == "aws:ec2:send-spot-instance-interruptions":
                    assert iso_seconds(action["parameters"]["durationBeforeInterruption"]) == notice
    custom = fis_templates("custom")
    assert custom["spot-one.json"]["targets"]["spot-instances"]["resourceTags"] == {
        "gameday": "spot"
    }
    az_power = custom["az-power.json"]
    assert az_power["actions"]["disrupt-subnets"]["parameters"]["duration"] == "PT15M"
    zones = {v for t in az_power["targets"].values() for f in t.get("filters", [])
             for v in f["values"] if f["path"].endswith("AvailabilityZone")}  # fmt: skip
    assert zones == {"eu-west-2b"}


def test_no_fis_template_without_the_fis_options() -> None:
    assert build_fis_templates(spec(), SOURCE) == {}


BROKEN_TEMPLATES = {
    "no role": lambda t: t.pop("roleArn"),
    "no stop condition list": lambda t: t.pop("stopConditions"),
    "an alarm ARN too short": lambda t: t["stopConditions"][0].update(value="arn:x"),
    "a misspelt member": lambda t: t.update(stopCondition=[]),
    "a tag value that is not a string": lambda t: t["tags"].update(Name=1),
    "a target selection mode with a space": (
        lambda t: t["targets"]["spot-instances"].update(selectionMode="COUNT (1)")
    ),
    "an undocumented action": (
        lambda t: t["actions"]["interrupt-one"].update(actionId="aws:ec2:spot-interrupt")
    ),
    "an interruption sooner than FIS allows": (
        lambda t: t["actions"]["interrupt-one"]["parameters"].update(
            durationBeforeInterruption="PT1M"
        )
    ),
    "an action target of the wrong resource type": (
        lambda t: t["targets"]["spot-instances"].update(resourceType="aws:ec2:instance")
    ),
}


@pytest.mark.parametrize("what", sorted(BROKEN_TEMPLATES))
def test_a_broken_fis_template_fails_validation(what: str) -> None:
    template = copy.deepcopy(fis_templates("defaults+fis")["spot-one.json"])
    BROKEN_TEMPLATES[what](template)
    with pytest.raises(TemplateInvalidError):
        validate_template(template, what)


# ---- outputs --------------------------------------------------------------------------------


def test_the_outputs_are_deterministic_headed_and_under_their_directories() -> None:
    options = ChaosOptions(fis=FIS)
    first = build_chaos_outputs(spec(), SOURCE, options)
    assert first == build_chaos_outputs(spec(), SOURCE, options)
    assert sorted(map(str, first)) == sorted(
        [f"chaos-mesh/{d}.yaml" for d in CHAOS_MESH_DRILLS]
        + [f"aws-fis/{e}.json" for e in FIS_EXPERIMENTS]
    )
    for path, text in first.items():
        if path.suffix == ".yaml":
            assert text.startswith(f"{HEADER}# Source: {SOURCE}\n")
            assert yaml.safe_load(text) == built("defaults")[path.name]
        else:
            assert json.loads(text) == build_fis_templates(spec(), SOURCE, options)[path.name]
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    rooted = build_chaos_outputs(spec(), SOURCE, options, Path("game"))
    assert {Path("game") / p for p in first} == set(rooted)


def test_plain_generate_writes_no_experiment() -> None:
    outputs = build_outputs(spec(), SOURCE)
    assert not any({"chaos-mesh", "aws-fis"} & set(path.parts) for path in outputs)
    assert not any(CHAOS_MESH_API in text or "aws:ec2:" in text for text in outputs.values())


# ---- bad input ------------------------------------------------------------------------------


BAD = {
    "an unknown region": (ChaosOptions(region="tertiary"), r"region 'tertiary'.*primary, second"),
    "a serving label key with a space": (
        ChaosOptions(serving_selector=(("app name", "x"),)),
        "serving selector: 'app name' is not a label key",
    ),
    "a serving label value too long": (
        ChaosOptions(serving_selector=(("app", "x" * 64),)),
        "serving selector: app=.*at most 63",
    ),
    "no serving label": (ChaosOptions(serving_selector=()), "serving selector: give at least"),
    "a bad milvus label": (
        ChaosOptions(milvus_replica_selector=(("app", "-x"),)),
        "milvus replica selector",
    ),
    "a bad namespace": (
        ChaosOptions(kubernetes=KubernetesOptions(namespace="Game_Day")),
        "namespace 'Game_Day' is not a DNS-1123 label",
    ),
    "a duration shorter than the alert needs": (
        ChaosOptions(durations=(("exporter-down", 60.0),)),
        r"exporter-down needs at least \d+s \(SLIAbsent",
    ),
    "a duration over the bound": (
        ChaosOptions(durations=(("latency", 7200.0),)),
        "allowed 30s to 1h",
    ),
    "a duration for no experiment": (
        ChaosOptions(durations=(("spot-one", 600.0),)),
        "no such experiment; choose from: latency,",
    ),
    "a role that is not an IAM role ARN": (
        ChaosOptions(fis=FisOptions("arn:aws:iam::123:user/me", "us-east-1a")),
        "fis role ARN .* is not an IAM role ARN",
    ),
    "an availability zone that is a region": (
        ChaosOptions(fis=FisOptions(ROLE, "us-east-1")),
        "fis availability zone 'us-east-1'",
    ),
    "an alarm that is not a CloudWatch alarm ARN": (
        ChaosOptions(fis=FisOptions(ROLE, "us-east-1a", "arn:aws:sns:us-east-1:1:x")),
        "fis alarm ARN",
    ),
    "an AWS-reserved tag key": (
        ChaosOptions(fis=FisOptions(ROLE, "us-east-1a", None, "aws:gameday")),
        "fis tag key",
    ),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_options_fail_naming_the_option(what: str) -> None:
    options, message = BAD[what]
    with pytest.raises(ChaosBuildError, match=message):
        build_chaos_outputs(spec(), SOURCE, options)


def test_a_spec_whose_spot_notice_fis_cannot_send_fails() -> None:
    short = spec().model_copy(
        update={"spot": spec().spot.model_copy(
            update={"notice_seconds": spec().spot.notice_seconds.model_copy(update={"aws": 60})}
        )}
    )  # fmt: skip
    with pytest.raises(ChaosBuildError, match="spot.notice_seconds.aws 60: FIS interrupts after"):
        build_fis_templates(short, SOURCE, ChaosOptions(fis=FIS))


def test_label_and_duration_items_parse_or_name_the_option() -> None:
    assert parse_labels(["a=b", "c/d=e=f"], "--x") == (("a", "b"), ("c/d", "e=f"))
    with pytest.raises(ChaosBuildError, match="--x 'ab': expected KEY=VALUE"):
        parse_labels(["ab"], "--x")
    assert parse_durations(["latency=10m", "breaker=90s"]) == (("latency", 600), ("breaker", 90))
    with pytest.raises(ChaosBuildError, match="duration 'latency': expected NAME=DURATION"):
        parse_durations(["latency"])
    with pytest.raises(ChaosBuildError, match="duration 'latency=ten'"):
        parse_durations(["latency=ten"])


# ---- the command ----------------------------------------------------------------------------

FIS_ARGS = ["--fis-role-arn", ROLE, "--fis-az", "us-east-1a"]


def test_generate_chaos_writes_then_checks_the_experiments(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "gameday"
    result = runner.invoke(cli_app, ["generate", "--chaos", str(out), *FIS_ARGS])
    assert result.exit_code == 0, result.output
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert written == {str(p) for p in build_chaos_outputs(spec(), SOURCE, ChaosOptions(fis=FIS))}
    check = runner.invoke(cli_app, ["generate", "--chaos", str(out), "--check", *FIS_ARGS])
    assert check.exit_code == 0, check.output
    assert "11 generated files are up to date" in check.output
    (out / "chaos-mesh" / "latency.yaml").write_text("edited\n")
    drift = runner.invoke(cli_app, ["generate", "--chaos", str(out), "--check", *FIS_ARGS])
    assert drift.exit_code == 1
    assert "chaos-mesh/latency.yaml: differs" in drift.output


def test_generate_chaos_takes_the_options(tmp_path: Path) -> None:
    out = tmp_path / "gameday"
    result = CliRunner().invoke(
        cli_app,
        ["generate", "--chaos", str(out), "--namespace", "genai-sla", "--serving-namespace",
         "serving", "--region", "secondary", "--serving-selector",
         "app.kubernetes.io/component=lora-router", "--serving-selector", "zone={region}",
         "--duration", "latency=10m"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not (out / "aws-fis").exists()
    latency = yaml.safe_load((out / "chaos-mesh" / "latency.yaml").read_text())
    assert latency["metadata"]["namespace"] == "genai-sla"
    assert latency["spec"]["duration"] == "10m"
    assert latency["spec"]["selector"] == {
        "namespaces": ["serving"],
        "labelSelectors": {"app.kubernetes.io/component": "lora-router", "zone": "secondary"},
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--region", "primary"], "need --chaos DIR"),
        (["--chaos", "x", "--kubernetes", "y"], "--chaos takes no --kubernetes"),
        (["--chaos", "x", "--fis-az", "us-east-1a"], "--fis-role-arn and --fis-az together"),
        (["--chaos", "x", "--region", "tertiary"], "region 'tertiary' is not a region"),
        (["--chaos", "x", "--serving-selector", "app"], "--serving-selector 'app': expected"),
        (["--chaos", "x", "--duration", "latency=1m"], "latency needs at least"),
    ],
)
def test_generate_chaos_refuses_bad_input_with_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    args = [str(tmp_path / a) if a in ("x", "y") else a for a in args]
    result = CliRunner().invoke(cli_app, ["generate", *args, "--check"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_docs_table_names_each_experiments_kind_and_default_duration() -> None:
    doc = (ROOT / "docs" / "kubernetes.md").read_text("utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z-]+)` \|.*$", doc, re.M)}
    for name, resource in built("defaults").items():
        drill = name.removesuffix(".yaml")
        cells = [c.strip() for c in rows[drill].split("|")]
        assert cells[2] == resource["kind"], drill
        assert cells[5] == resource["spec"]["duration"], drill
    for experiment in FIS_EXPERIMENTS:
        assert rows[experiment].split("|")[2].strip() == "FIS", experiment
