"""redline's burn-rate alerts beside Sloth's golden output in the real promtool, over the same
requests (`bench.slo_detection`): redline fires no later than Sloth where the workbook alerts,
and stays silent at the objective and on a handful of failed requests, where Sloth does not.
The day-long slow burn is left to `make bench` (about 30 s of promtool), and the scenarios with
hours of history are sampled every minute here rather than every 15 s (a quarter of the
evaluations; both sides alike)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from bench import slo_detection as sd
from redline.slo.load import load_spec

pytestmark = pytest.mark.integration

SHORT = [
    s if s.good_minutes + s.bad_minutes <= 60 else dataclasses.replace(s, step=60)
    for s in sd.SCENARIOS
    if s.good_minutes + s.bad_minutes <= 8 * 60
]


@pytest.mark.parametrize("scenario", SHORT, ids=lambda s: s.name)
def test_redline_detects_no_later_than_sloth(tmp_path: Path, scenario: sd.Scenario) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is installed by the test set-up (.ci/run)"
    spec = load_spec().spec
    detection = sd.run_scenario(promtool, tmp_path, spec, sd.availability_slo(spec), scenario, 0)
    for severity in sd.SEVERITIES:
        ours = detection.after.get(("redline", severity))
        theirs = detection.after.get(("sloth", severity))
        if severity in scenario.expect:
            assert ours is not None and theirs is not None, detection
            assert ours <= theirs, detection
        else:
            assert ours is None, detection
    # Where the sides disagree by design, Sloth does fire: the scenario tests something.
    if not scenario.expect:
        assert detection.after, detection
