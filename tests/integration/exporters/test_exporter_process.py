"""The exporter process over real HTTP: a subprocess of `redline exporters` and uvicorn in a thread
with probes that hang, raise and count. Scrapes must stay fast whatever the probes do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.processes import Service, free_port
from redline.exporters.app import build_exporter_app
from redline.exporters.drift import encode_vector
from redline.exporters.probe import MetricDef, Sample
from redline.exporters.settings import ExporterSettings, load_exporter_settings
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.index import MilvusTarget, TargetSpec
from redline.platform.snapshots import Baselines, SnapshotRegistry
from redline.slo import catalog
from redline.slo.load import default_spec_text, load_spec

pytestmark = pytest.mark.integration

PROMTOOL = "/usr/bin/promtool"
REDLINE = str(Path(sys.executable).with_name("redline"))


def promtool_check(exposition: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on an exposition (exit 3 on lint problems)."""
    return subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def values(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name` in an exposition, keyed by its sorted labels."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def probe_value(exposition: str, name: str, probe: str) -> float | None:
    """The value of a `{probe=...}` health series, None when absent."""
    return values(exposition, name).get((("probe", probe),))


# ---- probes with known behaviour ---------------------------------------------------------------


class SleepyProbe:
    """Blocks far longer than its timeout on the first run, as a hung dependency would."""

    metrics = (MetricDef("sleepy_value", "gauge", "A value the sleepy probe never delivers."),)

    def __init__(self, interval: float, sleep: float) -> None:
        self.name = "sleepy"
        self.interval_seconds = interval
        self.sleep = sleep
        self.release = threading.Event()
        self.starts = 0

    def run(self) -> list[Sample]:
        self.starts += 1
        self.release.wait(self.sleep)
        return [Sample("sleepy_value", 1.0)]


class RaisingProbe:
    """Raises on every run, as a probe whose dependency returns garbage would."""

    metrics = (MetricDef("raising_value", "gauge", "Never delivered."),)

    def __init__(self, interval: float) -> None:
        self.name = "raising"
        self.interval_seconds = interval
        self.runs = 0

    def run(self) -> list[Sample]:
        self.runs += 1
        raise RuntimeError("upstream returned garbage")


class CountingProbe:
    """Succeeds every run and publishes a cumulative counter and a gauge."""

    metrics = (
        MetricDef("counting_runs", "counter", "Runs of the counting probe.", ("kind",)),
        MetricDef("counting_last_run_seconds", "gauge", "Monotonic time of the last run."),
    )

    def __init__(self, interval: float) -> None:
        self.name = "counting"
        self.interval_seconds = interval
        self.runs = 0

    def run(self) -> list[Sample]:
        self.runs += 1
        return [
            Sample("counting_runs", float(self.runs), {"kind": "scheduled"}),
            Sample("counting_last_run_seconds", time.monotonic()),
        ]


OTHER_SECTIONS = ("endpoints", "golden_set", "index_staleness", "session_rpo", "keepalive", "drift")


def _settings(**values: object) -> ExporterSettings:
    """Settings with no probe of their own (the test passes its probes)."""
    disabled = {section: {"enabled": False} for section in ("models", *OTHER_SECTIONS)}
    return ExporterSettings.model_validate({**disabled, **values})


# ---- in-process server: hanging, raising and counting probes -----------------------------------


def test_hanging_probe_never_slows_a_scrape_and_reports_failure_after_timeout() -> None:
    sleepy = SleepyProbe(interval=0.3, sleep=10.0)
    raising = RaisingProbe(interval=0.2)
    counting = CountingProbe(interval=0.2)
    settings = _settings(probe_timeout_seconds=1.0)
    exporter = build_exporter_app(settings, load_spec().spec, probes=[sleepy, raising, counting])
    try:
        with (
            serve_in_thread(exporter.app, access_log=False) as server,
            httpx.Client(base_url=server.url) as client,
        ):
            time.sleep(0.3)
            durations = []
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                started = time.perf_counter()
                response = client.get("/metrics")
                durations.append(time.perf_counter() - started)
                assert response.status_code == 200
                time.sleep(0.05)
            # The probe hangs 10 s: a scrape that waited on it would take seconds, a busy
            # machine's slowest cached scrape a fraction of one.
            assert max(durations) < sleepy.sleep / 4, f"slowest scrape {max(durations):.3f} s"
            text = response.text
            # Past its 1 s timeout the hung probe fails; its gauges are unknown, not stale.
            assert probe_value(text, catalog.REDLINE_PROBE_SUCCESS.name, "sleepy") == 0.0
            running_for = probe_value(text, catalog.REDLINE_PROBE_DURATION_SECONDS.name, "sleepy")
            assert running_for is not None and running_for > 1.0
            assert not values(text, "sleepy_value")
            assert sleepy.starts == 1, "max_instances=1: a hung run is never overlapped"
            # The raising probe fails every run; the process keeps serving.
            assert probe_value(text, catalog.REDLINE_PROBE_SUCCESS.name, "raising") == 0.0
            assert raising.runs >= 5
            assert (
                probe_value(
                    text, catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS.name, "raising"
                )
                is None
            )
            # The healthy probe kept running on its own interval beside the hung one.
            assert probe_value(text, catalog.REDLINE_PROBE_SUCCESS.name, "counting") == 1.0
            runs = values(text, "counting_runs_total")[(("kind", "scheduled"),)]
            assert runs >= 5
            assert not any(name.endswith("_created") for name in _sample_names(text))

            health = client.get("/healthz").json()
            assert health["status"] == "ok" and health["probes_total"] == 3
            assert health["probes"]["sleepy"]["success"] is False
            assert "still running" in health["probes"]["sleepy"]["error"]
            assert "upstream returned garbage" in health["probes"]["raising"]["error"]
            assert health["probes"]["counting"]["success"] is True

            result = promtool_check(text)
            assert result.returncode == 0, result.stdout + result.stderr
        assert not exporter.scheduler.running, "lifespan shutdown stops the scheduler"
    finally:
        sleepy.release.set()


def _sample_names(exposition: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(exposition) for s in f.samples}


def test_created_series_only_when_configured_on() -> None:
    def histogram_registry() -> CollectorRegistry:
        registry = CollectorRegistry()
        histogram = Histogram(
            catalog.LLM_REQUEST_DURATION_SECONDS.name, "E2E latency.", ["region"], registry=registry
        )
        histogram.labels("primary").observe(0.3)
        return registry

    spec = load_spec().spec
    for created, expected in ((False, False), (True, True)):
        exporter = build_exporter_app(
            _settings(created_series=created),
            spec,
            probes=[CountingProbe(interval=5)],
            extra_collectors=[histogram_registry()],
        )
        with (
            serve_in_thread(exporter.app, access_log=False) as server,
            httpx.Client(base_url=server.url) as client,
        ):
            text = client.get("/metrics").text
            names = _sample_names(text)
            assert catalog.LLM_REQUEST_DURATION_SECONDS.bucket in names
            assert (f"{catalog.LLM_REQUEST_DURATION_SECONDS}_created" in names) is expected
            result = promtool_check(text)
            assert result.returncode == 0, result.stdout + result.stderr
            gz = client.get("/metrics", headers={"Accept-Encoding": "gzip"})
            assert gz.headers["content-encoding"] == "gzip" and "llm_request" in gz.text
            om = client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
            assert om.headers["content-type"].startswith("application/openmetrics-text")
            assert om.text.rstrip().endswith("# EOF")


# ---- the real command in a subprocess ---------------------------------------------------------


class ExporterProcess:
    """`redline exporters` started as a real subprocess on a free port."""

    def __init__(self, workdir: Path, config: dict[str, object], env: dict[str, str]) -> None:
        self.port = free_port()
        config_path = workdir / "exporters.yaml"
        config_path.write_text(yaml.safe_dump(config))
        self.log = workdir / "exporters.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [REDLINE, "exporters", "--port", str(self.port), "--config", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            assert self.process.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode


@pytest.fixture()
def registry_with_model(tmp_path: Path) -> SnapshotRegistry:
    registry = SnapshotRegistry(tmp_path / "snapshots")
    weights = tmp_path / "adapter"
    weights.mkdir()
    (weights / "adapter_model.safetensors").write_bytes(b"w" * 4096)
    config = tmp_path / "adapter_config.json"
    config.write_text('{"r": 16}')
    snapshot = registry.create("chat", "2024-06-01", weights, config, adapter="chat-lora")
    registry.mark_verified(
        "chat", snapshot.snapshot_id, Baselines(p99_seconds=0.61, accuracy_ratio=0.94)
    )
    registry.activate("chat", snapshot.snapshot_id)
    registry.record_checkpoint("chat-lora", when=1_700_000_000.0)
    return registry


def _wait_for(url: str, predicate: object, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while True:
        try:
            text = httpx.get(url, timeout=2).text
        except httpx.HTTPError as exc:  # not listening yet
            text = str(exc)
        else:
            if predicate(text):  # type: ignore[operator]
                return text
        assert time.monotonic() < deadline, text
        time.sleep(0.1)


def test_exporter_subprocess_serves_probes_survives_failures_and_stops(
    tmp_path: Path, registry_with_model: SnapshotRegistry
) -> None:
    config = {
        "probe_timeout_seconds": 5,
        "models": {"root": str(registry_with_model.root), "interval_seconds": 0.2},
        **{section: {"enabled": False} for section in OTHER_SECTIONS},
    }
    process = ExporterProcess(tmp_path, config, {"REDLINE_LOG_LEVEL": "info"})
    try:
        metrics = f"{process.url}/metrics"
        text = _wait_for(
            metrics,
            lambda t: probe_value(t, catalog.REDLINE_PROBE_SUCCESS.name, "model_versions") == 1.0,
        )
        info = values(text, catalog.MODEL_ACTIVE_INFO.name)
        assert len(info) == 1
        labels = dict(next(iter(info)))
        assert labels["model"] == "chat" and labels["version"] == "2024-06-01"
        assert len(labels["weights_hash"]) == 64
        assert values(text, catalog.MODEL_BASELINE_P99_SECONDS.name) == {
            (("model", "chat"), ("model_version", "2024-06-01")): 0.61
        }
        assert values(text, catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS.name) == {
            (("adapter", "chat-lora"),): 1_700_000_000.0
        }
        result = promtool_check(text)
        assert result.returncode == 0, result.stdout + result.stderr

        # A corrupt active pointer fails the probe; the process stays up and keeps serving.
        pointer = registry_with_model.root / "models" / "chat" / "active.json"
        good = pointer.read_text()
        pointer.write_text("{ half a pointer")
        text = _wait_for(
            metrics,
            lambda t: probe_value(t, catalog.REDLINE_PROBE_SUCCESS.name, "model_versions") == 0.0,
        )
        assert not values(text, catalog.MODEL_ACTIVE_INFO.name)
        health = httpx.get(f"{process.url}/healthz", timeout=2).json()
        assert "malformed JSON" in health["probes"]["model_versions"]["error"]
        assert process.process.poll() is None
        # ...and recovers by itself once the file is repaired.
        pointer.write_text(good)
        _wait_for(metrics, lambda t: len(values(t, catalog.MODEL_ACTIVE_INFO.name)) == 1)
    finally:
        started = time.monotonic()
        code = process.stop()
        stop_seconds = time.monotonic() - started
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), process.log.read_text()
    assert stop_seconds < 5
    log = process.log.read_text()
    assert "exporter stopped its scheduler" in log and "Application shutdown complete" in log


def test_exporter_rejects_bad_settings_with_a_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  interval_seconds: -1\n  colour: blue\n")
    result = subprocess.run(
        [REDLINE, "exporters", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert f"{bad}: models.interval_seconds" in result.stderr
    assert f"{bad}: models.colour: Extra inputs are not permitted" in result.stderr
    assert "Traceback" not in result.stderr


def test_settings_precedence_flags_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "exporters.yaml"
    config.write_text("port: 9200\nmodels:\n  interval_seconds: 7\n  root: /srv/snapshots\n")
    monkeypatch.setenv("REDLINE_MODELS__INTERVAL_SECONDS", "3")
    monkeypatch.setenv("REDLINE_PORT", "9300")
    settings = load_exporter_settings(config, port=9400)
    assert settings.port == 9400
    assert settings.models.interval_seconds == 3.0
    assert settings.models.root == Path("/srv/snapshots")  # env changed one field of the section
    monkeypatch.delenv("REDLINE_PORT")
    assert load_exporter_settings(config).port == 9200


HANGING_EXPORTER = """
import sys, threading
import uvicorn
from redline.exporters.app import build_exporter_app
from redline.exporters.probe import MetricDef
from redline.exporters.settings import ExporterSettings
from redline.slo.load import default_spec_text, load_spec

class Hang:
    name = "hang"
    interval_seconds = 1.0
    metrics = (MetricDef("hang_value", "gauge", "Never delivered."),)
    def run(self):
        threading.Event().wait(3600)
        return []

exporter = build_exporter_app(ExporterSettings(), load_spec().spec, probes=[Hang()])
uvicorn.run(exporter.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_process_while_a_probe_hangs(tmp_path: Path, signum: int) -> None:
    port = free_port()
    log = tmp_path / "hang.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", HANGING_EXPORTER, str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(
            f"http://127.0.0.1:{port}/healthz",
            lambda t: '"running_seconds":null' not in t,
            timeout=20,
        )
        process.send_signal(signum)
        started = time.monotonic()
        process.wait(timeout=10)
        assert time.monotonic() - started < 3, "a hung probe thread kept the process alive"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert "Application shutdown complete" in log.read_text()


# ---- every probe wired, against real redis-server, Milvus Lite, simulators and the gateway ------


def _spec_file(tmp_path: Path, reference: Path) -> Path:
    data = yaml.safe_load(default_spec_text())
    data["drift"] = {**data["drift"], "window": 60, "reference": str(reference)}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture()
def serving(redis_url: str) -> Iterator[dict[str, str]]:
    """Two simulated regions and the gateway in front of them."""
    sims = {
        region: serve_in_thread(build_simulator_app(SimulatorSettings(region=region, seed=i)))
        for i, region in enumerate(("primary", "secondary"))
    }
    upstreams = {region: server.url for region, server in sims.items()}
    gateway = serve_in_thread(
        build_gateway_app(
            GatewaySettings(upstreams=upstreams, redis_url=redis_url),
            load_spec().spec,
            CollectorRegistry(),
        )
    )
    yield {**upstreams, "gateway": gateway.url}
    gateway.stop()
    for server in sims.values():
        server.stop()


def test_every_probe_is_wired_from_settings(
    tmp_path: Path,
    redis_url: str,
    milvus_service: Service,
    serving: dict[str, str],
    registry_with_model: SnapshotRegistry,
) -> None:
    rng = np.random.default_rng(7)
    reference = tmp_path / "reference.npy"
    np.save(reference, rng.standard_normal((300, 8)).astype(np.float32))
    client = redis.Redis.from_url(redis_url)
    try:
        for vector in rng.standard_normal((80, 8)):
            client.xadd("embeddings", {"vector": encode_vector(vector)})
        client.xgroup_create("wired:cdc", "replica", id="$", mkstream=True)
    finally:
        client.close()
    uri = milvus_service.extra["uri"]
    name = f"wired{uuid.uuid4().hex[:8]}"
    for suffix in ("p", "r"):
        target = MilvusTarget(TargetSpec(uri, f"{name}_{suffix}", suffix), 8)
        target.ensure_collection()
        target.close()

    config = {
        "probe_timeout_seconds": 20,
        "models": {"root": str(registry_with_model.root), "interval_seconds": 0.5},
        "endpoints": {
            "interval_seconds": 0.5,
            "upstreams": {"primary": serving["primary"], "secondary": serving["secondary"]},
        },
        "golden_set": {"interval_seconds": 1, "gateway_url": serving["gateway"]},
        "index_staleness": {
            "interval_seconds": 0.5,
            "collection": name,
            "dim": 8,
            "primary_uri": uri,
            "primary_collection": f"{name}_p",
            "replica_uri": uri,
            "replica_collection": f"{name}_r",
        },
        "session_rpo": {
            "interval_seconds": 0.5,
            "targets": [{"stream": "wired:cdc", "group": "replica"}],
        },
        "keepalive": {"interval_seconds": 0.5, "ttl_seconds": 600},
        "drift": {"interval_seconds": 1, "source": "redis_stream", "stream": "embeddings"},
    }
    spec = _spec_file(tmp_path, reference)
    process = ExporterProcess(
        tmp_path,
        config,
        {"REDLINE_REDIS_URL": redis_url, "REDLINE_SPEC": str(spec), "REDLINE_LOG_LEVEL": "info"},
    )
    try:
        health = json.loads(
            _wait_for(
                f"{process.url}/healthz",
                lambda t: json.loads(t)["probes_ok"] == json.loads(t)["probes_total"],
                timeout=60,
            )
        )
        assert sorted(health["probes"]) == [
            "embedding_drift",
            "index_consistency",
            "index_staleness",
            "llm_endpoint_primary",
            "llm_endpoint_secondary",
            "llm_golden_redline_base",
            "model_versions",
            "session_keepalive",
            "session_rpo",
        ]
        # That a scrape never waits on a probe is the hanging-probe test's (a timed bound here
        # only measured the machine's load).
        text = httpx.get(f"{process.url}/metrics", timeout=5).text
        names = _sample_names(text)
        for expected in (
            catalog.MODEL_ACTIVE_INFO.name,
            catalog.LLM_PROBE_SUCCESS.name,
            catalog.LLM_EVAL_REQUESTS_TOTAL.name,
            catalog.VECTORDB_INDEX_STALENESS_SECONDS.name,
            catalog.VECTORDB_WRITE_FROZEN.name,
            catalog.SESSION_CDC_RPO_SECONDS.name,
            catalog.SESSION_CONTEXT_TTL_SECONDS.name,
            catalog.EMBEDDING_DRIFT_SCORE.name,
            catalog.EMBEDDING_DRIFT_THRESHOLD.name,
        ):
            assert expected in names, expected
        assert (
            values(text, catalog.LLM_PROBE_SUCCESS.name)[
                (("probe", "healthz"), ("region", "secondary"))
            ]
            == 1
        )
        assert values(text, catalog.SESSION_CDC_RPO_SECONDS.name) == {
            (("group", "replica"), ("stream", "wired:cdc")): 0.0
        }
        result = promtool_check(text)
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        process.stop()
    assert "Traceback" not in process.log.read_text()
