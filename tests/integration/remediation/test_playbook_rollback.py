"""`semantic_rollback` against a real snapshot registry, two simulated vLLM regions (runtime LoRA
API) behind the real gateway, a real Redis job store and worker, alerts through the receiver."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from redline.devstack.fakes.simulator import serve_in_thread
from redline.platform.golden import GOLDEN_SET, MODEL_VERSION_HEADER
from redline.platform.snapshots import Baselines, Snapshot, SnapshotRegistry
from redline.remediation.settings import RemediationSettings
from tests.support.playbook import (
    Stack,
    deliver,
    get_job,
    playbook_settings,
    real_workers,
    records,
    run_jobs,
    serving_stack,
    worker_process,
)
from tests.support.remediation import alert, store_for, wait_for, wait_terminal

MODEL = "chat-lora"
VERSIONS = ("v1", "v2", "v3", "v4")


@dataclass
class Rollback:
    """Four snapshots (v3 tampered, v4 active and served) and the serving stack."""

    registry: SnapshotRegistry
    snapshots: dict[str, Snapshot]
    stack: Stack
    settings: RemediationSettings

    def served_roots(self) -> dict[str, str | None]:
        """Per region, the path the simulator serves the adapter from (`/v1/models` root)."""
        roots: dict[str, str | None] = {}
        for region, server in self.stack.sims.items():
            cards = self.stack.client.get(f"{server.url}/v1/models").json()["data"]
            card = next((c for c in cards if c["id"] == MODEL), None)
            roots[region] = card["root"] if card else None
        return roots

    def served_names(self) -> dict[str, list[str]]:
        """Per region, the adapters the simulator serves."""
        names: dict[str, list[str]] = {}
        for region, server in self.stack.sims.items():
            cards = self.stack.client.get(f"{server.url}/v1/models").json()["data"]
            names[region] = sorted(c["id"] for c in cards if c.get("parent"))
        return names

    def adapter_dir(self, version: str) -> str:
        """The adapter directory of a version."""
        return str(Path(self.snapshots[version].weights_path).parent)

    def wrong_answers(self, *versions: str) -> None:
        """Every region answers golden prompts wrongly when serving these versions."""
        faults = {"versions": {v: {"wrong_answer_probability": 1.0} for v in versions}}
        for region in self.stack.sims:
            self.stack.faults(region, faults)

    def active(self) -> str:
        """The version the active pointer names."""
        pointer = self.registry.active_pointer(MODEL)
        assert pointer is not None
        return self.registry.get(MODEL, pointer.snapshot_id).version


def _adapter(root: Path, version: str) -> Path:
    """A LoRA adapter directory as vLLM loads it; the simulator reads the `version` file."""
    directory = root / "adapters" / version
    directory.mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(f"weights of {version}".encode() * 64)
    (directory / "adapter_config.json").write_text(f'{{"r": 8, "version": "{version}"}}\n')
    (directory / "version").write_text(f"{version}\n")
    return directory


@pytest.fixture()
def rollback(redis_url: str, tmp_path: Path) -> Iterator[Rollback]:
    """v1..v4 recorded and verified, v4 active; v3's weights tampered afterwards."""
    registry = SnapshotRegistry(tmp_path / "registry")
    references = {item.id: item.reference for item in GOLDEN_SET}
    snapshots: dict[str, Snapshot] = {}
    for version in VERSIONS:
        directory = _adapter(tmp_path, version)
        created = registry.create(
            MODEL,
            version,
            directory / "adapter_model.safetensors",
            directory / "adapter_config.json",
            adapter=MODEL,
        )
        baselines = Baselines(
            p99_seconds=0.4, accuracy_ratio=1.0, samples=2000, reference_answers=references
        )
        snapshots[version] = registry.mark_verified(MODEL, created.snapshot_id, baselines)
    registry.activate(MODEL, snapshots["v4"].snapshot_id)
    (Path(snapshots["v3"].weights_path)).write_bytes(b"tampered after verification")
    adapters = {MODEL: str(Path(snapshots["v4"].weights_path).parent)}
    with serving_stack(redis_url, adapters=adapters) as stack:
        settings = playbook_settings(
            redis_url,
            serving={"gateway_url": stack.gateway.url, "upstreams": stack.upstreams},
            rollback={"snapshot_root": str(registry.root)},
        )
        yield Rollback(registry, snapshots, stack, settings)


