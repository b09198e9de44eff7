"""The GPU family: NVIDIA's drain-now XIDs, the spec's playbook and labels, the `gpu:` section's
validation, and the other exporters' series the rules read (the catalog and its doc table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from redline.rules.build import build_rule_groups
from redline.rules.families import gpu
from redline.rules.model import AlertRule, RecordingRule, RuleGroup
from redline.rules.promtool_cases import AlertIndex
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.load import SpecError, default_spec_text, load_spec, parse_spec
from redline.slo.spec import NVIDIA_DRAIN_XIDS, PLAYBOOK_NAMES, Gpu, Spec

ROOT = Path(__file__).resolve().parents[3]

# NVIDIA's Xid catalog's immediate action for these (NVSentinel's xiderrorsmapping.csv, the
# column spec.py cites): RESET_GPU / RESTART_BM / RESTART_VM / hardware workflows, and 154.
DRAIN_NOW = {46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 151, 154, 155, 156}
DRAIN_NOW |= {158, 160, 162, *range(144, 151)}
# RESTART_APP (8, 11, 13, 31, 94), IGNORE (43, 63, 92), WORKFLOW_XID_45 (45).
WATCH = {8, 11, 13, 31, 43, 45, 63, 92, 94}


@pytest.fixture()
def spec() -> Spec:
    return load_spec().spec


def _with_gpu(spec: Spec, **changes: object) -> Spec:
    return spec.model_copy(update={"gpu": Gpu.model_validate({**spec.gpu.model_dump(), **changes})})


def _group(spec: Spec) -> RuleGroup:
    (group,) = gpu.build_rules(spec)
    return group


def _alerts(spec: Spec, name: str) -> list[AlertRule]:
    return [rule for rule in _group(spec).alerts if rule.alert == name]


def _record(spec: Spec, name: str) -> RecordingRule:
    return next(rule for rule in _group(spec).recordings if rule.record == name)


def test_the_default_drain_set_is_nvidias_reset_reboot_and_hardware_xids() -> None:
    assert set(NVIDIA_DRAIN_XIDS) == DRAIN_NOW
    assert not WATCH & set(NVIDIA_DRAIN_XIDS)


def _members(expr: str, series_name: str) -> set[int]:
    """The values 0..1000 the `xid_in` filter keeps."""
    kept: set[int] = set()
    for clause in expr.split("\nor "):
        single = re.fullmatch(rf"{re.escape(series_name)} == (\d+)", clause)
        span = re.fullmatch(rf"{re.escape(series_name)} >= (\d+) <= (\d+)", clause)
        assert single or span, clause
        if single:
            kept.add(int(single.group(1)))
        elif span:
            kept.update(range(int(span.group(1)), int(span.group(2)) + 1))
    return kept


@pytest.mark.parametrize("xids", [NVIDIA_DRAIN_XIDS, (13,), (1, 2, 3, 5, 7, 8)])
def test_the_xid_filter_keeps_exactly_the_set(xids: tuple[int, ...]) -> None:
    expr = gpu.xid_in(catalog.GPU_XID_LAST_RECORD, xids)
    assert _members(expr, catalog.GPU_XID_LAST_RECORD) == set(xids)


def test_the_drain_record_reads_the_spec_set(spec: Spec) -> None:
    drain = _record(spec, catalog.GPU_XID_DRAIN_RECORD).expr
    assert _members(drain, catalog.GPU_XID_LAST_RECORD) == set(spec.gpu.drain_xids)
    changed = _with_gpu(spec, drain_xids=(79, 48))
    drain = _record(changed, catalog.GPU_XID_DRAIN_RECORD).expr
    assert _members(drain, catalog.GPU_XID_LAST_RECORD) == {48, 79}


def test_ignored_xids_raise_no_watch_ticket(spec: Spec) -> None:
    (watch,) = _alerts(spec, Alert.GPU_XID_WATCH)
    assert "unless (" not in watch.expr
    (watch,) = _alerts(_with_gpu(spec, ignore_xids=(13, 31)), Alert.GPU_XID_WATCH)
    assert f"unless ({catalog.GPU_XID_LAST_RECORD} == 13\nor " in watch.expr


@pytest.mark.parametrize("playbook", ["gpu_node_failure", "reroute", None])
def test_the_critical_xid_alert_routes_to_the_spec_playbook(
    spec: Spec, playbook: str | None
) -> None:
    (critical,) = _alerts(_with_gpu(spec, playbook=playbook), Alert.GPU_XID_CRITICAL)
    assert critical.labels.get(catalog.LABEL_PLAYBOOK) == playbook
    assert critical.labels["severity"] == "critical"


def test_the_default_playbook_is_the_alert_catalogs(spec: Spec) -> None:
    assert spec.gpu.playbook == Alert.GPU_XID_CRITICAL.playbook
    (critical,) = _alerts(spec, Alert.GPU_XID_CRITICAL)
    assert critical.labels[catalog.LABEL_PLAYBOOK] == Alert.GPU_XID_CRITICAL.playbook


def test_the_default_spec_validates_against_the_built_in_playbooks() -> None:
    # The default spec spells the playbook: the registry check reads the names a spec spells.
    assert load_spec(playbooks=PLAYBOOK_NAMES).spec.gpu.playbook == "gpu_node_failure"


def test_every_alert_names_its_node_from_the_spec_labels(spec: Spec) -> None:
    default = _group(spec)
    dcgm = f'"{catalog.LABEL_NODE}", "$1", "{catalog.DCGM_LABEL_HOSTNAME}", "(.+)"'
    assert dcgm in _record(spec, catalog.GPU_XID_LAST_RECORD).expr
    capacity = _record(spec, catalog.GPU_NODE_CAPACITY_RECORD).expr
    assert "label_replace" not in capacity  # kube-state-metrics' own label is `node` already
    renamed = _with_gpu(spec, node_label="kubernetes_node", dcgm_node_label="node")
    assert "label_replace" not in _record(renamed, catalog.GPU_XID_LAST_RECORD).expr
    capacity = _record(renamed, catalog.GPU_NODE_CAPACITY_RECORD).expr
    assert '"node", "$1", "kubernetes_node", "(.+)"' in capacity
    pods = _record(renamed, catalog.GPU_NODE_POD_RECORD).expr
    assert 'kubernetes_node!=""' in pods
    assert "kubernetes_node" not in "".join(rule.expr for rule in default.rules)


@pytest.mark.parametrize(
    ("resource", "label"), [("nvidia.com/gpu", "nvidia_com_gpu"), ("amd.com/gpu", "amd_com_gpu")]
)
def test_the_gpu_resource_is_read_as_kube_state_metrics_writes_it(
    spec: Spec, resource: str, label: str
) -> None:
    changed = _with_gpu(spec, resource=resource)
    assert gpu.resource_label(changed) == label
    assert f'resource="{label}"' in _record(changed, catalog.GPU_NODE_CAPACITY_RECORD).expr


def test_node_unhealthy_pages_or_tickets_by_cause(spec: Spec) -> None:
    causes = {
        r.labels["cause"]: r.labels["severity"] for r in _alerts(spec, Alert.GPU_NODE_UNHEALTHY)
    }
    assert causes == {
        "not_ready": "page",
        "row_remap_failure": "page",
        "ecc_uncorrectable": "page",
        "row_remap_pending": "ticket",
        "temperature": "ticket",
        "nvlink_errors": "ticket",
    }
    pods = {
        r.labels["cause"]: r.labels["severity"] for r in _alerts(spec, Alert.GPU_PODS_UNHEALTHY)
    }
    assert pods == {"restarts": "ticket", "pending": "ticket"}


def test_the_thresholds_come_from_the_spec(spec: Spec) -> None:
    changed = _with_gpu(
        spec,
        max_temperature_celsius=90,
        temperature_for="3m",
        not_ready_for="7m",
        restarts=5,
        restart_window="30m",
        pending_for="20m",
        nvlink_errors=12,
        error_window="15m",
        xid_window="20m",
    )
    rules = {(r.alert, r.labels.get("cause")): r for r in _group(changed).alerts}
    temperature = rules[(Alert.GPU_NODE_UNHEALTHY, "temperature")]
    assert temperature.expr.endswith("> 90") and temperature.for_seconds == 180
    assert rules[(Alert.GPU_NODE_UNHEALTHY, "not_ready")].for_seconds == 420
    assert rules[(Alert.GPU_NODE_UNHEALTHY, "nvlink_errors")].expr.endswith("> 12")
    assert "[15m]" in rules[(Alert.GPU_NODE_UNHEALTHY, "ecc_uncorrectable")].expr
    restarts = rules[(Alert.GPU_PODS_UNHEALTHY, "restarts")]
    assert "[30m]" in restarts.expr and restarts.expr.endswith(">= 5")
    assert rules[(Alert.GPU_PODS_UNHEALTHY, "pending")].for_seconds == 1200
    assert "[20m]" in rules[(Alert.GPU_XID_CRITICAL, None)].expr


def test_the_cases_follow_the_spec(spec: Spec) -> None:
    changed = _with_gpu(spec, ignore_xids=(13,), nvlink_errors=10)
    names = [case.name for case in gpu.build_tests(changed, AlertIndex(gpu.build_rules(changed)))]
    assert any("ignored XID" in name for name in names)
    default = [case.name for case in gpu.build_tests(spec, AlertIndex(gpu.build_rules(spec)))]
    assert not any("ignored XID" in name for name in default)


def _problems(gpu_section: dict[str, object]) -> list[str]:
    data = yaml.safe_load(default_spec_text())
    data["gpu"] = {**data["gpu"], **gpu_section}
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(data), "spec.yaml")
    return info.value.problems


@pytest.mark.parametrize(
    ("section", "field", "message"),
    [
        ({"drain_xids": [48, 79, 48]}, "drain_xids", "XIDs repeated: 48"),
        ({"drain_xids": []}, "drain_xids", "at least 1 item"),
        ({"drain_xids": [0]}, "drain_xids[0]", "greater than 0"),
        ({"ignore_xids": [13, 79]}, "ignore_xids", "79 also in drain_xids"),
        ({"xid_window": "30s"}, "xid_window", "at least 1m"),
        ({"restart_window": "5x"}, "restart_window", "pattern"),
        ({"max_temperature_celsius": 0}, "max_temperature_celsius", "greater than 0"),
        ({"restarts": 0}, "restarts", "greater than 0"),
        ({"nvlink_errors": -1}, "nvlink_errors", "greater than or equal to 0"),
        ({"resource": "nvidia com/gpu"}, "resource", "pattern"),
        ({"dcgm_node_label": "host-name"}, "dcgm_node_label", "pattern"),
        ({"colour": "green"}, "colour", "unknown field"),
    ],
)
def test_gpu_problems_name_the_field(section: dict[str, object], field: str, message: str) -> None:
    problems = _problems(section)
    assert any(p.startswith(f"spec.yaml: gpu.{field}: ") and message in p for p in problems), (
        problems
    )


def test_every_series_of_other_exporters_is_read_by_the_rules(spec: Spec) -> None:
    exprs = "\n".join(rule.expr for group in build_rule_groups(spec) for rule in group.rules)
    for metric in catalog.EXTERNAL_METRICS:
        assert re.search(rf"\b{re.escape(metric.name)}\b", exprs), metric.name
    assert catalog.DCGM_FI_DEV_XID_ERRORS.name in catalog.series_names()
    assert not set(catalog.EXTERNAL_METRICS) & set(catalog.METRICS)


def test_architecture_doc_prints_the_other_exporters_series() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    table = doc.split("<!-- external:start -->\n", 1)[1].split("<!-- external:end -->", 1)[0]
    assert table == catalog.render_external_markdown(), (
        "docs/architecture.md's table of other exporters' series is stale: replace it with the "
        "output of `python -m redline.slo.catalog --external`"
    )
