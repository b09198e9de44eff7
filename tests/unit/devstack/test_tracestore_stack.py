"""The trace store as a part of the local stack: started before the gateway from its own settings
file, the gateway given the standard OTel environment pointing at it, its URL printed, and a run
without one (an older state file, the compose stack run as processes) still usable."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from redline.core.settings import load_settings
from redline.devstack.config import PartCommand, build_part_commands, render_settings
from redline.devstack.layout import (
    TRACE_STORE_PART,
    StackConfigError,
    StackLayout,
    build_endpoints,
    build_part_names,
    build_ported_parts,
)
from redline.devstack.state import PartState, StackState, describe_urls, read_state, write_state
from redline.devstack.tracestore import TraceStoreSettings
from redline.slo.load import apply_profile, load_spec

REGIONS = ("primary", "secondary")


def _ports(source: str = "redline-gateway") -> dict[str, int]:
    return {p: 26000 + i for i, p in enumerate(build_ported_parts(REGIONS, source=source))}


def _commands(tmp_path: Path, source: str = "redline-gateway") -> dict[str, PartCommand]:
    spec = apply_profile(load_spec().spec, "local")
    endpoints = build_endpoints(_ports(source), REGIONS, source=source)
    layout = StackLayout(tmp_path / "run")
    commands = build_part_commands(spec, endpoints, layout, None, 30.0, 7, python="py")
    return {c.part: c for c in commands}


def test_the_trace_store_starts_before_the_gateway_in_every_source() -> None:
    names = build_part_names(REGIONS)
    assert names.index(TRACE_STORE_PART) + 1 == names.index("gateway")
    assert TRACE_STORE_PART in build_ported_parts(REGIONS)
    vllm = build_part_names(REGIONS, source="vllm")
    assert TRACE_STORE_PART in vllm and "gateway" not in vllm


def test_its_settings_file_reads_back_and_the_gateway_exports_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("REDLINE_"):
            monkeypatch.delenv(name)
    commands = _commands(tmp_path)
    order = list(commands)
    assert order.index(TRACE_STORE_PART) < order.index("gateway")
    store = commands[TRACE_STORE_PART]
    path = tmp_path / "trace-store.yaml"
    path.write_text(render_settings(store.settings))
    settings = load_settings(TraceStoreSettings, path)
    port = _ports()[TRACE_STORE_PART]
    assert (settings.host, settings.port, settings.max_traces) == ("127.0.0.1", port, 2000)
    assert store.argv[-1].endswith("trace-store.yaml") and store.env == {}
    assert commands["gateway"].env == {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "redline-gateway",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    # Only the gateway exports spans; every other part keeps the stack's own environment.
    assert [p for p, c in commands.items() if c.env] == ["gateway"]
    vllm = _commands(tmp_path, "vllm")
    assert TRACE_STORE_PART in vllm and not any(c.env for c in vllm.values())


def _state(tmp_path: Path, ports: dict[str, int]) -> StackState:
    return StackState(run_dir=str(tmp_path), spec=None, spec_source="<embedded>",
                      host="127.0.0.1", regions=list(REGIONS), ports=ports, rate=30.0, seed=7,
                      started_at=0.0)  # fmt: skip


def test_up_prints_its_url_and_a_run_without_one_still_works(tmp_path: Path) -> None:
    ports = _ports()
    rows = dict(describe_urls(_state(tmp_path, ports)))
    url = f"http://127.0.0.1:{ports[TRACE_STORE_PART]}"
    assert rows["Trace store (OTLP/HTTP)"].startswith(url + "  (POST /v1/traces")
    assert build_endpoints(ports, REGIONS).otlp_traces_url == f"{url}/v1/traces"
    older = {p: port for p, port in ports.items() if p != TRACE_STORE_PART}
    endpoints = _state(tmp_path, older).endpoints()
    assert not endpoints.has_trace_store
    with pytest.raises(StackConfigError, match="no trace store"):
        assert endpoints.trace_store_url
    assert "Trace store (OTLP/HTTP)" not in dict(describe_urls(_state(tmp_path, older)))
    # Other parts stay mandatory.
    with pytest.raises(StackConfigError, match="no port chosen for: gateway"):
        build_endpoints({p: v for p, v in older.items() if p != "gateway"}, REGIONS)


def test_the_state_file_keeps_a_parts_environment_for_restarts(tmp_path: Path) -> None:
    state = _state(tmp_path, _ports())
    env = {"OTEL_SERVICE_NAME": "redline-gateway"}
    part: dict[str, Any] = {"name": "gateway", "kind": "redline", "pid": 1, "log": "g.log",
                            "started_at": 0.0}  # fmt: skip
    state.parts = [PartState(**part, env=env), PartState(**{**part, "name": "exporters"})]
    write_state(state.layout(), state)
    again = read_state(state.layout())
    assert again is not None
    assert [p.env for p in again.parts] == [env, {}]
    # A state file written before parts had an environment still reads.
    data = json.loads(state.layout().state_file.read_text())
    for recorded in data["parts"]:
        del recorded["env"]
    state.layout().state_file.write_text(json.dumps(data))
    older = read_state(state.layout())
    assert older is not None and older.parts[0].env == {}
