"""`gpu_node_failure`'s pure parts: the plan from the node's taint and drain record, the synthetic
notice's drain budget, its options and settings problems naming the field."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest
import redis

from redline.platform.spot import NodeRecord, NodeState, build_drain_budget, scale_spot
from redline.remediation.catalog import open_registry
from redline.remediation.models import Alert
from redline.remediation.playbook import (
    MisconfiguredPlaybook,
    OptionsError,
    PlaybookContext,
    PlaybookError,
    build_options,
)
from redline.remediation.playbooks.gpu import (
    GpuNodeFailure,
    GpuNodeFailureOptions,
    build_gpu_plan,
    build_notice,
    build_recovery,
)
from redline.remediation.settings import RemediationSettings, ServingSettings
from redline.slo import catalog
from redline.slo.load import load_spec

SINCE = 1_700_000_000.0


def _plan(tainted: bool, record: NodeRecord) -> list[tuple[str, bool]]:
    return [(s.name, s.read_only) for s in build_gpu_plan("n1", "gpu-a", tainted, record, SINCE)]


FULL = [("cordon", False), ("drain", False), ("wait_drained", False), ("recover", False)]


@pytest.mark.parametrize(
    ("tainted", "record", "expected"),
    [
        (False, NodeRecord("gpu-a"), FULL),
        (True, NodeRecord("gpu-a"), FULL[1:]),
        # recovered from an earlier failure (drained before this alert started): drain again
        (True, NodeRecord("gpu-a", NodeState.RECOVERED, draining_at=SINCE - 60), FULL[1:]),
        # a reclaimed job: drained for this alert, still draining or waiting for the replacement
        (True, NodeRecord("gpu-a", NodeState.DRAINING, draining_at=SINCE + 1), FULL[2:]),
        (True, NodeRecord("gpu-a", NodeState.TERMINATING, draining_at=SINCE + 1), FULL[2:]),
        # done: only a read-only check; the taint alone if someone removed it meanwhile
        (True, NodeRecord("gpu-a", NodeState.RECOVERED, draining_at=SINCE), [("check", True)]),
        (False, NodeRecord("gpu-a", NodeState.RECOVERED, draining_at=SINCE + 5), FULL[:1]),
    ],
)
def test_the_plan_holds_only_what_is_missing(
    tainted: bool, record: NodeRecord, expected: list[tuple[str, bool]]
) -> None:
    assert _plan(tainted, record) == expected


RECOVERED = NodeRecord("gpu-a", NodeState.RECOVERED, detected_at=SINCE, recovered_at=SINCE + 4.5)


@pytest.mark.parametrize(
    ("record", "checks", "waits", "expected"),
    [
        # the first replacement the gate reached was ready (checks on the failed one aside)
        (RECOVERED, 1, 0, (catalog.RECOVERY_WARM, 4.5)),
        (RECOVERED, 7, 0, (catalog.RECOVERY_WARM, 4.5)),
        # the gate waited on the replacement: nothing listening, or its model loading
        (RECOVERED, 7, 3, (catalog.RECOVERY_COLD, 4.5)),
        # recover found it already recovered (a retried step): counted once, not again
        (RECOVERED, 0, 0, None),
        (NodeRecord("gpu-a", NodeState.TERMINATING, detected_at=SINCE), 9, 9, None),
    ],
)
def test_recovery_is_drain_start_to_the_gate_and_its_mode_what_the_gate_waited_for(
    record: NodeRecord, checks: int, waits: int, expected: tuple[str, float] | None
) -> None:
    assert build_recovery(record, checks, waits) == expected


def test_the_synthetic_notice_gets_the_spec_s_drain_budget() -> None:
    spot = load_spec().spec.spot
    window = min(spot.notice_seconds.aws, spot.notice_seconds.gcp)
    notice = build_notice("gpu-a", "n1", window, 100.0, "GPUXidCritical")
    assert (notice.node, notice.provider, notice.kind) == ("gpu-a", "gpu-xid", "interruption")
    assert notice.terminate_at == 100.0 + window and notice.detection_delay == 0
    budget = build_drain_budget(spot, notice)
    assert budget.seconds == pytest.approx(spot.drain_budget("gcp"))
    scaled = scale_spot(spot, 0.1)
    short = build_notice("gpu-a", "n1", scaled.notice_seconds.gcp, 100.0, "GPUXidCritical")
    assert build_drain_budget(scaled, short).seconds == pytest.approx(1.3)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"time_scale": 2}, "playbook_options.gpu_node_failure: time_scale: Input should be less "
                            "than or equal to 1 (got 2)"),
        ({"notice_seconds": 0}, "playbook_options.gpu_node_failure: notice_seconds: Input should "
                                "be greater than 0 (got 0)"),
        ({"kubernetes_api_url": "ftp://k8s"}, "playbook_options.gpu_node_failure: "
                                              "kubernetes_api_url: "),
        ({"node_upstreams": {"n1": " "}}, "playbook_options.gpu_node_failure: node_upstreams: "
                                          "blank node or upstream name: 'n1'"),
        ({"taint_key": ""}, "playbook_options.gpu_node_failure: taint_key: String should have "
                            "at least 1 character"),
        ({"cordon": True}, "playbook_options.gpu_node_failure: cordon: unknown option; allowed: "
                           "redis_url, "),
    ],
)  # fmt: skip
def test_bad_options_name_the_field(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(OptionsError) as caught:
        build_options(GpuNodeFailure, raw)
    [line] = caught.value.problems
    assert line.startswith(problem), line


def test_the_registry_builds_it_or_a_stand_in_naming_the_bad_field() -> None:
    settings = RemediationSettings(
        playbook_options={"gpu_node_failure": {"notice_seconds": 12, "taint_key": "x/y"}}
    )
    playbook = open_registry(settings).get("gpu_node_failure")
    assert isinstance(playbook, GpuNodeFailure)
    assert playbook.options.notice_seconds == 12 and playbook.options.taint_key == "x/y"
    assert playbook.options.state_key_prefix == "redline:gpu"  # never spot's records
    bad = RemediationSettings(playbook_options={"gpu_node_failure": {"poll_seconds": -1}})
    stand_in = open_registry(bad).get("gpu_node_failure")
    assert isinstance(stand_in, MisconfiguredPlaybook)
    assert [p.split(":")[1].strip() for p in stand_in.settings_problems()] == ["poll_seconds"]


def test_settings_problems_name_the_missing_gateway() -> None:
    options = GpuNodeFailureOptions()
    bare = GpuNodeFailure(options, ServingSettings(), "redis://x")
    assert bare.settings_problems() == [
        "serving.gateway_url (or playbook_options.gpu_node_failure.gateway_urls) is not set "
        "(the gateways that close a failed GPU node's admission)"
    ]
    serving = ServingSettings(gateway_url="http://gw:8080", upstreams={"gpu-a": "http://a:8000"})
    assert GpuNodeFailure(options, serving, "redis://x").settings_problems() == []


def _ctx(node: str) -> PlaybookContext:
    body = {"status": "firing", "labels": {"alertname": "GPUXidCritical", "node": node},
            "annotations": {}, "startsAt": datetime(2025, 1, 1, tzinfo=UTC).isoformat(),
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
            "fingerprint": "9a00000000000002"}  # fmt: skip
    alert = Alert.model_validate_json(json.dumps(body))
    return PlaybookContext(
        job_id="j", playbook="gpu_node_failure", alert=alert, target=f"node={node}",
        dry_run=False, attempt=1, redis=redis.Redis(), firing_job=None,
        log=logging.getLogger("t"), recorder=lambda *_: None, lease_check=lambda: None,
    )  # fmt: skip


def test_a_job_names_the_missing_mapping_and_kubernetes_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    serving = ServingSettings(gateway_url="http://gw:8080", upstreams={"gpu-a": "http://a:8000"})
    playbook = GpuNodeFailure(GpuNodeFailureOptions(), serving, "redis://x")
    with pytest.raises(PlaybookError, match="map it in playbook_options.gpu_node_failure"):
        playbook.plan(_ctx("ip-10-0-0-1"))
    with pytest.raises(
        PlaybookError, match=r"playbook_options\.gpu_node_failure\.kubernetes_api_url: required"
    ):
        playbook.plan(_ctx("gpu-a"))