def _alert(fingerprint: str, **labels: str) -> dict[str, Any]:
    return alert(
        fingerprint,
        playbook="semantic_rollback",
        starts_at=datetime.now(UTC),
        labels={"alertname": "SemanticRegression", "model": MODEL, **labels},
    )


def test_rollback_skips_the_tampered_snapshot_and_the_simulator_serves_the_restored_adapter(
    rollback: Rollback,
) -> None:
    [job] = run_jobs(rollback.settings, _alert("a0000000000000a1"))
    assert job.status == "succeeded", job.error
    assert rollback.active() == "v2"
    pointer = rollback.registry.active_pointer(MODEL)
    assert (
        pointer is not None and pointer.previous_snapshot_id == rollback.snapshots["v4"].snapshot_id
    )
    # v3 was skipped for its hash mismatch, and the reason recorded.
    [skip] = records(job, "skip_snapshot")
    assert skip["data"]["snapshot_id"] == rollback.snapshots["v3"].snapshot_id
    assert "hash mismatch" in skip["detail"] and "weights" in skip["detail"]
    # Every region's one pod (its upstream URL) loaded v2 beside v4 under a staged name, answered
    # the golden set under it, reloaded the served name in place, then dropped the staged copy.
    staged, switched = records(job, "stage_adapter"), records(job, "switch_adapter")
    assert {r["data"]["region"] for r in switched} == {"primary", "secondary"}
    assert {r["data"]["lora_name"] for r in staged} == {f"{MODEL}@v2"}
    assert {r["data"]["action"] for r in staged} == {"loaded"}
    assert {r["data"]["action"] for r in switched} == {"reloaded in place"}
    assert len(records(job, "precheck")) == 2
    assert {tuple(r["data"]["unloaded"]) for r in records(job, "unload_staged")} == {
        (f"{MODEL}@v2",)
    }
    assert rollback.served_names() == {"primary": [MODEL], "secondary": [MODEL]}
    assert rollback.served_roots() == {
        "primary": rollback.adapter_dir("v2"),
        "secondary": rollback.adapter_dir("v2"),
    }
    [continuity] = records(job, "continuity")
    assert continuity["data"]["accuracy"] == 1.0 and continuity["data"]["mean_similarity"] == 1.0
    assert continuity["data"]["served_versions"] == {"v2": len(GOLDEN_SET)}
    # The gateway and each region serve the restored version.
    response = rollback.stack.chat(MODEL, GOLDEN_SET[0].prompt)
    assert response.status_code == 200 and response.headers[MODEL_VERSION_HEADER] == "v2"
    for server in rollback.stack.sims.values():
        stats = rollback.stack.client.get(f"{server.url}/admin/stats").json()
        assert stats["adapters"][MODEL]["version"] == "v2"
    verify = next(s for s in job.steps if s["phase"] == "verify")
    assert verify["ok"] and verify["data"]["snapshot_id"] == rollback.snapshots["v2"].snapshot_id


def test_continuity_failure_falls_back_to_the_next_older_verified_snapshot(
    rollback: Rollback,
) -> None:
    rollback.wrong_answers("v2")
    [job] = run_jobs(rollback.settings, _alert("a0000000000000a2"))
    assert job.status == "succeeded", job.error
    assert rollback.active() == "v1"
    [rejected] = records(job, "reject_snapshot")
    assert rejected["data"]["snapshot_id"] == rollback.snapshots["v2"].snapshot_id
    # v2 was caught on the pods under its staged name, before any client was switched to it.
    assert "golden set on the staged adapter" in rejected["detail"]
    assert "accuracy 0.0000 < 0.9920" in rejected["detail"]
    assert "mean similarity" in rejected["detail"]
    checks = records(job, "precheck")
    assert [c["data"]["model"] for c in checks] == [f"{MODEL}@v2"] * 2 + [f"{MODEL}@v1"] * 2
    assert checks[0]["data"]["below_threshold"] == sorted(item.id for item in GOLDEN_SET)
    switched = records(job, "switch_adapter")
    assert {r["data"]["lora_path"] for r in switched} == {rollback.adapter_dir("v1")}
    [continuity] = records(job, "continuity")
    assert continuity["data"]["served_versions"] == {"v1": len(GOLDEN_SET)}
    assert rollback.served_roots() == {
        "primary": rollback.adapter_dir("v1"),
        "secondary": rollback.adapter_dir("v1"),
    }
    response = rollback.stack.chat(MODEL, GOLDEN_SET[1].prompt)
    assert response.headers[MODEL_VERSION_HEADER] == "v1"


