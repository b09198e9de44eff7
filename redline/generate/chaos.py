"""Game-day experiments for the user's cluster, one per drill of the local stack that has a real
infrastructure fault: Chaos Mesh objects (`chaos-mesh.org/v1alpha1`) for the Kubernetes drills
and AWS FIS experiment templates (the `CreateExperimentTemplate` request) for the spot drills.

Each Chaos Mesh object selects pods by the labels of the generated `deploy/kubernetes` workloads
(`redline.generate.kubernetes`' own helpers) or by the user's labels, given as options: the
serving pods (default `redline.dev/serving: "true"`, what the spot agent already selects, plus
`redline.dev/region: <region>`), the Milvus replica and Redis. Every object carries a bounded
`duration` (long enough for its alert to fire, from the spec), the namespace, and the labels
`app.kubernetes.io/managed-by: redline` and `redline.dev/drill: <drill>`, so a game day finds
and deletes what it started. The FIS templates carry the same two keys as tags, a stop
condition (a CloudWatch alarm, or `none`), the role FIS assumes and, in their description, the
DO-NOT-EDIT note (JSON has no comments).

`build_chaos_mesh_experiments` and `build_fis_templates` are pure; `build_chaos_outputs`
renders both (YAML with the DO-NOT-EDIT header; sorted JSON). `redline generate --chaos DIR`
writes them to DIR (`chaos-mesh/<drill>.yaml`, `aws-fis/<drill>.json`); nothing is written by a
plain `redline generate`. docs/kubernetes.md ("Game days") says how to run them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redline.generate.kube_redis import DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS
from redline.generate.kube_redis import _labels as redis_labels
from redline.generate.kubernetes import (
    EXPORTERS,
    NAME_LABEL,
    REPLICATOR,
    SERVING_POD_SELECTOR,
    SERVING_PORT,
    SESSIONS,
    KubernetesBuildError,
    KubernetesOptions,
)
from redline.generate.kubernetes import _labels as workload_labels
from redline.rules.model import format_duration
from redline.rules.render import render_yaml
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

CHAOS_MESH_API = "chaos-mesh.org/v1alpha1"
CHAOS_MESH_DIR = Path("chaos-mesh")
FIS_DIR = Path("aws-fis")
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "redline"
"""Not `redline-generate` (deploy/kubernetes' value): deleting the experiments by this label
can never touch the deployment."""
DRILL_LABEL = "redline.dev/drill"
REGION_LABEL = "redline.dev/region"
REGION_PLACEHOLDER = "{region}"
"""Written in a serving selector value, replaced by the region the experiment targets."""

_SERVING_KEY, _, _SERVING_VALUE = SERVING_POD_SELECTOR.partition("=")
DEFAULT_SERVING_SELECTOR: tuple[tuple[str, str], ...] = (
    (_SERVING_KEY, _SERVING_VALUE),
    (REGION_LABEL, REGION_PLACEHOLDER),
)
DEFAULT_MILVUS_REPLICA_SELECTOR: tuple[tuple[str, str], ...] = (
    (NAME_LABEL, "milvus"),
    ("app.kubernetes.io/instance", "milvus-replica"),
)
"""The milvus Helm chart's labels for a release named `milvus-replica`, whose Service is the
`milvus-replica` deploy/kubernetes points the index replicator at."""

MIN_DURATION_SECONDS = 30
MAX_DURATION_SECONDS = 3600
"""Every experiment ends by itself within this, whatever happens to the game day."""
REPAIR_MARGIN_SECONDS = 300
"""Added to the time an alert needs to fire: notification, playbook and verification."""
DEFAULT_HOLD_DOWN_SECONDS = 300
"""The receiver's default `reroute.hold_down_seconds` (remediation settings)."""
AZ_POWER_DEFAULT_SECONDS = 1800
"""The FIS AZ Availability: Power Interruption scenario's default interruption (30 minutes)."""
BREAKER_ERROR_PERCENT = 30
"""The share of the region's pods answering 500 (the local `breaker` drill's error rate)."""
STRESS_WORKERS, STRESS_LOAD = 2, 80

FIS_SPOT_NOTICE_RANGE = (120, 900)
"""`durationBeforeInterruption` of aws:ec2:send-spot-instance-interruptions: PT2M to PT15M."""
DEFAULT_FIS_TAG_KEY = "redline-gameday"
"""Opt-in tag: FIS targets only resources carrying it (values: spot, stop, subnet, asg)."""

CHAOS_MESH_DRILLS = (
    "latency",
    "latency-persistent",
    "staleness",
    "session-rpo",
    "exporter-down",
    "breaker",
    "regression-negative",
    "redis-failover",
)
FIS_EXPERIMENTS = ("spot-one", "spot-two", "az-power")
"""`az-power` has no local drill: the spot-two capacity loss plus the zone's other nodes."""

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")  # fmt: skip
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_ALARM_ARN = re.compile(r"^arn:aws[a-z-]*:cloudwatch:[a-z0-9-]+:\d{12}:alarm:\S{1,255}$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z0-9]+)+[a-z]$")
_TAG_KEY = re.compile(r"^(?!aws:)[\w.:/=+@-]{1,128}$")


class ChaosBuildError(Exception):
    """The options cannot make the experiments (a bad selector, region, duration or ARN)."""


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class FisOptions:
    """Where the FIS templates act: the role FIS assumes, the zone, the stop condition."""

    role_arn: str
    availability_zone: str
    alarm_arn: str | None = None
    """The CloudWatch alarm that stops an experiment; None: stop condition `none`."""
    tag_key: str = DEFAULT_FIS_TAG_KEY

    def check(self) -> None:
        """ChaosBuildError naming the first FIS option that cannot be used."""
        if not _ROLE_ARN.match(self.role_arn):
            raise ChaosBuildError(
                f"fis role ARN {self.role_arn!r} is not an IAM role ARN "
                "(arn:aws:iam::<12-digit account>:role/<name>)"
            )
        if not _AZ.match(self.availability_zone):
            raise ChaosBuildError(
                f"fis availability zone {self.availability_zone!r} is not a zone name "
                "like us-east-1a"
            )
        if self.alarm_arn is not None and not _ALARM_ARN.match(self.alarm_arn):
            raise ChaosBuildError(
                f"fis alarm ARN {self.alarm_arn!r} is not a CloudWatch alarm ARN "
                "(arn:aws:cloudwatch:<region>:<account>:alarm:<name>)"
            )
        if not _TAG_KEY.match(self.tag_key):
            raise ChaosBuildError(
                f"fis tag key {self.tag_key!r} is not a tag key (1-128 of letters, digits, "
                "spaces and _.:/=+-@, not starting with aws:)"
            )


@dataclass(frozen=True)
class ChaosOptions:
    """What the experiments act on: namespaces, region, the user's pod labels, durations."""

    kubernetes: KubernetesOptions = field(default_factory=KubernetesOptions)
    """Namespaces (redline's, where the experiments live, and the serving one)."""
    region: str | None = None
    """The region faulted; None: the spec's first (the primary)."""
    serving_selector: Labels = DEFAULT_SERVING_SELECTOR
    milvus_replica_selector: Labels = DEFAULT_MILVUS_REPLICA_SELECTOR
    redis_selector: Labels = ()
    """Labels of the Redis pods; empty: those of deploy/kubernetes/redis-sentinel."""
    durations: tuple[tuple[str, float], ...] = ()
    """Experiment name -> seconds, replacing the default derived from the spec."""
    fis: FisOptions | None = None
    """None: no FIS template is written."""

    def check(self, spec: Spec) -> None:
        """ChaosBuildError naming the first option that cannot be used with `spec`."""
        try:
            self.kubernetes.check()
        except KubernetesBuildError as exc:
            raise ChaosBuildError(str(exc)) from None
        if self.region is not None and self.region not in spec.regions:
            raise ChaosBuildError(
                f"region {self.region!r} is not a region of the spec; choose from: "
                + ", ".join(spec.regions)
            )
        for what, labels in (
            ("serving selector", self.serving_selector),
            ("milvus replica selector", self.milvus_replica_selector),
            ("redis selector", self.redis_selector),
        ):
            if not labels and what != "redis selector":
                raise ChaosBuildError(f"{what}: give at least one KEY=VALUE label")
            _check_labels(what, _with_region(labels, self.target_region(spec)))
        names = self.experiment_names()
        for name, seconds in self.durations:
            if name not in names:
                raise ChaosBuildError(
                    f"duration for {name!r}: no such experiment; choose from: " + ", ".join(names)
                )
            if not MIN_DURATION_SECONDS <= seconds <= MAX_DURATION_SECONDS:
                raise ChaosBuildError(
                    f"duration {name}={format_duration(seconds)}: allowed "
                    f"{format_duration(MIN_DURATION_SECONDS)} to "
                    f"{format_duration(MAX_DURATION_SECONDS)}"
                )
        if self.fis is not None:
            self.fis.check()

    def target_region(self, spec: Spec) -> str:
        """The region the serving experiments fault."""
        return self.region or spec.regions[0]

    def experiment_names(self) -> tuple[str, ...]:
        """Every experiment with a duration these options generate (the spot interruptions
        have none: the notice is the spec's)."""
        return CHAOS_MESH_DRILLS + (("az-power",) if self.fis is not None else ())

    @property
    def redis(self) -> Labels:
        """The Redis pods' labels in effect."""
        return self.redis_selector or tuple(redis_labels().items())


def _with_region(labels: Labels, region: str) -> Labels:
    return tuple((key, value.replace(REGION_PLACEHOLDER, region)) for key, value in labels)


def _check_labels(what: str, labels: Labels) -> None:
    for key, value in labels:
        if not _LABEL_KEY.match(key) or len(key.rpartition("/")[2]) > 63:
            raise ChaosBuildError(f"{what}: {key!r} is not a label key (prefix/name)")
        if not _LABEL_VALUE.match(value) or len(value) > 63:
            raise ChaosBuildError(
                f"{what}: {key}={value!r}: a label value is at most 63 letters, digits, "
                "'-', '_' or '.', starting and ending with a letter or digit"
            )


def parse_labels(items: list[str], what: str) -> Labels:
    """KEY=VALUE items as labels; ChaosBuildError naming `what` for one without `=`."""
    labels: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ChaosBuildError(f"{what} {item!r}: expected KEY=VALUE")
        labels.append((key, value))
    return tuple(labels)


def parse_durations(items: list[str]) -> tuple[tuple[str, float], ...]:
    """NAME=DURATION items (e.g. latency=10m) as (experiment, seconds)."""
    found: list[tuple[str, float]] = []
    for item in items:
        name, sep, text = item.partition("=")
        try:
            if not sep:
                raise ValueError("expected NAME=DURATION, e.g. latency=10m")
            found.append((name, parse_duration(text)))
        except ValueError as exc:
            raise ChaosBuildError(f"duration {item!r}: {exc}") from None
    return tuple(found)


# ---- what each drill needs ------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    """How long an experiment's fault must last for its loop to close, and why."""

    seconds: float
    why: str


def _pipeline(spec: Spec) -> float:
    """Scrapes, rule evaluations and Alertmanager's group_wait between a condition and a page."""
    t = spec.timing
    return 2 * t.scrape_interval_seconds + 2 * t.evaluation_interval_seconds + t.group_wait_seconds


def drill_needs(spec: Spec) -> dict[str, Need]:
    """Each experiment's minimum duration from the spec (what its alert or check waits for)."""
    lag = _pipeline(spec)
    latency = spec.red_lines.latency_p99
    index = spec.red_lines.index_consistency
    session = spec.rpo.session_state
    breakers = spec.breakers
    window = parse_duration(latency.window)
    persistent = latency.for_seconds + lag + window + DEFAULT_HOLD_DOWN_SECONDS
    persistent += latency.restore.for_seconds
    return {
        "latency": Need(
            latency.for_seconds + lag, f"{Alert.RED_LINE_LATENCY_P99}'s for + the pipeline"
        ),
        "latency-persistent": Need(
            persistent,
            "the latency loop, the P99 window emptying after the reroute, the receiver's "
            "default hold-down and one restore period",
        ),
        "staleness": Need(
            index.max_staleness_seconds + index.for_seconds + lag,
            f"max staleness + {Alert.RED_LINE_INDEX_STALENESS}'s for + the pipeline",
        ),
        "session-rpo": Need(
            session.max_seconds + session.for_seconds + lag,
            f"the session RPO + {Alert.SESSION_RPO_BREACH}'s for + the pipeline",
        ),
        "exporter-down": Need(
            spec.timing.absent_for_seconds + lag, f"{Alert.SLI_ABSENT}'s absent_for + the pipeline"
        ),
        "breaker": Need(
            parse_duration(breakers.window) + parse_duration(breakers.open_for),
            "the breaker window and one open period (its half-open probes must fail once)",
        ),
        "regression-negative": Need(
            spec.rollback.window_seconds + lag,
            "a full rollback-gate window of the slower traffic",
        ),
        "redis-failover": Need(
            (DOWN_AFTER_MS + FAILOVER_TIMEOUT_MS) / 1000,
            "the Sentinels' down-after and failover timeout",
        ),
        "az-power": Need(
            spec.spot.notice_seconds.aws + REPAIR_MARGIN_SECONDS,
            "the spot notice and the repair margin",
        ),
    }


def experiment_durations(spec: Spec, options: ChaosOptions) -> dict[str, float]:
    """Each experiment's duration in seconds: the option, else its need plus the repair margin
    in whole minutes (az-power: the FIS scenario's 30 minutes); ChaosBuildError when shorter
    than its need or over the bound."""
    needs = drill_needs(spec)
    given = dict(options.durations)
    found: dict[str, float] = {}
    for name in options.experiment_names():
        need = needs[name]
        if name in given:
            seconds = given[name]
        elif name == "az-power":
            seconds = max(AZ_POWER_DEFAULT_SECONDS, need.seconds)
        else:
            seconds = math.ceil((need.seconds + REPAIR_MARGIN_SECONDS) / 60) * 60
            seconds = min(seconds, MAX_DURATION_SECONDS)
        if seconds < need.seconds or seconds > MAX_DURATION_SECONDS:
            raise ChaosBuildError(
                f"duration {name}={format_duration(seconds)}: {name} needs at least "
                f"{format_duration(math.ceil(need.seconds))} ({need.why}) and at most "
                f"{format_duration(MAX_DURATION_SECONDS)}"
            )
        found[name] = seconds
    return found


# ---- Chaos Mesh ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One Chaos Mesh experiment: its kind, what it injects, what it expects, what differs."""

    drill: str
    kind: str
    spec: dict[str, Any]
    expects: str
    differs: str


def _selector(namespace: str, labels: Labels) -> dict[str, Any]:
    return {"namespaces": [namespace], "labelSelectors": dict(labels)}


def _workload(name: str, options: ChaosOptions) -> dict[str, Any]:
    return _selector(options.kubernetes.namespace, tuple(workload_labels(name).items()))


def _red_line_delay(spec: Spec) -> str:
    # As the local drill: 0.1 s past the red line, so every request breaches it.
    return format_duration(spec.red_lines.latency_p99.threshold_seconds + 0.1)


def build_plans(spec: Spec, options: ChaosOptions) -> list[Plan]:
    """The Chaos Mesh experiment of each drill, in CHAOS_MESH_DRILLS order (no duration)."""
    region = options.target_region(spec)
    serving = _selector(options.kubernetes.serving, _with_region(options.serving_selector, region))
    latency = _red_line_delay(spec)
    delay: dict[str, Any] = {"action": "delay", "mode": "all", "selector": serving,
                             "direction": "to", "delay": {"latency": latency}}  # fmt: skip
    index = spec.red_lines.index_consistency
    return [
        Plan(
            "latency",
            "NetworkChaos",
            delay,
            Alert.RED_LINE_LATENCY_P99,
            f"egress of {region}'s serving pods delayed {latency} per packet "
            "(the local drill adds 0.9 s per request in the simulator); the pods' other "
            "traffic (scrapes, probes) is delayed too",
        ),
        Plan(
            "latency-persistent",
            "NetworkChaos",
            delay,
            Alert.RED_LINE_LATENCY_P99,
            "the latency fault kept through the reroute's hold-down and a restore period (the "
            "local drill keeps it 4 restore periods); the restore must not hand traffic back "
            "while it lasts",
        ),
        Plan(
            "staleness",
            "NetworkChaos",
            {
                "action": "partition",
                "mode": "all",
                "selector": _workload(REPLICATOR, options),
                "direction": "to",
                "target": {
                    "mode": "all",
                    "selector": _selector(
                        options.kubernetes.serving, options.milvus_replica_selector
                    ),
                },
            },
            Alert.RED_LINE_INDEX_STALENESS,
            "the index replicator is cut from the Milvus replica (the local drill pauses it): "
            "it still reads the delta log, its writes to the replica fail and retry; "
            f"the replica falls past {index.max_staleness_seconds:g} s behind",
        ),
        Plan(
            "session-rpo",
            "NetworkChaos",
            {
                "action": "partition",
                "mode": "all",
                "selector": _workload(SESSIONS, options),
                "direction": "to",
                "target": {
                    "mode": "all",
                    "selector": _selector(options.kubernetes.namespace, options.redis),
                },
            },
            Alert.SESSION_RPO_BREACH,
            "the session CDC consumer is cut from Redis (the local drill freezes it with "
            "SIGSTOP): its connections time out and it reconnects after, rather than resuming "
            "mid-call; the consumer group's pending entries are delivered again",
        ),
        Plan(
            "exporter-down",
            "PodChaos",
            {"action": "pod-failure", "mode": "all", "selector": _workload(EXPORTERS, options)},
            Alert.SLI_ABSENT,
            "the exporter pods run a pause image for the duration (the local drill SIGKILLs the "
            "process and restarts it after the alert): a pod-kill would be replaced by the "
            f"Deployment before {Alert.SLI_ABSENT}'s absent_for",
        ),
        Plan(
            "breaker",
            "HTTPChaos",
            {
                "mode": "fixed-percent",
                "value": str(BREAKER_ERROR_PERCENT),
                "selector": serving,
                "target": "Response",
                "port": SERVING_PORT,
                "replace": {"code": 500},
            },
            f"none may fire ({Alert.GATEWAY_BREAKER_OPEN} needs {spec.breakers.alert_after})",
            f"{BREAKER_ERROR_PERCENT} % of {region}'s serving pods answer every request with 500 "
            f"on port {SERVING_PORT} (the local drill: every pod answers "
            f"{BREAKER_ERROR_PERCENT} % of requests with 500); needs at least "
            f"{math.ceil(100 / BREAKER_ERROR_PERCENT)} pods in the region, and plain HTTP",
        ),
        Plan(
            "regression-negative",
            "StressChaos",
            {
                "mode": "all",
                "selector": serving,
                "stressors": {"cpu": {"workers": STRESS_WORKERS, "load": STRESS_LOAD}},
            },
            f"none may fire ({Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL}: slower, answers unchanged)",
            f"CPU stress slows {region}'s serving pods with the same version and answers (the "
            "local drill deploys a slower v3); a GPU-bound engine may slow only a little, and "
            f"{Alert.RED_LINE_LATENCY_P99} may fire if the slowdown crosses the red line",
        ),
        Plan(
            "redis-failover",
            "PodChaos",
            {
                "action": "pod-kill",
                "mode": "one",
                "selector": _selector(options.kubernetes.namespace, options.redis),
                "gracePeriod": 0,
            },
            "none may fire (the Sentinels promote a replica; nothing acknowledged is lost)",
            "one Redis pod of the set is killed at random, the primary one time in three (the "
            "local drill SIGKILLs the primary): ask a Sentinel which pod is the primary and run "
            "it again until that one is killed",
        ),
    ]


def build_chaos_mesh_experiments(
    spec: Spec, options: ChaosOptions | None = None
) -> dict[str, dict[str, Any]]:
    """Every Chaos Mesh object (file name -> object), one per drill, with its duration and the
    labels that find it; ChaosBuildError when the options cannot be used."""
    options = options if options is not None else ChaosOptions()
    options.check(spec)
    durations = experiment_durations(spec, options)
    found: dict[str, dict[str, Any]] = {}
    for plan in build_plans(spec, options):
        found[f"{plan.drill}.yaml"] = {
            "apiVersion": CHAOS_MESH_API,
            "kind": plan.kind,
            "metadata": {
                "name": f"redline-{plan.drill}",
                "namespace": options.kubernetes.namespace,
                "labels": {
                    MANAGED_BY_LABEL: MANAGED_BY,
                    "app.kubernetes.io/part-of": "redline",
                    DRILL_LABEL: plan.drill,
                },
                "annotations": {
                    "redline.dev/expects": str(plan.expects),
                    "redline.dev/differs-from-local-drill": plan.differs,
                },
            },
            "spec": {**plan.spec, "duration": format_duration(durations[plan.drill])},
        }
    return found


# ---- AWS FIS ---------------------------------------------------------------------------------


def iso_duration(seconds: float) -> str:
    """An ISO 8601 duration as FIS takes it (PT2M, PT90S)."""
    whole = math.ceil(seconds)
    return f"PT{whole // 60}M" if whole % 60 == 0 else f"PT{whole}S"


def _running(*extra: tuple[str, str]) -> list[dict[str, Any]]:
    filters = [("State.Name", "running"), *extra]
    return [{"path": path, "values": [value]} for path, value in filters]


def _template(
    name: str,
    about: str,
    source: str,
    fis: FisOptions,
    targets: dict[str, Any],
    actions: dict[str, Any],
    empty_targets: str,
) -> dict[str, Any]:
    stop = (
        {"source": "aws:cloudwatch:alarm", "value": fis.alarm_arn}
        if fis.alarm_arn is not None
        else {"source": "none"}
    )
    return {
        "description": f"redline game day {name}: {about} "
        f"Code generated by redline generate from {source}; DO NOT EDIT.",
        "targets": targets,
        "actions": actions,
        "stopConditions": [stop],
        "roleArn": fis.role_arn,
        "tags": {"Name": f"redline-{name}", MANAGED_BY_LABEL: MANAGED_BY, DRILL_LABEL: name},
        "experimentOptions": {
            "accountTargeting": "single-account",
            "emptyTargetResolutionMode": empty_targets,
        },
    }


def build_fis_templates(
    spec: Spec, source: str, options: ChaosOptions | None = None
) -> dict[str, dict[str, Any]]:
    """The FIS experiment templates (file name -> CreateExperimentTemplate request, without the
    clientToken the SDK and CLI fill in); none without `options.fis`."""
    options = options if options is not None else ChaosOptions()
    options.check(spec)
    fis = options.fis
    if fis is None:
        return {}
    notice = spec.spot.notice_seconds.aws
    low, high = FIS_SPOT_NOTICE_RANGE
    if not low <= notice <= high:
        raise ChaosBuildError(
            f"spot.notice_seconds.aws {notice:g}: FIS interrupts after {low} to {high} s "
            "(durationBeforeInterruption PT2M to PT15M)"
        )
    durations = experiment_durations(spec, options)
    key = fis.tag_key
    az = fis.availability_zone

    def spot(selection: str, *filters: tuple[str, str]) -> dict[str, Any]:
        return {
            "resourceType": "aws:ec2:spot-instance",
            "resourceTags": {key: "spot"},
            "filters": _running(*filters),
            "selectionMode": selection,
        }

    interrupt = {
        "actionId": "aws:ec2:send-spot-instance-interruptions",
        "parameters": {"durationBeforeInterruption": iso_duration(notice)},
        "targets": {"SpotInstances": "spot-instances"},
    }
    window = iso_duration(durations["az-power"])
    in_zone = ("Placement.AvailabilityZone", az)
    return {
        "spot-one.json": _template(
            "spot-one",
            f"one running spot instance tagged {key}=spot gets the interruption notice.",
            source,
            fis,
            {"spot-instances": spot("COUNT(1)")},
            {"interrupt-one": {**interrupt, "description": "one spot instance interrupted"}},
            "fail",
        ),
        "spot-two.json": _template(
            "spot-two",
            f"every running spot instance tagged {key}=spot gets the notice at once.",
            source,
            fis,
            {"spot-instances": spot("ALL")},
            {"interrupt-all": {**interrupt, "description": "every tagged spot instance"}},
            "fail",
        ),
        "az-power.json": _template(
            "az-power",
            f"the AZ Availability: Power Interruption scenario's zonal actions in {az}, for "
            f"{window}, on resources tagged {key}=stop/spot/subnet/asg.",
            source,
            fis,
            {
                "az-instances": {
                    "resourceType": "aws:ec2:instance",
                    "resourceTags": {key: "stop"},
                    "filters": _running(in_zone),
                    "selectionMode": "ALL",
                },
                "spot-instances": spot("ALL", in_zone),
                "az-subnets": {
                    "resourceType": "aws:ec2:subnet",
                    "resourceTags": {key: "subnet"},
                    "filters": [{"path": "AvailabilityZone", "values": [az]}],
                    "selectionMode": "ALL",
                },
                "az-asgs": {
                    "resourceType": "aws:ec2:autoscaling-group",
                    "resourceTags": {key: "asg"},
                    "selectionMode": "ALL",
                },
            },
            {
                "stop-instances": {
                    "actionId": "aws:ec2:stop-instances",
                    "description": "the zone's on-demand nodes lose power, restart after",
                    "parameters": {
                        "startInstancesAfterDuration": window,
                        "completeIfInstancesTerminated": "true",
                    },
                    "targets": {"Instances": "az-instances"},
                },
                "interrupt-spot": {
                    **interrupt,
                    "description": "the zone's spot nodes get the notice (they cannot be stopped)",
                },
                "disrupt-subnets": {
                    "actionId": "aws:network:disrupt-connectivity",
                    "description": "the zone's subnets lose connectivity",
                    "parameters": {"duration": window, "scope": "all"},
                    "targets": {"Subnets": "az-subnets"},
                },
                "pause-asg-launches": {
                    "actionId": "aws:ec2:asg-insufficient-instance-capacity-error",
                    "description": "no replacement launches in the zone",
                    "parameters": {
                        "availabilityZoneIdentifiers": az,
                        "duration": window,
                        "percentage": "100",
                    },
                    "targets": {"AutoScalingGroups": "az-asgs"},
                },
            },
            # As the scenario: an action whose resources are not tagged is skipped.
            "skip",
        ),
    }


FIS_ACTION_IDS = (
    "aws:ec2:send-spot-instance-interruptions",
    "aws:ec2:stop-instances",
    "aws:network:disrupt-connectivity",
    "aws:ec2:asg-insufficient-instance-capacity-error",
)
"""Every FIS action the templates use (tests/data/aws-fis/README.md names their source)."""


# ---- outputs ---------------------------------------------------------------------------------


def render_fis_template(template: dict[str, Any]) -> str:
    """A template as `aws fis create-experiment-template --cli-input-json` reads it."""
    return json.dumps(template, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def build_chaos_outputs(
    spec: Spec, source: str, options: ChaosOptions | None = None, root: Path = Path(".")
) -> dict[Path, str]:
    """Every experiment (path under `root` -> text): Chaos Mesh YAML with the DO-NOT-EDIT
    header under chaos-mesh/, FIS JSON under aws-fis/ (with `options.fis`)."""
    outputs = {
        root / CHAOS_MESH_DIR / name: render_yaml(resource, source)
        for name, resource in build_chaos_mesh_experiments(spec, options).items()
    }
    for name, template in build_fis_templates(spec, source, options).items():
        outputs[root / FIS_DIR / name] = render_fis_template(template)
    return outputs


__all__ = [
    "CHAOS_MESH_API",
    "CHAOS_MESH_DRILLS",
    "DEFAULT_MILVUS_REPLICA_SELECTOR",
    "DEFAULT_SERVING_SELECTOR",
    "DRILL_LABEL",
    "FIS_ACTION_IDS",
    "FIS_EXPERIMENTS",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "MAX_DURATION_SECONDS",
    "ChaosBuildError",
    "ChaosOptions",
    "FisOptions",
    "build_chaos_mesh_experiments",
    "build_chaos_outputs",
    "build_fis_templates",
    "drill_needs",
    "experiment_durations",
    "parse_durations",
    "parse_labels",
]
