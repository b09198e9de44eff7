"""ModelVersionsProbe over a real on-disk registry, served by the exporter, linted by promtool."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import serve_in_thread
from redline.exporters.app import build_exporter_app
from redline.exporters.models import ModelVersionsProbe
from redline.exporters.probe import ProbeCache
from redline.exporters.settings import ExporterSettings
from redline.platform.snapshots import Baselines, SnapshotCorruptError, SnapshotRegistry
from redline.slo import catalog
from redline.slo.load import load_spec

pytestmark = pytest.mark.integration


def promtool_check(exposition: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on an exposition (exit 3 on lint problems)."""
    return subprocess.run(
        ["/usr/bin/promtool", "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def values(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name` in an exposition, keyed by its sorted labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name
    }


def probe_value(exposition: str, name: str, probe: str) -> float | None:
    """The value of a `{probe=...}` health series, None when absent."""
    return values(exposition, name).get((("probe", probe),))


def _version(registry: SnapshotRegistry, base: Path, model: str, version: str) -> str:
    weights = base / model.replace("/", "_") / version
    weights.mkdir(parents=True)
    (weights / "adapter_model.safetensors").write_bytes(f"{model}:{version}".encode() * 512)
    config = weights / "adapter_config.json"
    config.write_text(json.dumps({"base_model": model, "r": 8}))
    return registry.create(model, version, weights, config, adapter=f"{model}-lora").snapshot_id


def _samples(probe: ModelVersionsProbe) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in probe.run()}


def test_probe_follows_activation_rollback_and_checkpoints(tmp_path: Path) -> None:
    registry = SnapshotRegistry(tmp_path / "registry")
    probe = ModelVersionsProbe(registry, interval_seconds=0.1)
    assert probe.run() == []

    v1 = _version(registry, tmp_path, "chat", "v1")
    v2 = _version(registry, tmp_path, "chat", "v2")
    registry.mark_verified("chat", v1, Baselines(p99_seconds=0.5, accuracy_ratio=0.95))
    registry.mark_verified("chat", v2, Baselines(p99_seconds=0.45, accuracy_ratio=0.96))
    registry.activate("chat", v2)
    registry.record_checkpoint("chat-lora", when=1_700_000_100.0)

    samples = _samples(probe)
    v2_snapshot = registry.get("chat", v2)
    info_key = (
        catalog.MODEL_ACTIVE_INFO.name,
        (
            ("config_hash", v2_snapshot.config_sha256),
            ("model", "chat"),
            ("version", "v2"),
            ("weights_hash", v2_snapshot.weights_sha256),
        ),
    )
    assert samples[info_key] == 1.0
    assert (
        samples[
            (catalog.MODEL_BASELINE_P99_SECONDS.name, (("model", "chat"), ("model_version", "v1")))
        ]
        == 0.5
    )
    assert (
        samples[
            (
                catalog.MODEL_BASELINE_ACCURACY_RATIO.name,
                (("model", "chat"), ("model_version", "v2")),
            )
        ]
        == 0.96
    )
    assert samples[
        (catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS.name, (("adapter", "chat-lora"),))
    ] == (1_700_000_100.0)

    # The rollback playbook's path: previous verified, activate; the probe follows.
    target = registry.previous_verified("chat")
    assert target is not None and target.snapshot_id == v1
    registry.activate("chat", target.snapshot_id)
    infos = [key for key in _samples(probe) if key[0] == catalog.MODEL_ACTIVE_INFO.name]
    assert len(infos) == 1 and ("version", "v1") in infos[0][1]


def test_probe_caps_versions_and_filters_models(tmp_path: Path) -> None:
    registry = SnapshotRegistry(tmp_path / "registry")
    ids = [_version(registry, tmp_path, "org/big", f"v{i}") for i in range(6)]
    for snapshot_id in ids:
        registry.mark_verified(
            "org/big", snapshot_id, Baselines(p99_seconds=0.4, accuracy_ratio=0.9)
        )
    registry.activate("org/big", ids[0])  # the oldest is active: it must still be published
    other = _version(registry, tmp_path, "other", "v1")
    registry.activate("other", other)

    probe = ModelVersionsProbe(registry, models=["org/big"], max_versions=3)
    samples = _samples(probe)
    versions = sorted(
        dict(labels)["model_version"]
        for name, labels in samples
        if name == catalog.MODEL_BASELINE_P99_SECONDS.name
    )
    assert versions == ["v0", "v4", "v5"]
    models = {
        dict(labels)["model"] for name, labels in samples if name == catalog.MODEL_ACTIVE_INFO.name
    }
    assert models == {"org/big"}
    # Every model when none is configured; an unverified active version has no baselines.
    everything = _samples(ModelVersionsProbe(registry))
    assert {dict(k[1])["model"] for k in everything if k[0] == catalog.MODEL_ACTIVE_INFO.name} == {
        "org/big",
        "other",
    }
    assert not any(
        dict(k[1]).get("model") == "other" for k in everything if k[0].startswith("model_baseline")
    )


def test_corrupt_registry_fails_the_probe_in_the_exporter(tmp_path: Path) -> None:
    registry = SnapshotRegistry(tmp_path / "registry")
    snapshot_id = _version(registry, tmp_path, "chat", "v1")
    registry.activate("chat", snapshot_id)
    probe = ModelVersionsProbe(registry, interval_seconds=0.1)
    cache = ProbeCache([probe])
    cache.run(probe.name)
    assert cache.status()["model_versions"]["success"] is True

    (registry.root / "models" / "chat" / "active.json").write_text("[]")
    with pytest.raises(SnapshotCorruptError, match="active pointer"):
        probe.run()

    settings = ExporterSettings.model_validate({"models": {"enabled": False}})
    exporter = build_exporter_app(settings, load_spec().spec, probes=[probe])
    with (
        serve_in_thread(exporter.app, access_log=False) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        deadline = time.monotonic() + 5
        while True:
            text = client.get("/metrics").text
            if probe_value(text, catalog.REDLINE_PROBE_SUCCESS.name, "model_versions") == 0.0:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        assert not values(text, catalog.MODEL_ACTIVE_INFO.name)
        assert promtool_check(text).returncode == 0
        registry.activate("chat", snapshot_id)  # repairs the pointer atomically
        deadline = time.monotonic() + 5
        while (
            probe_value(
                client.get("/metrics").text, catalog.REDLINE_PROBE_SUCCESS.name, "model_versions"
            )
            != 1.0
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