def test_no_snapshot_passing_continuity_fails_loudly_and_puts_the_original_back(
    rollback: Rollback,
) -> None:
    rollback.wrong_answers("v2", "v1")
    [job] = run_jobs(rollback.settings, _alert("a0000000000000a3"))
    assert job.status == "failed" and job.outcome == "failed"
    assert job.error is not None
    assert "no older verified snapshot passed continuity" in job.error
    assert rollback.snapshots["v2"].snapshot_id in job.error
    assert rollback.snapshots["v1"].snapshot_id in job.error
    assert "needs a human" in job.error
    assert [r["data"]["snapshot_id"] for r in records(job, "reject_snapshot")] == [
        rollback.snapshots["v2"].snapshot_id,
        rollback.snapshots["v1"].snapshot_id,
    ]
    # The original is served again, as before the job.
    assert rollback.active() == "v4"
    assert set(rollback.served_roots().values()) == {rollback.adapter_dir("v4")}
    # The failure is visible where operators look: failed jobs of the playbook.
    store, client = store_for(rollback.settings)
    try:
        failed = store.list_jobs(playbook="semantic_rollback", status="failed")
    finally:
        client.close()
    assert [j.id for j in failed] == [job.id]


def test_worker_killed_mid_rollback_the_next_worker_finds_pointer_and_adapter_in_place(
    rollback: Rollback, tmp_path: Path
) -> None:
    # Slow golden answers on v2 (3 rounds of 4 at once: ~3 s) so the kill lands during the
    # continuity check through the gateway, before the staged copies are unloaded.
    slow = {"versions": {"v2": {"latency": {"base_seconds": 1.0}}}}
    for region in rollback.stack.sims:
        rollback.stack.faults(region, slow)
    [job_id] = deliver(rollback.settings, _alert("a0000000000000a4"))
    victim = worker_process(rollback.settings, tmp_path, tmp_path / "victim.log")
    store, client = store_for(rollback.settings)
    try:

        def switched_everywhere() -> bool:
            job = store.get(job_id)
            return job is not None and len(records(job, "switch_adapter")) == 2

        wait_for(switched_everywhere, timeout=30, what="the adapter switched on both regions")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        assert store.get(job_id).status == "running"  # type: ignore[union-attr]
        assert rollback.active() == "v2"  # the pointer moved before the kill
        with real_workers(rollback.settings):
            job = wait_terminal(store, job_id, timeout=60)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        client.close()
    assert job.status == "succeeded", job.error
    assert job.attempts == 2
    second = [s for s in job.steps if s["attempt"] == 2]
    [pointer] = [s for s in second if s["name"] == "switch_pointer"]
    assert "already points at" in pointer["detail"]
    # Killed during the golden set through the gateway: the staged copy was still loaded.
    assert {s["data"]["action"] for s in second if s["name"] == "stage_adapter"} == {
        "already loaded"
    }
    assert {s["data"]["action"] for s in second if s["name"] == "switch_adapter"} == {
        "already served"
    }
    assert rollback.served_names() == {"primary": [MODEL], "secondary": [MODEL]}
    assert rollback.active() == "v2"
    assert set(rollback.served_roots().values()) == {rollback.adapter_dir("v2")}


def test_a_late_alert_about_a_version_no_longer_active_rolls_nothing_back(
    rollback: Rollback,
) -> None:
    [job] = run_jobs(rollback.settings, _alert("a0000000000000a9", model_version="v3"))
    assert job.status == "succeeded", job.error
    assert [step["name"] for step in job.plan or []] == ["nothing_to_do"]
    assert rollback.active() == "v4"
    assert set(rollback.served_roots().values()) == {rollback.adapter_dir("v4")}
    # The alert about the active version itself still rolls back.
    [job] = run_jobs(rollback.settings, _alert("a0000000000000aa", model_version="v4"))
    assert job.status == "succeeded", job.error
    assert rollback.active() == "v2"


