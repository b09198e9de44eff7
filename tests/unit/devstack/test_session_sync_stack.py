"""The CRDT session sync as parts of the local stack: one process per direction between the
first two regions, each region's store in its own Redis database, the exporter measuring both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from redline.core.settings import load_settings
from redline.devstack.config import build_part_commands, render_settings
from redline.devstack.layout import (
    StackLayout,
    build_endpoints,
    build_part_names,
    build_ported_parts,
    build_session_sync_parts,
)
from redline.exporters.settings import ExporterSettings
from redline.platform.session_sync import SessionSyncSettings
from redline.slo.load import apply_profile, load_spec

REGIONS = ("primary", "secondary")


def test_two_sync_parts_run_after_the_session_writer_in_every_source() -> None:
    assert build_session_sync_parts(REGIONS) == ("session-sync-secondary", "session-sync-primary")
    assert build_session_sync_parts(REGIONS[:1]) == ()
    for source in ("redline-gateway", "vllm"):
        names = build_part_names(REGIONS, source=source)
        at = names.index("session-writer")
        assert names[at + 1 : at + 3] == build_session_sync_parts(REGIONS)
        assert names[-1] == "loadgen"


def test_each_direction_reads_the_other_regions_store_and_the_exporter_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("REDLINE_"):
            monkeypatch.delenv(name)
    ports = {p: 27000 + i for i, p in enumerate(build_ported_parts(REGIONS))}
    endpoints = build_endpoints(ports, REGIONS)
    assert endpoints.crdt_session_urls == {
        "primary": "redis://127.0.0.1:27000/0",
        "secondary": "redis://127.0.0.1:27000/2",
    }
    spec = apply_profile(load_spec().spec, "local")
    layout = StackLayout(tmp_path / "run")
    commands = {c.part: c for c in build_part_commands(spec, endpoints, layout, None, 30.0, 7)}
    seen = {}
    for part in build_session_sync_parts(REGIONS):
        command = commands[part]
        assert command.argv[-4:-2] == ("sessions", "sync")
        path = tmp_path / f"{part}.yaml"
        path.write_text(render_settings(command.settings))
        seen[part] = load_settings(SessionSyncSettings, path)
    into_secondary, into_primary = seen["session-sync-secondary"], seen["session-sync-primary"]
    assert (into_secondary.region, into_secondary.source_region) == ("secondary", "primary")
    assert into_secondary.redis_url == into_primary.source_url == "redis://127.0.0.1:27000/2"
    assert into_primary.redis_url == into_secondary.source_url == "redis://127.0.0.1:27000/0"
    exporter = tmp_path / "exporters.yaml"
    exporter.write_text(render_settings(commands["exporters"].settings))
    crdt = load_settings(ExporterSettings, exporter).session_crdt
    assert crdt.enabled and crdt.regions == endpoints.crdt_session_urls
    assert crdt.settle_seconds < spec.rpo.session_crdt.max_seconds
    assert yaml.safe_load(exporter.read_text())["session_crdt"]["interval_seconds"] == 0.5
