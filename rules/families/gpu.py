"""GPU health read from the exporters a GPU cluster already runs, and the promtool cases that
prove it:

- `GPUXidCritical` (critical, playbook `gpu.playbook`): a GPU's last XID is a drain-now one
  (`gpu.drain_xids`: NVIDIA's Xid catalog's reset / reboot / hardware-workflow XIDs);
- `GPUXidWatch` (ticket): a GPU reported another XID within `gpu.xid_window`;
- `GPUNodeUnhealthy` (`cause`): a node with GPU capacity not Ready (page); a GPU whose row
  remapping failed or with uncorrectable ECC errors (page); a row remap pending a reset, a GPU
  too hot, NVLink errors (ticket);
- `GPUPodsUnhealthy` (ticket, `cause`): pods on a GPU node restarting again and again, or stuck
  Pending.

dcgm-exporter labels its series per GPU (`gpu`, `UUID`, `modelName`) and names the node in
`Hostname`; kube-state-metrics names it in `node`. The rules copy the spec's
`gpu.dcgm_node_label` (and `gpu.node_label`) to `node`, so every alert names its node the same
way (the label Alertmanager groups a playbook's jobs by). The series and their sources are in
the catalog (`redline.slo.catalog.EXTERNAL_METRICS`).

`DCGM_FI_DEV_XID_ERRORS` is a gauge holding the *last* XID's number (not a count): a drain-now
XID keeps its alert while it is the last one (until the GPU reports another, or the exporter
stops reporting it: what the gauge holds after a GPU reset is not verified), and for
`xid_window` after a later XID replaced it (XID 45, "preemptive cleanup, due to previous
errors", can). A watch
XID tickets for `xid_window` after the gauge changed to it; the same XID again changes nothing
and raises no new ticket (dcgm-exporter's opt-in `DCGM_EXP_XID_ERRORS_COUNT` counts them; these
rules do not read it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from redline.rules.common import alert_rule
from redline.rules.model import AlertRule, RecordingRule, RuleGroup, number
from redline.rules.promtool_cases import AlertIndex, Case, constant, counter, expected, series
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

NODE = catalog.LABEL_NODE
GPU_KEYS = (NODE, catalog.DCGM_LABEL_GPU, catalog.DCGM_LABEL_UUID, catalog.DCGM_LABEL_MODEL)
"""One GPU: whatever pod holds it (dcgm-exporter's `pod` labels come and go), one series."""
POD_KEYS = ("namespace", "pod")
READY = "Ready"
NOT_READY_STATUSES = ("false", "unknown")
"""kube-state-metrics' `status` values of a condition that does not hold (`true` does)."""
PENDING = "Pending"
WHERE = (
    "GPU {{ $labels.gpu }} ({{ $labels.modelName }}, {{ $labels.UUID }}) of node {{ $labels.node }}"
)
"""A GPU alert's subject, as its description names it."""

NVLINK_ERRORS = (
    ("crc_flit", catalog.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
    ("crc_data", catalog.DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
    ("replay", catalog.DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL),
    ("recovery", catalog.DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL),
)
"""dcgm-exporter's NVLink error counters (all commented out of its default CSV), by kind."""


def _by(labels: Iterable[str]) -> str:
    return ", ".join(labels)


def _copy_node(inner: str, source: str) -> str:
    """`inner` with its `source` label copied to `node` (nothing to do when it is `node`)."""
    if source == NODE:
        return inner
    return f'label_replace({inner}, "{NODE}", "$1", "{source}", "(.+)")'


def per_gpu(spec: Spec, inner: str, aggregate: str = "max") -> str:
    """`inner` (a dcgm-exporter series, or a function of one) per GPU, named by its node."""
    return f"{aggregate} by ({_by(GPU_KEYS)}) ({_copy_node(inner, spec.gpu.dcgm_node_label)})"


def kube(spec: Spec, selector: str) -> str:
    """A kube-state-metrics selector with the spec's node label copied to `node`."""
    return _copy_node(selector, spec.gpu.node_label)


def resource_label(spec: Spec) -> str:
    """`gpu.resource` as kube-state-metrics writes it in `resource`: every character outside
    [a-zA-Z0-9_] made `_` (its sanitizeLabelName, internal/store/node.go)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", spec.gpu.resource)


def _runs(values: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted values as (first, last) runs of consecutive integers."""
    runs: list[tuple[int, int]] = []
    for value in sorted(set(values)):
        if runs and value == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def xid_in(series_name: str, xids: Iterable[int]) -> str:
    """`series_name` where its value is one of `xids` (a run of them as one range filter)."""
    return "\nor ".join(
        f"{series_name} == {first}" if first == last else f"{series_name} >= {first} <= {last}"
        for first, last in _runs(xids)
    )


def gpu_nodes() -> str:
    """Nodes with GPU capacity, by `node`."""
    return f"{catalog.GPU_NODE_CAPACITY_RECORD} > 0"


def _records(spec: Spec) -> tuple[RecordingRule, ...]:
    gpu = spec.gpu
    capacity = kube(
        spec, f'{catalog.KUBE_NODE_STATUS_CAPACITY}{{resource="{resource_label(spec)}"}}'
    )
    pods = kube(spec, f'{catalog.KUBE_POD_INFO}{{{gpu.node_label}!=""}}')
    return (
        RecordingRule(
            catalog.GPU_XID_LAST_RECORD, per_gpu(spec, str(catalog.DCGM_FI_DEV_XID_ERRORS))
        ),
        RecordingRule(
            catalog.GPU_XID_DRAIN_RECORD, xid_in(catalog.GPU_XID_LAST_RECORD, gpu.drain_xids)
        ),
        RecordingRule(catalog.GPU_NODE_CAPACITY_RECORD, f"max by ({NODE}) ({capacity})"),
        # A pod's node from its kube_pod_info; `topk` keeps one when a re-created pod's old and
        # new info briefly overlap (a many-to-many join would fail the rule).
        RecordingRule(
            catalog.GPU_NODE_POD_RECORD,
            f"topk by ({_by(POD_KEYS)}) (1, max by ({_by((*POD_KEYS, NODE))}) ({pods}))\n"
            f"and on ({NODE}) ({gpu_nodes()})",
        ),
    )


def xid_watch_expr(spec: Spec) -> str:
    """A GPU's last XID is non-zero and not ignored, and changed within the window; not while
    the GPU's drain-now alert holds (which also leaves out the drain-now XIDs themselves)."""
    gpu = spec.gpu
    last, drain = catalog.GPU_XID_LAST_RECORD, catalog.GPU_XID_DRAIN_RECORD
    other = f"{last} > 0"
    if gpu.ignore_xids:
        other += f"\nunless ({xid_in(last, gpu.ignore_xids)})"
    return (
        f"(\n({other})\nand (changes({last}[{gpu.xid_window}]) > 0)\n)\n"
        f"unless max_over_time({drain}[{gpu.xid_window}])"
    )


def _xid_alerts(spec: Spec) -> list[AlertRule]:
    gpu = spec.gpu
    where = WHERE
    acting = (
        f"Playbook {gpu.playbook} cordons and drains the node."
        if gpu.playbook
        else "No playbook acts on it (gpu.playbook is null): cordon and drain the node."
    )
    return [
        alert_rule(
            spec,
            Alert.GPU_XID_CRITICAL,
            f"max_over_time({catalog.GPU_XID_DRAIN_RECORD}[{gpu.xid_window}])",
            0,
            "critical",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} reported XID {{ $value }}: drain "
            "the node",
            f"{where} reported XID {{{{ $value }}}}, one NVIDIA's Xid catalog resolves by "
            "resetting the GPU or rebooting the node (gpu.drain_xids): the requests it serves "
            f"fail or hang until then. {acting} Reset the GPU (or reboot), run dcgmi diag "
            "before the node takes work again, and replace the GPU if the XID comes back.",
            gpu.playbook,
        ),
        alert_rule(
            spec,
            Alert.GPU_XID_WATCH,
            xid_watch_expr(spec),
            0,
            "ticket",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} reported XID {{ $value }}",
            f"{where} reported XID {{{{ $value }}}} within the last {gpu.xid_window}: mostly "
            "an application's fault (13, 31, 43, 45: see the pod's logs) or one NVIDIA says to "
            "watch; the GPU keeps serving. Look it up in NVIDIA's Xid catalog; if it repeats on "
            "this GPU only, treat the GPU as suspect.",
        ),
    ]


def not_ready_expr(spec: Spec) -> str:
    """A node with GPU capacity whose Ready condition is false or unknown."""
    status = "|".join(NOT_READY_STATUSES)
    ready = kube(
        spec, f'{catalog.KUBE_NODE_STATUS_CONDITION}{{condition="{READY}",status=~"{status}"}}'
    )
    return f"max by ({NODE}) ({ready}) == 1\nand on ({NODE}) ({gpu_nodes()})"


def nvlink_errors_expr(spec: Spec) -> str:
    """NVLink errors of each GPU within the error window, every kind added up (a kind the
    exporter does not publish adds nothing)."""
    window = spec.gpu.error_window
    source = spec.gpu.dcgm_node_label
    kinds = "\nor ".join(
        f"label_replace({_copy_node(f'increase({metric}[{window}])', source)}, "
        f'"kind", "{kind}", "", "")'
        for kind, metric in NVLINK_ERRORS
    )
    return f"sum by ({_by(GPU_KEYS)}) (\n{kinds}\n) > {spec.gpu.nvlink_errors}"


def uncorrectable_expr(spec: Spec) -> str:
    """Uncorrectable ECC errors within the window: the double-bit counter (opt-in), or a row
    remapped for an uncorrectable error (published by default)."""
    window = spec.gpu.error_window
    dbe = per_gpu(spec, f"increase({catalog.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL}[{window}])", "sum")
    rows = per_gpu(
        spec, f"increase({catalog.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS}[{window}])", "sum"
    )
    return f"{dbe} > 0\nor {rows} > 0"


def _node_alerts(spec: Spec) -> list[AlertRule]:
    gpu = spec.gpu
    where = WHERE
    drain = "Drain the node, reset the GPU and run dcgmi diag before it takes work again."
    return [
        alert_rule(
            spec,
            Alert.GPU_NODE_UNHEALTHY,
            not_ready_expr(spec),
            parse_duration(gpu.not_ready_for),
            "page",
            "GPU node {{ $labels.node }} is not Ready",
            f"The node offers GPUs ({gpu.resource}) but its Ready condition has been false or "
            f"unknown for {gpu.not_ready_for}: its GPUs serve nothing and Kubernetes evicts its "
            "pods. Check the kubelet, the GPU driver and the device plugin on the node; the "
            "other nodes carry its load meanwhile.",
            cause="not_ready",
        ),
        alert_rule(
            spec,
            Alert.GPU_NODE_UNHEALTHY,
            f"{per_gpu(spec, str(catalog.DCGM_FI_DEV_ROW_REMAP_FAILURE))} == 1",
            0,
            "page",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} could not remap a failing memory row",
            f"{where} has its row-remapping failure flag set: no spare row was left for an "
            "uncorrectable memory error, so the error stays. NVIDIA's RMA criterion for GPU "
            "memory; drain the node and replace the GPU once its field diagnostic confirms it.",
            cause="row_remap_failure",
        ),
        alert_rule(
            spec,
            Alert.GPU_NODE_UNHEALTHY,
            uncorrectable_expr(spec),
            0,
            "page",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} had uncorrectable memory errors",
            f"{where} had uncorrectable ECC errors (double-bit, or rows remapped for one) "
            f"within the last {gpu.error_window}: the applications on it may have read "
            f"corrupted data, and a remapped row takes effect only after a GPU reset. {drain}",
            cause="ecc_uncorrectable",
        ),
        alert_rule(
            spec,
            Alert.GPU_NODE_UNHEALTHY,
            f"{per_gpu(spec, str(catalog.DCGM_FI_DEV_ROW_REMAP_PENDING))} == 1",
            0,
            "ticket",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} waits for a reset to remap a row",
            f"{where} has recorded a memory row remapping that takes effect only after the GPU "
            "is reset: schedule a reset when the node is drained.",
            cause="row_remap_pending",
        ),
        alert_rule(
            spec,
            Alert.GPU_NODE_UNHEALTHY,
            f"{per_gpu(spec, str(catalog.DCGM_FI_DEV_GPU_TEMP))} > "
            f"{number(gpu.max_temperature_celsius)}",
            parse_duration(gpu.temperature_for),
            "ticket",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} is running hot",
            f"{where} has been over {number(gpu.max_temperature_celsius)} °C for "
            f"{gpu.temperature_for} (now {{{{ $value }}}} °C): a hotter GPU slows its clocks "
            "down, then its requests. Check the node's cooling and fans, and its load.",
            cause="temperature",
        ),
        alert_rule(
            spec,
            Alert.GPU_NODE_UNHEALTHY,
            nvlink_errors_expr(spec),
            0,
            "ticket",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} has NVLink errors",
            f"{where} counted more than {gpu.nvlink_errors} NVLink errors (CRC, replay, "
            f"recovery) within the last {gpu.error_window}: its links retry and lose bandwidth "
            "to its peers. Run dcgmi diag on the node; a failing link ends in XID 74.",
            cause="nvlink_errors",
        ),
    ]


