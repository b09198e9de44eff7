"""Helpers of the built-in playbook tests: the real registry (`catalog.open_registry`) in worker
threads or a worker process, simulated regions behind the real gateway, alert delivery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.gateway import GatewaySettings, build_gateway_app
from redline.remediation.catalog import open_registry
from redline.remediation.jobs import Job
from redline.remediation.models import Alert, job_id_for
from redline.remediation.settings import RemediationSettings
from redline.remediation.worker import Worker
from redline.slo.load import load_spec
from redline.slo.spec import PlaybookPolicy
from tests.support.remediation import (
    REPO,
    make_settings,
    payload,
    post,
    receiver,
    store_for,
    wait_terminal,
    worker_threads,
)

REAL_REGISTRY = "redline.remediation.catalog:open_registry"


def playbook_settings(redis_url: str, **overrides: Any) -> RemediationSettings:
    """Short test timings with the real playbook registry."""
    return make_settings(redis_url, playbooks=REAL_REGISTRY, **overrides)


@contextmanager
def real_workers(settings: RemediationSettings, count: int = 1) -> Iterator[list[Worker]]:
    """`count` worker threads on the built-in registry, stopped and joined on exit."""
    with worker_threads(settings, open_registry, count, "playbook-worker", 30) as running:
        yield running


def worker_process(
    settings: RemediationSettings, config_dir: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    """`redline remediation worker --config FILE` on the built-in registry, in its own process.

    Built-in playbooks the test leaves unconfigured are set `off` (unless the settings give them
    a policy): the worker refuses to start while an enabled playbook lacks a setting."""
    off = {
        playbook.name: PlaybookPolicy(mode="off")
        for playbook in open_registry(settings)
        if playbook.settings_problems() and playbook.name not in settings.policies
    }
    settings = settings.model_copy(update={"policies": {**off, **settings.policies}})
    config = config_dir / "worker.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude_none=True)))
    argv = [sys.executable, "-m", "redline.cli", "remediation", "worker", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDLINE_")}
    env["PYTHONPATH"] = str(REPO)
    with log_path.open("ab") as log:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def job_id(alert_body: Mapping[str, Any]) -> str:
    """The job id the receiver derives from an alert."""
    return job_id_for(Alert.model_validate_json(json.dumps(alert_body)))


def deliver(settings: RemediationSettings, *alerts: dict[str, Any]) -> list[str]:
    """POST an Alertmanager v4 payload to the real receiver over HTTP; the new job ids."""
    with receiver(settings) as server:
        response = post(server.url, payload(*alerts))
    assert response.status_code == 202, response.text
    return [str(item["job_id"]) for item in response.json()["alerts"]]


def run_jobs(
    settings: RemediationSettings, *alerts: dict[str, Any], timeout: float = 60.0
) -> list[Job]:
    """Deliver the alerts, run them on a real worker, return the finished jobs."""
    ids = deliver(settings, *alerts)
    store, client = store_for(settings)
    try:
        with real_workers(settings):
            return [wait_terminal(store, job, timeout) for job in ids]
    finally:
        client.close()


def records(job: Job, name: str) -> list[dict[str, Any]]:
    """The job's step records called `name`, in order."""
    return [step for step in job.steps if step.get("name") == name]


def get_job(settings: RemediationSettings, job: str) -> Job:
    """A job as the store has it."""
    store, client = store_for(settings)
    try:
        found = store.get(job)
    finally:
        client.close()
    assert found is not None
    return found


@dataclass
class Stack:
    """Simulated regions behind the real gateway, all over HTTP on loopback."""

    sims: dict[str, ServerThread]
    gateway: ServerThread
    client: httpx.Client

    @property
    def upstreams(self) -> dict[str, str]:
        """region -> simulator URL."""
        return {region: server.url for region, server in self.sims.items()}

    def faults(self, region: str, faults: dict[str, Any]) -> None:
        """Replace a region's fault knobs through its admin endpoint."""
        response = self.client.post(f"{self.sims[region].url}/admin/faults", json=faults)
        assert response.status_code == 200, response.text

    def chat(self, model: str, prompt: str = "hello", dry_run: bool = False) -> httpx.Response:
        """A chat completion through the gateway."""
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 4}  # fmt: skip
        params = {"dry-run": "true"} if dry_run else None
        return self.client.post(f"{self.gateway.url}/v1/chat/completions", json=body, params=params)


@contextmanager
def serving_stack(
    redis_url: str,
    regions: tuple[str, ...] = ("primary", "secondary"),
    adapters: Mapping[str, str] | None = None,
    **gateway: Any,
) -> Iterator[Stack]:
    """Simulators (one per region, with `adapters` loaded) and the gateway in front of them."""
    sims: dict[str, ServerThread] = {}
    client = httpx.Client(timeout=10, trust_env=False)
    try:
        for seed, region in enumerate(regions):
            settings = SimulatorSettings(region=region, seed=seed, adapters=dict(adapters or {}))
            sims[region] = serve_in_thread(build_simulator_app(settings))
        gateway_settings = GatewaySettings(
            upstreams={region: server.url for region, server in sims.items()},
            redis_url=redis_url,
            **gateway,
        )
        app = build_gateway_app(gateway_settings, load_spec(None).spec)
        front = serve_in_thread(app)
        try:
            yield Stack(sims, front, client)
        finally:
            front.stop()
    finally:
        for server in sims.values():
            server.stop()
        client.close()


__all__ = [
    "Stack",
    "deliver",
    "get_job",
    "job_id",
    "playbook_settings",
    "real_workers",
    "records",
    "run_jobs",
    "serving_stack",
    "worker_process",
]
