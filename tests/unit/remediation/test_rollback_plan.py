"""`semantic_rollback`'s plan, settings check and per-pod report, without any server."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.platform.endpoints import Pod, PodSource
from redline.platform.snapshots import Baselines, Snapshot, SnapshotRegistry
from redline.remediation.guards import Policies, build_startup_problems
from redline.remediation.playbook import PlaybookRegistry
from redline.remediation.playbooks import SemanticRollback
from redline.remediation.playbooks.rollback.plan import (
    PlanInputs,
    Selection,
    build_steps,
    is_staged,
    staged_name,
)
from redline.remediation.playbooks.rollback.pods import (
    Fleet,
    FleetReport,
    pod_sources,
    summarize_pods,
)
from redline.remediation.settings import RollbackSettings, ServingSettings
from redline.slo.spec import PlaybookPolicy
from tests.support.snapshots import make_artifacts

MODEL = "chat-lora"


@pytest.fixture()
def snapshots(tmp_path: Path) -> dict[str, Snapshot]:
    registry = SnapshotRegistry(tmp_path / "registry")
    made = {}
    for version in ("v1", "v2", "v3"):
        weights, config = make_artifacts(tmp_path, version)
        created = registry.create(MODEL, version, weights, config, adapter=MODEL)
        baselines = Baselines(p99_seconds=0.4, accuracy_ratio=0.9)
        made[version] = registry.mark_verified(MODEL, created.snapshot_id, baselines)
    return made


def _inputs(snapshots: dict[str, Snapshot], pods: bool) -> PlanInputs:
    return PlanInputs(
        model=MODEL,
        origin=snapshots["v3"],
        selection=Selection((snapshots["v2"], snapshots["v1"]), (("x", "never verified"),)),
        gateway_url="http://gw:1",
        accuracy_tolerance=0.01,
        similarity_threshold=0.97,
        serving="primary: 2 listed URL(s)",
        pods=pods,
    )


def test_the_checks_are_read_only_the_tries_are_not(snapshots: dict[str, Snapshot]) -> None:
    steps = build_steps(_inputs(snapshots, pods=True))
    assert [(s.name, s.read_only) for s in steps] == [
        ("discover_pods", True),
        ("check_pods", True),
        ("check_golden", True),
        ("select_snapshot", True),
        ("try_snapshot", False),
        ("try_snapshot", False),
    ]
    first = steps[4]
    assert f"load {MODEL}@v2 from" in first.description
    assert f"reload {MODEL} in place" in first.description
    assert "accuracy >= 0.8900" in first.description
    assert first.params["last"] is False and steps[5].params["last"] is True
    assert steps[3].params["skipped"] == [{"snapshot_id": "x", "reason": "never verified"}]
    hooked = build_steps(_inputs(snapshots, pods=False))
    assert [(s.name, s.read_only) for s in hooked] == [
        ("check_golden", True),
        ("select_snapshot", True),
        ("try_snapshot", False),
        ("try_snapshot", False),
    ]
    assert "in place" not in hooked[2].description


def test_staged_names_carry_the_version() -> None:
    assert staged_name(MODEL, "v2") == "chat-lora@v2"
    assert is_staged("chat-lora@v2", MODEL)
    assert not is_staged("chat-lora@", MODEL)
    assert not is_staged("chat-lora", MODEL)
    assert not is_staged("chat-lora-2@v1", MODEL)


def test_settings_problems_name_every_missing_field(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = SemanticRollback(RollbackSettings(), ServingSettings(), "p", 60)
    assert bare.settings_problems() == [
        "rollback.snapshot_root is not set (the snapshot registry)",
        "serving.upstreams (or serving.pods, or rollback.hook_url) is not set (the serving "
        "layer to switch)",
        "serving.gateway_url is not set (the golden set checks a version through it)",
    ]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    serving = ServingSettings(
        gateway_url="http://gw:1",
        pods={"eu": PodSource.model_validate({"kubernetes": {"service": "chat"}})},
    )
    options = RollbackSettings(snapshot_root=Path("/snapshots"))
    assert SemanticRollback(options, serving, "p", 60).settings_problems() == [
        "serving.pods.eu.kubernetes.api_url is not set and KUBERNETES_SERVICE_HOST is not in "
        "the environment (not running in a cluster)"
    ]
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert SemanticRollback(options, serving, "p", 60).settings_problems() == []
    hooked = options.model_copy(update={"hook_url": "http://hook:1/rollout"})
    assert (
        SemanticRollback(
            hooked, ServingSettings(gateway_url="http://gw:1"), "p", 60
        ).settings_problems()
        == []
    )


def test_start_up_refuses_an_enabled_rollback_without_its_settings() -> None:
    registry = PlaybookRegistry([SemanticRollback(RollbackSettings(), ServingSettings(), "p", 60)])
    shadow = build_startup_problems(
        registry, Policies({"semantic_rollback": PlaybookPolicy(mode="shadow")})
    )
    assert shadow[0] == (
        "playbook semantic_rollback (mode shadow): rollback.snapshot_root is not set (the "
        "snapshot registry) (or set remediation.playbooks.semantic_rollback.mode: off)"
    )
    assert len(shadow) == 3
    off = Policies({"semantic_rollback": PlaybookPolicy(mode="off")})
    assert build_startup_problems(registry, off) == []


def test_a_region_is_its_upstream_unless_its_pods_are_listed() -> None:
    serving = ServingSettings(
        upstreams={"eu": "http://eu-svc:8000", "us": "http://us-svc:8000"},
        pods={"us": PodSource(urls=["http://10.0.0.1:8000", "http://10.0.0.2:8000"])},
    )
    sources = pod_sources(serving)
    assert sources["eu"] == PodSource(urls=["http://eu-svc:8000"])
    assert sources["us"].urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    with pytest.raises(ValueError, match="region 'US'"):
        ServingSettings(pods={"US": PodSource(urls=["http://a:1"])})


def test_the_per_pod_report_names_what_each_pod_did_and_what_stopped_it() -> None:
    a, b = Pod("eu", "chat-0", "http://a:1"), Pod("eu", "chat-1", "http://b:1")
    starting = Pod("eu", "chat-2", "http://c:1", "not ready")
    report = FleetReport(Fleet((a, b), (starting,)))
    report.note(a, "loaded", "chat@v2 loaded")
    report.note(a, "switched", "reloaded in place")
    report.note(b, "loaded", "chat@v2 loaded")
    report.fail(b, "switched", "cannot reload chat in place")
    assert report.failures() == {"eu/chat-1": "cannot reload chat in place"}
    data = report.as_dict()
    assert data["eu/chat-0"] == {
        "region": "eu",
        "url": "http://a:1",
        "loaded": "chat@v2 loaded",
        "switched": "reloaded in place",
    }
    assert data["eu/chat-1"]["switched"] == "failed"
    assert data["eu/chat-2"]["skipped"] == "not ready"
    assert summarize_pods(data) == (
        "eu/chat-0: loaded chat@v2 loaded, switched reloaded in place; "
        "eu/chat-1: loaded chat@v2 loaded, switched failed; ERROR cannot reload chat in place; "
        "eu/chat-2: left alone (not ready)"
    )