def test_dry_run_returns_the_plan_and_changes_nothing(rollback: Rollback) -> None:
    [job] = run_jobs(rollback.settings, _alert("a0000000000000a5", dry_run="true"))
    assert job.status == "planned" and job.outcome == "dry_run"
    assert job.plan is not None
    assert [(step["name"], step["read_only"]) for step in job.plan] == [
        ("discover_pods", True),
        ("check_pods", True),
        ("check_golden", True),
        ("select_snapshot", True),
        ("try_snapshot", False),
        ("try_snapshot", False),
    ]
    select = job.plan[3]["params"]
    ids = {v: s.snapshot_id for v, s in rollback.snapshots.items()}
    assert select["origin"] == ids["v4"]
    assert select["candidates"] == [ids["v2"], ids["v1"]]
    assert [s["snapshot_id"] for s in select["skipped"]] == [ids["v3"]]
    assert [s["phase"] for s in job.steps] == ["plan"]
    assert rollback.active() == "v4"
    assert set(rollback.served_roots().values()) == {rollback.adapter_dir("v4")}
    client = redis.Redis.from_url(rollback.settings.redis_url, decode_responses=True)
    try:
        assert client.keys(f"{rollback.settings.key_prefix}:playbook:*") == []
    finally:
        client.close()


def test_an_unconfigured_or_unknown_model_fails_with_a_clear_reason(
    rollback: Rollback,
) -> None:
    unknown = _alert("a0000000000000a6", model="no-such-model")
    [job] = run_jobs(rollback.settings, unknown)
    assert job.status == "failed"
    assert job.error is not None and "no active snapshot" in job.error
    assert "chat-lora" in job.error  # names the models it knows
    bare = rollback.settings.model_copy(update={"rollback": type(rollback.settings.rollback)()})
    [job] = run_jobs(bare, _alert("a0000000000000a7"))
    assert job.status == "failed"
    assert job.error == "semantic_rollback: not configured: set rollback.snapshot_root"
    assert get_job(bare, job.id).status == "failed"


def _hook_app(upstreams: list[str], token: str, calls: list[dict[str, Any]]) -> FastAPI:
    """A deployment controller's hook: checks the token, then swaps the adapter everywhere."""
    app = FastAPI()

    @app.post("/rollout")
    async def rollout(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {token}":
            return JSONResponse({"detail": "unauthorized"}, status_code=401)
        body = await request.json()
        calls.append({"idempotency_key": request.headers.get("idempotency-key"), **body})
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            for url in upstreams:
                await client.post(
                    f"{url}/v1/unload_lora_adapter", json={"lora_name": body["lora_name"]}
                )
                loaded = await client.post(
                    f"{url}/v1/load_lora_adapter",
                    json={"lora_name": body["lora_name"], "lora_path": body["lora_path"]},
                )
                if loaded.status_code != 200:
                    return JSONResponse({"detail": loaded.text}, status_code=502)
        return JSONResponse({"rolled_out": body["snapshot_id"]})

    return app


def test_a_configured_hook_is_told_instead_of_the_lora_api(
    rollback: Rollback, tmp_path: Path
) -> None:
    token_file = tmp_path / "hook-token"
    token_file.write_text("hook-secret\n")
    calls: list[dict[str, Any]] = []
    hook = serve_in_thread(_hook_app(list(rollback.stack.upstreams.values()), "hook-secret", calls))
    try:
        settings = rollback.settings.model_copy(
            update={
                "rollback": rollback.settings.rollback.model_copy(
                    update={"hook_url": f"{hook.url}/rollout", "hook_token_file": token_file}
                ),
                "serving": rollback.settings.serving.model_copy(update={"upstreams": {}}),
            }
        )
        [job] = run_jobs(settings, _alert("a0000000000000a8"))
    finally:
        hook.stop()
    assert job.status == "succeeded", job.error
    v2 = rollback.snapshots["v2"]
    [call] = calls
    assert call["idempotency_key"] == f"{job.id}:{v2.snapshot_id}"
    assert call["snapshot_id"] == v2.snapshot_id and call["version"] == "v2"
    assert call["lora_name"] == MODEL and call["lora_path"] == rollback.adapter_dir("v2")
    assert call["weights_sha256"] == v2.weights_sha256
    assert records(job, "switch_adapter") == [] and len(records(job, "hook")) == 1
    assert [step["name"] for step in job.plan or []] == [
        "check_golden",
        "select_snapshot",
        "try_snapshot",
        "try_snapshot",
    ]
    assert rollback.active() == "v2"
    assert set(rollback.served_roots().values()) == {rollback.adapter_dir("v2")}
