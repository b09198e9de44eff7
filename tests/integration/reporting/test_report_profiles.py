"""The SLO report over an engine profile: a real Prometheus holding vLLM's own series (no
gateway) and the generated rules backfilled over them, read by `generate_report`.

The report must measure the latency red line and the SLOs through the rules' mirror of vLLM's
series, and its notes must name the profile and what vLLM cannot measure.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from redline.devstack.samples.dashboards import profile_spec
from redline.devstack.samples.prometheus import SamplePrometheus, start_sample_prometheus
from redline.reporting.run import floor_hour, generate_report
from redline.rules.records import p99_record
from redline.slo.load import load_spec
from redline.slo.report import Report, Window
from redline.slo.sources import PROFILES
from redline.slo.spec import Spec

pytestmark = pytest.mark.integration

HOURS = 3.0


@pytest.fixture(scope="module")
def spec() -> Spec:
    """The default spec read from vLLM's metrics."""
    return profile_spec(load_spec().spec, "vllm")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, spec: Spec) -> Iterator[SamplePrometheus]:
    """Three hours of vLLM's series (a latency breach on the primary region) and the rules."""
    workdir: Path = tmp_path_factory.mktemp("vllm-report")
    # Ending on a whole hour, so the report's last two hours hold the sample's later incidents.
    sample = start_sample_prometheus(workdir, spec, hours=HOURS, end=floor_hour(time.time()))
    yield sample
    sample.stop()


@pytest.fixture(scope="module")
def report(prometheus: SamplePrometheus, spec: Spec) -> Report:
    """The report of the sample's last two whole hours (they hold the latency breach)."""
    end = floor_hour(prometheus.end)
    window = Window(end - 2 * 3600, end)
    assert window.start >= prometheus.start
    return generate_report(prometheus.service.url, spec, "vllm", window).report


def test_the_notes_name_the_profile_and_what_it_cannot_measure(report: Report) -> None:
    assert report.notes[0].startswith(f"source: {PROFILES['vllm'].title}, sources.profile vllm")
    assert report.notes[1].startswith("not measured with vllm: P99 including cross-region reroutes")
    assert any(n.startswith("errors from vllm:request_success_total, ") for n in report.notes)


def test_the_latency_red_line_is_read_from_the_recording_over_the_mirror(
    report: Report, spec: Spec
) -> None:
    assert f"P99 latency read from the recording rule {p99_record(spec)}" in report.notes
    (latency,) = [s for s in report.red_lines if s.key == "latency_p99"]
    assert "reroute" not in latency.title
    assert latency.measured_seconds > 3000
    # The sample's breach: the primary region's P99 is past the line for a while.
    assert latency.seconds_over > 0 and latency.status == "fail"
    assert latency.peak is not None and latency.peak > spec.red_lines.latency_p99.threshold_seconds


def test_the_slos_count_vllms_requests_and_errors(report: Report) -> None:
    by_name = {slo.name: slo for slo in report.slos}
    availability = by_name["availability"]
    # 65 requests/s over two hours, 0.04 % of them (0.4 % during the breach) answered 5xx.
    assert availability.events == pytest.approx(65 * 7200, rel=0.02)
    assert availability.attainment is not None and 0.99 < availability.attainment < 0.9999
    assert by_name["latency"].attainment is not None and by_name["latency"].attainment < 1


def test_the_remediation_section_reads_the_shadow_run_and_the_skips(report: Report) -> None:
    """The sample keeps semantic_rollback in shadow mode while v2 regresses, pauses
    freeze_and_replay when the index goes stale, and skips a second reroute over budget."""
    texts = [a.text for a in report.remediation_actions]
    shadow = [t for t in texts if t.startswith("shadow:")]
    assert len(shadow) == 1
    assert re.fullmatch(
        r"shadow: would have rolled back chat v2 at \d{4}-\d\d-\d\d \d\d:\d\d UTC "
        r"\(semantic_rollback\)",
        shadow[0],
    )
    assert any(
        t.startswith("skipped, paused: did not freeze writes to documents and replay the delta "
                     "log onto secondary at ")
        for t in texts
    )  # fmt: skip
    assert any(t.startswith("skipped, over budget: did not reroute traffic away from primary")
               for t in texts)  # fmt: skip
    assert any(t.startswith("succeeded: rerouted traffic away from primary") for t in texts)
    guards = {g.playbook: g.text for g in report.remediation_guards}
    assert guards == {
        "freeze_and_replay": "freeze_and_replay: paused by a human, resumed by the end",
        "semantic_rollback": "semantic_rollback: mode shadow during the period, shadow at the end",
    }
