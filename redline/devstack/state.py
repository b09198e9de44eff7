"""The state file of a run: every part `redline up` started, with its pid and kernel start time.

`redline down` and `redline status` act on exactly the processes listed here: a pid that was
reused by another program has another start time and is left alone. The file is rewritten
(atomically) after each part starts, so even a `redline up` killed half-way can be cleaned up.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.devstack.config import build_source_spec
from redline.devstack.errors import StackError
from redline.devstack.layout import (
    DEFAULT_PODS,
    GATEWAY_SOURCE,
    Endpoints,
    StackLayout,
    build_endpoints,
)
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Spec

STATE_FORMAT = 1
PartKind = Literal["service", "redline"]


class PartState(BaseModel):
    """One started process."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: PartKind
    pid: int
    start_ticks: int | None = Field(None, description="Kernel start time of the pid (/proc).")
    port: int | None = None
    url: str | None = None
    log: str
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment the part got beyond the stack's own (the gateway's OTEL_*); "
        "a restart passes it again.",
    )
    started_at: float


class StackState(BaseModel):
    """What `redline up` started, where, and how to reach it."""

    model_config = ConfigDict(extra="forbid")

    format: int = STATE_FORMAT
    status: Literal["starting", "running"] = "starting"
    run_dir: str
    spec: str | None
    spec_source: str
    host: str
    regions: list[str]
    prometheus_regions: list[str] = Field(
        default_factory=list,
        description="Regions with their own Prometheus, federated by the global one.",
    )
    source: str = Field(
        GATEWAY_SOURCE,
        description="redline-gateway (the gateway in the path), or the engine profile the "
        "simulators publish with no gateway (`redline up --source`).",
    )
    pods: int = Field(
        DEFAULT_PODS,
        description="Simulator pods per region, behind the region's service front "
        "(`redline up --pods`).",
    )
    redis: str = Field(
        "single",
        description="Redis topology: one server, or a primary, a replica and three Sentinels "
        "(`redline up --redis sentinel`).",
    )
    replicas: int = Field(
        1,
        description="Replicas of the gateway, the receiver and the exporter "
        "(`redline up --replicas`).",
    )
    ports: dict[str, int]
    hosts: dict[str, str] = Field(
        default_factory=dict,
        description="Parts on an address of their own (the compose stack run as processes); "
        "every other part listens on `host`.",
    )
    rate: float
    seed: int
    started_at: float
    parts: list[PartState] = Field(default_factory=list)

    def part(self, name: str) -> PartState | None:
        """The part called `name`, if started."""
        return next((p for p in self.parts if p.name == name), None)

    def endpoints(self) -> Endpoints:
        """The URLs of this run."""
        return build_endpoints(
            self.ports,
            self.regions,
            self.host,
            self.prometheus_regions,
            self.source,
            self.pods,
            self.hosts,
            self.redis,
            self.replicas,
        )

    def layout(self) -> StackLayout:
        """The run directory's layout."""
        return StackLayout(Path(self.run_dir))

    def load_spec(self) -> Spec:
        """The spec this run was started with, local profile applied, as its source runs it
        (`build_source_spec`: an engine's profile, no reroute without the gateway)."""
        return build_source_spec(apply_profile(load_spec(self.spec).spec, "local"), self.source)


def read_state(layout: StackLayout) -> StackState | None:
    """The run's state, or None when the directory holds none; StackError when unreadable."""
    try:
        text = layout.state_file.read_text("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StackError(f"{layout.state_file}: cannot read: {exc.strerror}") from None
    try:
        return StackState.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise StackError(
            f"{layout.state_file}: not a redline state file ({where}: {first['msg']}); "
            "remove it if no stack runs from this directory"
        ) from None


def write_state(layout: StackLayout, state: StackState) -> None:
    """Replace the state file atomically."""
    layout.root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=layout.root, prefix=".state.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(state.model_dump_json(indent=2))
    os.replace(tmp, layout.state_file)


def load_running(run_dir: Path) -> StackState:
    """The state of a running stack; StackError when the directory has none."""
    layout = StackLayout(run_dir.resolve())
    state = read_state(layout)
    if state is None:
        raise StackError(f"no stack in {layout.root} (no {layout.state_file.name}); "
                         f"start one with `redline up --run-dir {run_dir}`")  # fmt: skip
    return state


def describe_urls(state: StackState) -> list[tuple[str, str]]:
    """(what, where) lines `redline up` prints."""
    e = state.endpoints()
    layout = state.layout()

    def numbered(index: int) -> str:
        return f" {index + 1}" if e.replicas > 1 else ""

    regional = [(f"Prometheus {r}", e.regional_prometheus_url(r)) for r in e.prometheus_regions]
    if e.has_gateway:
        serving = [
            (f"Gateway {i + 1} (OpenAI API)" if e.replicas > 1 else "Gateway (OpenAI API)",
             f"{url}/v1/chat/completions")
            for i, url in enumerate(e.gateway_urls)
        ]  # fmt: skip
        pod_extra = "/admin/faults"
    else:
        serving = [("Clients send to (OpenAI API)", f"{e.client_url}/v1/chat/completions")]
        pod_extra = f"/metrics: {e.source}'s series, /admin/faults"
    tracing = (
        [("Trace store (OTLP/HTTP)", f"{e.trace_store_url}  (POST /v1/traces, GET /api/traces)")]
        if e.has_trace_store
        else []
    )
    simulators: list[tuple[str, str]] = []
    for r in e.regions:
        simulators.append((f"Service {r} ({e.pods} pods, round robin)", e.service_url(r)))
        simulators += [
            (f"  Simulator pod {r}-{i}", f"{url}  ({pod_extra})")
            for i, url in enumerate(e.pod_urls(r))
        ]
    rows = [
        ("Prometheus (global)" if e.federated else "Prometheus", e.prometheus_url),
        *regional,
        ("Alertmanager", e.alertmanager_url),
        *[
            (f"Remediation receiver{numbered(i)}", f"{url}  (POST /alerts, GET /jobs)")
            for i, url in enumerate(e.receiver_urls)
        ],
        *serving,
        *[(f"Exporters{numbered(i)}", f"{url}/metrics") for i, url in enumerate(e.exporters_urls)],
        *tracing,
        *simulators,
        ("Redis (Sentinels: primary, replica)" if e.sentinel else "Redis", e.redis_url),
        ("Milvus Lite primary", e.milvus_primary_uri),
        ("Milvus Lite replica", e.milvus_replica_uri),
        ("Run directory", str(layout.root)),
        ("Logs", str(layout.logs_dir)),
        ("Webhook token file", str(layout.token_file)),
    ]
    return rows


def state_json(state: StackState, health: Mapping[str, object] | None = None) -> str:
    """The state (and each part's health) as pretty JSON, for `status --json`."""
    data = state.model_dump(mode="json")
    if health is not None:
        data["health"] = dict(health)
    return json.dumps(data, indent=2)


__all__ = [
    "PartState",
    "StackState",
    "describe_urls",
    "load_running",
    "read_state",
    "state_json",
    "write_state",
]