def restarts_expr(spec: Spec) -> str:
    """Container restarts of each pod bound to a GPU node within the restart window."""
    gpu = spec.gpu
    restarts = f"increase({catalog.KUBE_POD_CONTAINER_STATUS_RESTARTS_TOTAL}[{gpu.restart_window}])"
    return (
        f"sum by ({_by((*POD_KEYS, NODE))}) (\n{restarts}\n"
        f"* on ({_by(POD_KEYS)}) group_left ({NODE}) {catalog.GPU_NODE_POD_RECORD}\n"
        f") >= {gpu.restarts}"
    )


def pending_expr() -> str:
    """Pods bound to a GPU node and Pending (a pod no scheduler bound has no node yet)."""
    phase = f'{catalog.KUBE_POD_STATUS_PHASE}{{phase="{PENDING}"}}'
    return (
        f"(max by ({_by(POD_KEYS)}) ({phase}) == 1)\n"
        f"* on ({_by(POD_KEYS)}) group_left ({NODE}) {catalog.GPU_NODE_POD_RECORD}"
    )


def _pod_alerts(spec: Spec) -> list[AlertRule]:
    gpu = spec.gpu
    pod = "Pod {{ $labels.namespace }}/{{ $labels.pod }} on GPU node {{ $labels.node }}"
    return [
        alert_rule(
            spec,
            Alert.GPU_PODS_UNHEALTHY,
            restarts_expr(spec),
            0,
            "ticket",
            "Pod {{ $labels.namespace }}/{{ $labels.pod }} keeps restarting on GPU node "
            "{{ $labels.node }}",
            f"{pod} restarted its containers at least {gpu.restarts} times within "
            f"{gpu.restart_window}: a crash loop holds GPUs and serves nothing. Read its logs "
            "(out of GPU memory, an XID, a failed model load).",
            cause="restarts",
        ),
        alert_rule(
            spec,
            Alert.GPU_PODS_UNHEALTHY,
            pending_expr(),
            parse_duration(gpu.pending_for),
            "ticket",
            "Pod {{ $labels.namespace }}/{{ $labels.pod }} is stuck pending on GPU node "
            "{{ $labels.node }}",
            f"{pod} has been Pending for {gpu.pending_for}: an image pull, a volume, or the GPU "
            "device plugin failing to allocate its GPUs. See `kubectl describe pod`.",
            cause="pending",
        ),
    ]


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The GPU records, then the XID, node and pod alerts."""
    rules: tuple[RecordingRule | AlertRule, ...] = (
        *_records(spec),
        *_xid_alerts(spec),
        *_node_alerts(spec),
        *_pod_alerts(spec),
    )
    return [RuleGroup("redline-gpu", spec.timing.evaluation_interval_seconds, rules)]


# --- promtool cases ---------------------------------------------------------------------------

MINUTE = 60


def _steps(*phases: tuple[float, int]) -> str:
    """A series holding each (value, samples) in turn, one sample a minute."""
    return " ".join(
        number(value) if count == 1 else f"{number(value)}+0x{count - 1}" for value, count in phases
    )


def _gpu(spec: Spec, node: str, index: int) -> dict[str, str]:
    """dcgm-exporter's labels of GPU `index` of `node` (the node in the spec's label)."""
    return {
        catalog.DCGM_LABEL_GPU: str(index),
        catalog.DCGM_LABEL_UUID: f"GPU-{node}-{index}",
        catalog.DCGM_LABEL_DEVICE: f"nvidia{index}",
        catalog.DCGM_LABEL_MODEL: "NVIDIA H100 80GB HBM3",
        spec.gpu.dcgm_node_label: node,
    }


def _gpu_keys(labels: dict[str, str], spec: Spec) -> dict[str, str]:
    """The alert labels of a GPU: its keys, the node under `node`."""
    out = {key: labels[key] for key in GPU_KEYS if key != NODE}
    return {**out, NODE: labels[spec.gpu.dcgm_node_label]}


def _a_watch_xid(spec: Spec) -> int:
    """An application XID neither drained nor ignored (13, else the first free one)."""
    taken = {*spec.gpu.drain_xids, *spec.gpu.ignore_xids}
    candidates: tuple[int, ...] = (13, 31, 43, *range(1, 1000))
    return next(int(xid) for xid in candidates if xid not in taken)


def _xid_cases(spec: Spec, alerts: AlertIndex) -> list[Case]:
    gpu = spec.gpu
    window = int(parse_duration(gpu.xid_window) // MINUTE)
    critical, watch = alerts.get(Alert.GPU_XID_CRITICAL), alerts.get(Alert.GPU_XID_WATCH)
    drain_xid = 79 if 79 in gpu.drain_xids else gpu.drain_xids[0]
    watch_xid = _a_watch_xid(spec)
    masking = 45 if 45 not in gpu.drain_xids else watch_xid  # the cleanup after a fatal XID
    changed, steps = 5, window + 15
    failing, faulting, healthy = (
        _gpu(spec, "gpu-a", 0),
        _gpu(spec, "gpu-a", 1),
        _gpu(spec, "gpu-b", 0),
    )
    xids = catalog.DCGM_FI_DEV_XID_ERRORS.name
    # The GPU holding a pod carries its pod labels too: one GPU all the same.
    with_pod = {**failing, "pod": "vllm-0", "namespace": "serving", "container": "vllm"}
    inputs = {
        series(xids, with_pod): _steps((0, changed), (drain_xid, steps - changed)),
        series(xids, faulting): _steps((0, changed), (watch_xid, steps - changed)),
        series(xids, healthy): constant(0, steps),
    }
    masked = {
        series(xids, failing): _steps((0, changed), (drain_xid, 1), (masking, steps - changed - 1)),
        series(xids, healthy): constant(0, steps),
    }
    at_drain = [expected(critical, _gpu_keys(failing, spec), drain_xid)]
    cases = [
        Case(
            f"gpu: a drain-now XID fires {Alert.GPU_XID_CRITICAL}, a watch XID "
            f"{Alert.GPU_XID_WATCH} only, a GPU without one neither",
            inputs,
            (changed + 3) * MINUTE,
            [
                (Alert.GPU_XID_CRITICAL, at_drain),
                (Alert.GPU_XID_WATCH, [expected(watch, _gpu_keys(faulting, spec), watch_xid)]),
            ],
            earlier=[
                ((changed - 1) * MINUTE, Alert.GPU_XID_CRITICAL, []),
                ((changed - 1) * MINUTE, Alert.GPU_XID_WATCH, []),
            ],
        ),
        Case(
            "gpu: a watch XID's ticket ends after xid_window; a drain-now XID that is still the "
            f"last one keeps {Alert.GPU_XID_CRITICAL}",
            inputs,
            (changed + window + 3) * MINUTE,
            [(Alert.GPU_XID_CRITICAL, at_drain), (Alert.GPU_XID_WATCH, [])],
        ),
        Case(
            f"gpu: a drain-now XID replaced by a later one keeps {Alert.GPU_XID_CRITICAL} for "
            f"xid_window, with no {Alert.GPU_XID_WATCH} for the later one",
            masked,
            (changed + window + 3) * MINUTE,
            [(Alert.GPU_XID_CRITICAL, []), (Alert.GPU_XID_WATCH, [])],
            earlier=[
                ((changed + 3) * MINUTE, Alert.GPU_XID_CRITICAL, at_drain),
                ((changed + 3) * MINUTE, Alert.GPU_XID_WATCH, []),
            ],
        ),
    ]
    if gpu.ignore_xids:
        ignored = {
            series(xids, faulting): _steps((0, changed), (gpu.ignore_xids[0], steps - changed)),
            series(xids, healthy): constant(0, steps),
        }
        cases.append(
            Case(
                f"gpu: an ignored XID raises no {Alert.GPU_XID_WATCH}",
                ignored,
                (changed + 3) * MINUTE,
                [(Alert.GPU_XID_WATCH, []), (Alert.GPU_XID_CRITICAL, [])],
            )
        )
    return cases


def _condition(spec: Spec, node: str, status: str, steps: int, since: int = 0) -> dict[str, str]:
    """kube-state-metrics' Ready condition of `node`: `status` from sample `since` (true
    before), one series per status."""
    out: dict[str, str] = {}
    for value in ("true", *NOT_READY_STATUSES):
        before = 1 if value == "true" else 0
        now = 1 if value == status else 0
        labels = {spec.gpu.node_label: node, "condition": READY, "status": value}
        phases = ((before, since), (now, steps - since)) if since else ((now, steps),)
        out[series(catalog.KUBE_NODE_STATUS_CONDITION.name, labels)] = _steps(*phases)
    return out


def _capacity(spec: Spec, node: str, gpus: int, steps: int) -> dict[str, str]:
    """The node's capacity: `gpus` of the spec's resource (none: CPU only)."""
    name = catalog.KUBE_NODE_STATUS_CAPACITY.name
    cpu = {spec.gpu.node_label: node, "resource": "cpu", "unit": "core"}
    out = {series(name, cpu): constant(64, steps)}
    if gpus:
        labels = {spec.gpu.node_label: node, "resource": resource_label(spec), "unit": "integer"}
        out[series(name, labels)] = constant(gpus, steps)
    return out


def _not_ready_cases(spec: Spec, alerts: AlertIndex) -> list[Case]:
    wait = int(parse_duration(spec.gpu.not_ready_for) // MINUTE)
    steps = wait + 5
    rule = alerts.get(Alert.GPU_NODE_UNHEALTHY, cause="not_ready")
    inputs = {
        **_condition(spec, "gpu-a", "false", steps),
        **_condition(spec, "gpu-b", "true", steps),
        **_condition(spec, "gpu-c", "unknown", steps),
        **_condition(spec, "cpu-a", "false", steps),
        # NotReady for less than not_ready_for: not yet
        **_condition(spec, "gpu-d", "false", steps, since=steps - 1),
    }
    for node in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        inputs.update(_capacity(spec, node, 8, steps))
    inputs.update(_capacity(spec, "cpu-a", 0, steps))
    return [
        Case(
            "gpu: GPU nodes NotReady (false or unknown) past not_ready_for page; a Ready GPU "
            "node, a NotReady node without GPUs and one NotReady for less are silent",
            inputs,
            (steps - 1) * MINUTE + 30,
            [
                (
                    Alert.GPU_NODE_UNHEALTHY,
                    [expected(rule, {NODE: "gpu-a"}, 1), expected(rule, {NODE: "gpu-c"}, 1)],
                )
            ],
        )
    ]


def _gpu_cases(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Memory, temperature and NVLink of single GPUs."""
    gpu = spec.gpu
    error_window = int(parse_duration(gpu.error_window) // MINUTE)
    steps = error_window + 10
    unhealthy = Alert.GPU_NODE_UNHEALTHY
    failed, remapped, corrupted, pending, healthy = (_gpu(spec, "gpu-a", i) for i in range(5))
    memory = {
        series(catalog.DCGM_FI_DEV_ROW_REMAP_FAILURE.name, failed): constant(1, steps),
        series(catalog.DCGM_FI_DEV_ROW_REMAP_FAILURE.name, healthy): constant(0, steps),
        series(catalog.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS.name, remapped): _steps(
            (0, 5), (1, steps - 5)
        ),
        series(catalog.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS.name, healthy): constant(2, steps),
        series(catalog.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL.name, corrupted): _steps(
            (0, 5), (3, steps - 5)
        ),
        series(catalog.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL.name, healthy): constant(1, steps),
        series(catalog.DCGM_FI_DEV_ROW_REMAP_PENDING.name, pending): constant(1, steps),
        series(catalog.DCGM_FI_DEV_ROW_REMAP_PENDING.name, healthy): constant(0, steps),
    }

    def at(labels: dict[str, str], cause: str, value: float) -> dict[str, Any]:
        return expected(alerts.get(unhealthy, cause=cause), _gpu_keys(labels, spec), value)

    hot_for = int(parse_duration(gpu.temperature_for) // MINUTE)
    hot_steps = hot_for + 5
    limit = gpu.max_temperature_celsius
    hot, cool, at_limit, warming = (_gpu(spec, "gpu-b", i) for i in range(4))
    temperature = catalog.DCGM_FI_DEV_GPU_TEMP.name
    temperatures = {
        series(temperature, hot): constant(limit + 7, hot_steps),
        series(temperature, cool): constant(limit - 15, hot_steps),
        series(temperature, at_limit): constant(limit, hot_steps),
        # hot for less than temperature_for
        series(temperature, warming): _steps((limit - 15, hot_steps - 2), (limit + 7, 2)),
    }
    per_minute = gpu.nvlink_errors + 1  # the window's increase is well over the threshold
    flapping, failing, quiet = (_gpu(spec, "gpu-c", i) for i in range(3))
    nvlink: dict[str, str] = {
        series(catalog.DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL.name, flapping): counter(
            per_minute, steps
        ),
        # only the recovery counter published: the missing kinds add nothing
        series(catalog.DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL.name, failing): counter(
            per_minute, steps
        ),
    }
    for _kind, metric in NVLINK_ERRORS:
        nvlink[series(metric.name, quiet)] = constant(4, steps)
    firing = [at(flapping, "nvlink_errors", 0), at(failing, "nvlink_errors", 0)]
    if gpu.nvlink_errors >= 2:
        # two kinds, each under the threshold within the window, over it added up
        each = gpu.nvlink_errors * 0.6 / error_window
        both = _gpu(spec, "gpu-c", 3)
        for _kind, metric in NVLINK_ERRORS[:2]:
            nvlink[series(metric.name, both)] = counter(each, steps)
        firing.append(at(both, "nvlink_errors", 0))
    return [
        Case(
            "gpu: a failed row remapping and uncorrectable ECC errors (double-bit, remapped "
            "rows) page, a pending remap tickets; a healthy GPU is silent",
            memory,
            8 * MINUTE,
            [
                (
                    unhealthy,
                    [
                        at(failed, "row_remap_failure", 1),
                        at(remapped, "ecc_uncorrectable", 1),
                        at(corrupted, "ecc_uncorrectable", 3),
                        at(pending, "row_remap_pending", 1),
                    ],
                )
            ],
        ),
        Case(
            "gpu: uncorrectable ECC errors page only within error_window",
            {k: v for k, v in memory.items() if "REMAP_FAILURE" not in k and "PENDING" not in k},
            (5 + error_window + 3) * MINUTE,
            [(unhealthy, [])],
        ),
        Case(
            "gpu: a GPU over max_temperature_celsius for temperature_for tickets; a cool one, "
            "one at the limit and one hot for less are silent",
            temperatures,
            (hot_steps - 1) * MINUTE,
            [(unhealthy, [at(hot, "temperature", limit + 7)])],
        ),
        Case(
            "gpu: NVLink errors rising ticket (any kind the exporter publishes); flat counters "
            "are silent",
            nvlink,
            (steps - 1) * MINUTE,
            [(unhealthy, firing)],
        ),
    ]


def _pod(spec: Spec, name: str, node: str) -> dict[str, str]:
    """kube_pod_info's labels of pod `name` bound to `node` ("": not bound yet)."""
    return {"namespace": "serving", "pod": name, "uid": f"uid-{name}", spec.gpu.node_label: node}


def _pod_series(name: str) -> dict[str, str]:
    """The labels of a pod's own series (kube_pod_status_phase, the restart counter)."""
    return {"namespace": "serving", "pod": name, "uid": f"uid-{name}"}


def _phases(name: str, phase: str, steps: int, since: int = 0) -> dict[str, str]:
    """kube-state-metrics' phase series of a pod: `phase` from sample `since` (Running before),
    one series per phase."""
    out: dict[str, str] = {}
    for value in (PENDING, "Running"):
        before = 1 if value == "Running" else 0
        now = 1 if value == phase else 0
        phases = ((before, since), (now, steps - since)) if since else ((now, steps),)
        labels = {**_pod_series(name), "phase": value}
        out[series(catalog.KUBE_POD_STATUS_PHASE.name, labels)] = _steps(*phases)
    return out


def _pod_cases(spec: Spec, alerts: AlertIndex) -> list[Case]:
    gpu = spec.gpu
    steps = int(parse_duration(gpu.pending_for) // MINUTE) + 5
    pods = {
        "vllm-0": "gpu-a",  # crash-looping on a GPU node
        "vllm-1": "gpu-a",  # restarted once
        "vllm-2": "gpu-a",  # pending on a GPU node
        "vllm-3": "gpu-a",  # pending for less than pending_for
        "web-0": "cpu-a",  # crash-looping, but not on a GPU node
        "web-1": "cpu-a",  # pending, but not on a GPU node
        "job-0": "",  # pending, bound to no node yet
    }
    nodes = {
        series(catalog.KUBE_POD_INFO.name, _pod(spec, name, node)): constant(1, steps)
        for name, node in pods.items()
    }
    nodes.update(_capacity(spec, "gpu-a", 8, steps))
    nodes.update(_capacity(spec, "cpu-a", 0, steps))
    total = catalog.KUBE_POD_CONTAINER_STATUS_RESTARTS_TOTAL.name

    def restarts(name: str) -> str:
        return series(total, {**_pod_series(name), "container": "main"})

    looping = {
        restarts("vllm-0"): counter(1, steps),
        restarts("vllm-1"): _steps((0, 3), (1, steps - 3)),
        restarts("web-0"): counter(1, steps),
    }
    phases = {
        **_phases("vllm-0", "Running", steps),
        **_phases("vllm-2", PENDING, steps),
        **_phases("vllm-3", PENDING, steps, since=steps - 2),
        **_phases("web-1", PENDING, steps),
        **_phases("job-0", PENDING, steps),
    }
    on_gpu = {"namespace": "serving", NODE: "gpu-a"}
    restarting = alerts.get(Alert.GPU_PODS_UNHEALTHY, cause="restarts")
    pending = alerts.get(Alert.GPU_PODS_UNHEALTHY, cause="pending")
    return [
        Case(
            f"gpu: a pod restarting gpu.restarts times within restart_window on a GPU node "
            f"fires {Alert.GPU_PODS_UNHEALTHY}; one restart, or restarts off GPU nodes, are "
            "silent",
            {**nodes, **looping},
            (steps - 1) * MINUTE,
            [(Alert.GPU_PODS_UNHEALTHY, [expected(restarting, {**on_gpu, "pod": "vllm-0"}, 0)])],
        ),
        Case(
            f"gpu: a pod pending on a GPU node past pending_for fires {Alert.GPU_PODS_UNHEALTHY}; "
            "a running pod, one pending for less, one pending off GPU nodes and one bound to no "
            "node are silent",
            {**nodes, **phases},
            (steps - 1) * MINUTE,
            [(Alert.GPU_PODS_UNHEALTHY, [expected(pending, {**on_gpu, "pod": "vllm-2"}, 1)])],
        ),
    ]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Each GPU alert fires on its bad input and stays silent on the good ones beside it."""
    return [
        *_xid_cases(spec, alerts),
        *_not_ready_cases(spec, alerts),
        *_gpu_cases(spec, alerts),
        *_pod_cases(spec, alerts),
    ]
