"""`redline sources detect --metrics-url` and `redline validate --metrics-url` as a user runs
them: the installed command against an engine page served over HTTP."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from redline.devstack.fakes.engines import EngineMetrics
from redline.devstack.fakes.metrics_server import EngineMetricsServer
from redline.devstack.processes import free_port

pytestmark = pytest.mark.integration

REDLINE = shutil.which("redline") or str(Path(sys.executable).with_name("redline"))


def redline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REDLINE, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def sglang() -> Iterator[EngineMetricsServer]:
    engine = EngineMetrics("sglang")
    engine.observe(0.4, count=10)
    with EngineMetricsServer(engine) as server:
        yield server


def test_detect_reads_a_live_engine(sglang: EngineMetricsServer) -> None:
    done = redline("sources", "detect", "--metrics-url", sglang.url)
    assert done.returncode == 0, done.stderr
    assert "(profile sglang, by sglang:e2e_request_latency_seconds)" in done.stdout
    block = yaml.safe_load(done.stdout.split("# paste into the spec:\n", 1)[1])
    assert block == {"sources": {"profile": "sglang"}}
    assert sglang.scrapes >= 1


def test_validate_checks_the_spec_against_the_engine(
    sglang: EngineMetricsServer, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: v1\nservice: chat\nregions: [primary]\nsources:\n  profile: sglang\n")
    done = redline("validate", str(spec), "--metrics-url", sglang.url)
    assert done.returncode == 0, done.stdout + done.stderr
    spec.write_text("version: v1\nservice: chat\nregions: [primary]\nsources:\n  profile: vllm\n")
    done = redline("validate", str(spec), "--metrics-url", sglang.url)
    assert done.returncode == 2
    assert "sources.profile is 'vllm', the engine is 'sglang'" in done.stdout


def test_an_unreachable_url_exits_3_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    done = redline("sources", "detect", "--metrics-url", url)
    assert done.returncode == 3
    assert f"{url}: cannot be read" in done.stderr
    done = redline("sources", "detect", "--metrics-url", "not a url")
    assert done.returncode == 3 and "not a url: cannot be read" in done.stderr
