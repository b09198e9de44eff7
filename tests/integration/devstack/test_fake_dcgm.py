"""The fake dcgm-exporter, scraped by a real Prometheus running the generated GPU rules: healthy,
no GPU alert; a drain-now XID injected over its admin API fires `GPUXidCritical` for that GPU
only, a watch-only XID on another node fires `GPUXidWatch` and never `GPUXidCritical`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from redline.devstack.fakes.dcgm import DcgmServer, FakeDcgm
from redline.devstack.processes import start_prometheus
from redline.platform.prometheus import PrometheusClient
from redline.rules.families import gpu
from redline.rules.render import render_rule_file
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.load import apply_profile, load_spec

pytestmark = pytest.mark.integration

NODES = ("gpu-node-1", "gpu-node-2")
DRAIN_XID = 79  # "GPU has fallen off the bus": NVIDIA resolves it by rebooting the machine
WATCH_XID = 13  # "Graphics Engine Exception": mostly the application's fault


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `check` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def test_exposition_has_every_catalog_series_with_dcgm_exporters_labels() -> None:
    fake = FakeDcgm.healthy(NODES, gpus_per_node=2)
    fake.assign(NODES[0], 0, "vllm-0", "serving", "vllm")
    families = {f.name: f for f in text_string_to_metric_families(fake.render().decode())}
    wanted = {m.name for m in catalog.EXTERNAL_METRICS if m.exporter == catalog.DCGM_EXPORTER}
    assert {f.name for f in families.values()} >= wanted
    xids = families[catalog.DCGM_FI_DEV_XID_ERRORS.name].samples
    assert len(xids) == 4 and all(sample.value == 0 for sample in xids)  # healthy
    held = next(s for s in xids if s.labels.get("pod"))
    assert set(held.labels) == set(catalog.DCGM_LABELS)
    assert held.labels[catalog.DCGM_LABEL_HOSTNAME] == NODES[0]


def test_prometheus_fires_gpu_xid_critical_for_a_drain_now_xid_only(tmp_path: Path) -> None:
    spec = apply_profile(load_spec().spec, "local")
    assert DRAIN_XID in spec.gpu.drain_xids and WATCH_XID not in spec.gpu.drain_xids
    rules = tmp_path / "gpu.rules.yml"
    rules.write_text(render_rule_file(gpu.build_rules(spec), "test"))
    fake = FakeDcgm.healthy(NODES, gpus_per_node=4)
    with DcgmServer(fake) as dcgm:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            yaml.safe_dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {"job_name": "dcgm-exporter", "static_configs": [{"targets": [dcgm.target]}]}
                ],
            })
        )  # fmt: skip
        prometheus = start_prometheus(tmp_path / "prom", config)
        client = PrometheusClient(prometheus.url, timeout=5, trust_env=False)
        try:
            started = time.monotonic()
            last = catalog.GPU_XID_LAST_RECORD
            wait_for(lambda: len(client.instant(last)) == 8, 20, "every GPU's last XID recorded")
            assert _firing(client) == []  # healthy: no GPU alert

            with httpx.Client(base_url=dcgm.url, trust_env=False, timeout=5) as admin:
                for node, index, xid in ((NODES[0], 3, DRAIN_XID), (NODES[1], 1, WATCH_XID)):
                    answer = admin.post("/admin/xid", json={"node": node, "gpu": index, "xid": xid})
                    assert answer.status_code == 200 and answer.json()["xid"] == xid, answer.text
                missing = admin.post("/admin/xid", json={"node": "nope", "gpu": 0, "xid": 79})
                assert missing.status_code == 404

            def both() -> list[dict[str, str]] | None:
                alerts = _firing(client)
                names = {a["alertname"] for a in alerts}
                return alerts if {Alert.GPU_XID_CRITICAL, Alert.GPU_XID_WATCH} <= names else None

            firing = wait_for(both, 20, "GPUXidCritical and GPUXidWatch")
            time.sleep(2.5)  # two more evaluations: nothing else joins them
            firing = _firing(client)
            critical = [a for a in firing if a["alertname"] == Alert.GPU_XID_CRITICAL]
            watch = [a for a in firing if a["alertname"] == Alert.GPU_XID_WATCH]
            assert [(a["node"], a["gpu"]) for a in critical] == [(NODES[0], "3")], firing
            assert [(a["node"], a["gpu"]) for a in watch] == [(NODES[1], "1")], firing
            assert critical[0]["severity"] == "critical"
            assert {a["alertname"] for a in firing} == {Alert.GPU_XID_CRITICAL, Alert.GPU_XID_WATCH}
            print(f"healthy -> both XID alerts firing: {time.monotonic() - started:.1f} s")
        finally:
            client.close()
            prometheus.stop()


def _firing(client: PrometheusClient) -> list[dict[str, str]]:
    """The labels of every firing alert."""
    return [dict(a["labels"]) for a in client.alerts() if a.get("state") == "firing"]
