"""A user's playbook needs no edit of redline: installed as a `redline.playbooks` entry point,
or named by the `playbook_classes` setting, it is registered, its options validated, the spec may
route an alert to it, and the real worker (a `redline remediation worker` process, or the
receiver with its workers) runs it against real Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from redline.devstack.processes import free_port
from redline.remediation.catalog import builtin_playbook_names
from redline.slo import catalog
from tests.support.playbook import deliver
from tests.support.remediation import (
    AUTH,
    REPO,
    TOKEN,
    alert,
    make_settings,
    payload,
    post,
    store_for,
    wait_for,
    wait_terminal,
)

PLAYBOOK = '''
"""A deployment's own playbook: restart a region's pods (here: a mark in Redis)."""

from collections.abc import Sequence
from typing import Self

import redis
from pydantic import BaseModel, ConfigDict, Field

from redline.remediation.playbook import Playbook, PlannedStep, PlaybookContext, StepResult
from redline.remediation.settings import RemediationSettings


class RestartOptions(BaseModel):
    """`playbook_options.acme_restart`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    marker: str = Field("restarted", description="What the restart leaves in Redis.")


class Restart(Playbook):
    """Restart the region named by the alert."""

    name = "acme_restart"
    target_label = "region"
    Options = RestartOptions

    def __init__(self, marker: str, redis_url: str) -> None:
        self.marker = marker
        self.redis_url = redis_url

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: RestartOptions) -> Self:
        return cls(options.marker, settings.redis_url)

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        return (PlannedStep("restart", f"restart {ctx.target}", {"region": ctx.labels["region"]}),)

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        ctx.redis.incr(f"acme:restarts:{ctx.job_id}")
        ctx.redis.set(f"acme:state:{step.params['region']}", self.marker)
        return StepResult.success(f"{step.params['region']} restarted")

    def verify(self, ctx: PlaybookContext) -> StepResult:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            state = client.get(f"acme:state:{ctx.labels['region']}")
        finally:
            client.close()
        return StepResult(state == self.marker, f"state={state!r}")
'''


def write_module(root: Path, module: str) -> None:
    """The user's playbook module under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(PLAYBOOK))


def write_distribution(root: Path, module: str) -> None:
    """The module and the `.dist-info` pip would write for a distribution declaring it in the
    entry-point group `redline.playbooks`."""
    write_module(root, module)
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[redline.playbooks]\nacme_restart = {module}:Restart\n"
    )


def write_spec(path: Path) -> Path:
    """A spec routing the latency red line to the user's playbook, with a policy for it."""
    path.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "service": "chat",
                "regions": ["primary", "secondary"],
                "red_lines": {"latency_p99": {"playbook": "acme_restart"}},
                "remediation": {"playbooks": {"acme_restart": {"mode": "act", "deadline": "5m"}}},
            }
        )
    )
    return path


def write_config(path: Path, redis_url: str, spec: Path, **extra: Any) -> Path:
    """Worker settings: the built-in playbooks (unconfigured here) off, short timings."""
    off = {name: {"mode": "off"} for name in builtin_playbook_names()}
    values = {
        "redis_url": redis_url,
        "spec": str(spec),
        "policies": off,
        "poll_seconds": 0.1,
        "claim_idle_seconds": 1.5,
        "lock_ttl_seconds": 1.5,
        "playbook_options": {"acme_restart": {"marker": "restarted-by-acme"}},
        **extra,
    }
    path.write_text(yaml.safe_dump(values))
    return path


@contextmanager
def redline(argv: list[str], plugin_dir: Path, log: Path, **env: str) -> Iterator[None]:
    """`python -m redline.cli ARGV` with `plugin_dir` on its path (as if installed there),
    stopped with SIGTERM on exit; its exit code must be 0."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO), str(plugin_dir)])
    environment.update(env)
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "redline.cli", *argv],
            cwd=REPO,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        assert code == 0, log.read_text()


def _state(redis_url: str, key: str) -> str | None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        value = client.get(key)
    finally:
        client.close()
    return None if value is None else str(value)


def _red_line(fingerprint: str) -> dict[str, Any]:
    return alert(fingerprint, playbook="acme_restart", region="secondary",
                 labels={"alertname": "RedLineLatencyP99"})  # fmt: skip


def test_an_installed_entry_point_runs_in_the_worker_process(
    redis_url: str, tmp_path: Path
) -> None:
    plugin = tmp_path / "site-packages"
    write_distribution(plugin, "acme_entry_playbooks")
    config = write_config(tmp_path / "worker.yaml", redis_url, write_spec(tmp_path / "spec.yaml"))
    settings = make_settings(redis_url, poll_seconds=0.1)
    store, client = store_for(settings)
    log = tmp_path / "worker.log"
    try:
        with redline(["remediation", "worker", "--config", str(config)], plugin, log):
            [job_id] = deliver(settings, _red_line("ac00000000000001"))
            job = wait_terminal(store, job_id, timeout=60)
    finally:
        client.close()
    assert job.status == "succeeded", (job.error, log.read_text())
    assert job.playbook == "acme_restart" and job.target == "region=secondary"
    assert [step["name"] for step in job.plan or []] == ["restart"]
    assert _state(redis_url, "acme:state:secondary") == "restarted-by-acme"
    assert _state(redis_url, f"acme:restarts:{job_id}") == "1"
    assert "acme_restart" in log.read_text()  # the worker lists it among its playbooks


def _job(url: str, job_id: str) -> Mapping[str, Any] | None:
    job: Mapping[str, Any] = httpx.get(f"{url}/jobs/{job_id}", headers=AUTH, timeout=5).json()
    return job if job.get("status") == "succeeded" else None


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_playbook_class_setting_runs_in_the_receiver_s_worker(
    redis_url: str, tmp_path: Path
) -> None:
    plugin = tmp_path / "code"
    write_module(plugin, "acme_dotted_playbooks")
    config = write_config(
        tmp_path / "receiver.yaml",
        redis_url,
        write_spec(tmp_path / "spec.yaml"),
        playbook_classes=["acme_dotted_playbooks:Restart"],
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["remediation", "--config", str(config), "--port", str(port), "--workers", "1"]
    log = tmp_path / "receiver.log"
    with redline(argv, plugin, log, REDLINE_WEBHOOK_TOKEN=TOKEN):
        wait_for(lambda: _ready(url), timeout=60, what="redline remediation to serve")
        answer = post(url, payload(_red_line("ac00000000000002")))
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["alerts"][0]["job_id"]
        job = wait_for(lambda: _job(url, job_id), timeout=30, what="the user's playbook to run")
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
    assert job["playbook"] == "acme_restart" and job["attempts"] == 1
    assert _state(redis_url, "acme:state:secondary") == "restarted-by-acme"
    # The guard gauges show the user's playbook beside the built-in ones.
    [mode] = [
        line
        for line in metrics.splitlines()
        if line.startswith(f"{catalog.REDLINE_REMEDIATION_MODE.name}{{")
        and 'playbook="acme_restart"' in line
        and 'mode="act"' in line
    ]
    assert mode.endswith(" 1.0")
    unregistered = [line for line in log.read_text().splitlines() if "not registered" in line]
    assert not any("acme_restart" in line for line in unregistered), unregistered
