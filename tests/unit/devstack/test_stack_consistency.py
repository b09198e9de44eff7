"""The local stack's exporter compares the regions' answers (maturity level 2)."""

from __future__ import annotations

from pathlib import Path

from redline.devstack.config import build_exporter_settings, render_settings
from redline.devstack.layout import BASE_MODEL, StackLayout, build_endpoints, build_ported_parts
from redline.exporters.app import build_probes
from redline.exporters.consistency import ConsistencyProbe
from redline.exporters.settings import load_exporter_settings
from redline.slo.load import apply_profile, load_spec

REGIONS = ("primary", "secondary")


def test_the_stack_enables_the_consistency_probe_on_every_region(tmp_path: Path) -> None:
    spec = apply_profile(load_spec().spec, "local")
    ports = {part: 21000 + i for i, part in enumerate(build_ported_parts(REGIONS))}
    endpoints = build_endpoints(ports, REGIONS)
    raw = build_exporter_settings(spec, endpoints, StackLayout(tmp_path / "run"), None)
    assert raw["consistency"]["interval_seconds"] <= spec.timing.probe_stale_after_seconds / 3
    path = tmp_path / "exporters.yaml"
    path.write_text(render_settings(raw), "utf-8")
    settings = load_exporter_settings(path)
    assert settings.consistency.enabled
    assert settings.consistency.upstreams == endpoints.upstreams
    built = build_probes(settings, spec)
    probes = [p for p in built if isinstance(p, ConsistencyProbe)]
    try:
        (probe,) = probes
        assert probe.model == BASE_MODEL
        assert probe.primary == ("primary", endpoints.upstreams["primary"])
        assert probe.backups == (("secondary", endpoints.upstreams["secondary"]),)
    finally:
        for any_probe in built:
            close = getattr(any_probe, "close", None)
            if close is not None:
                close()
