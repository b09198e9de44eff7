"""SLO alert detection, side by side: redline's burn-rate alerts vs Sloth's golden output.

Both rule sets run in one promtool process per scenario, over the same traffic:
(a) Sloth: its getting-started example as Sloth generates it (`bench/data/`, byte for byte: an
    availability SLO of 99.9 % over 30 days on `http_request_duration_seconds_count{job,code}`,
    the workbook's multiwindow page (14.4x over 1h/5m, 6x over 6h/30m) and ticket (3x over
    1d/2h, 1x over 3d/6h));
(b) redline: the default spec's availability SLO (the same objective and period) as
    `build_slo_group` generates it, on the gateway's request and error counters.

Each scenario is good traffic (none, 30 minutes, 6 hours or a day: enough to fill the windows
that decide it, as on a service that has run a while), then a share of requests failing, sampled
and evaluated every 15 s (the spec's scrape and evaluation interval; every minute for the
day-long one, to keep promtool's 3d and 30d windows affordable). Both sides see the same requests
and errors a step, each on its own series: Sloth's `code="200"`/`code="500"` counters, redline's
`llm_requests_total`/`llm_request_errors_total`; both error series exist from the start at 0, as a
server exposes them. An `alert_rule_test` at every evaluation from the fault on expects no alert,
so promtool's failure report lists every evaluation at which an alert fired: the first one per
severity is the detection time, measured from the last good sample.

The scenarios are the ones the SRE workbook's alerting chapter reasons with, plus the two where
the sides disagree by design: an error ratio exactly at the objective (burning the budget at 1x
is what the SLO allows: redline's thresholds are strict, Sloth's float arithmetic puts its 1x
threshold just under 0.001, so it tickets) and a low-traffic service (6 requests an hour, all
failing: fewer than redline's `min_events` of 100 in every window up to 6 h keeps it silent,
Sloth pages on them).

Targets: in every scenario that should alert, redline's page and ticket fire no later than
Sloth's; in every scenario, redline's verdict (fires or silent) is the expected one.

Run: `.venv/bin/python -m bench.slo_detection` (about a minute).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.figures import Figure, MissingDependencyError, at_most, check, exit_code, info
from redline.rules.families.slo import build_slo_group
from redline.rules.promtool_cases import counter, in_phases, request_counters, series
from redline.rules.render import render_rule_file
from redline.slo.load import load_spec
from redline.slo.spec import Slo, Spec

NAME = "slo_detection"
SLOTH_RULES = Path(__file__).parent / "data" / "sloth-getting-started.yml"
SLOTH_ALERT = "MyServiceAvailabilitySLO"
SLOTH_SERIES = "http_request_duration_seconds_count"
SLOTH_LABELS = {"job": "myservice"}
SLO_NAME = "availability"
STEP = 15
"""Seconds between samples and between evaluations (the default spec's intervals)."""
SEVERITIES = ("page", "ticket")
SIDES = ("sloth", "redline")


@dataclass(frozen=True)
class Scenario:
    """`good_minutes` of good traffic, then `bad_share` of the requests failing for
    `bad_minutes`, sampled and evaluated every `step` seconds."""

    name: str
    per_minute: float
    bad_share: float
    good_minutes: int
    bad_minutes: int
    expect: tuple[str, ...]
    """The severities that should fire."""
    step: int = STEP

    @property
    def good_steps(self) -> int:
        """Steps of good traffic before the fault."""
        return self.good_minutes * 60 // self.step

    @property
    def bad_steps(self) -> int:
        """Steps of the fault."""
        return self.bad_minutes * 60 // self.step

    @property
    def fault_at(self) -> int:
        """The last good sample's time, seconds: detection is measured from it."""
        return self.good_steps * self.step


SCENARIOS = (
    Scenario("outage (100 %)", 600, 1.0, 30, 30, ("page", "ticket")),
    # Six hours of history fill the page's longest window, as on a service that has run a while.
    Scenario("fast burn (2 %, 20x)", 600, 0.02, 360, 120, ("page", "ticket")),
    # A day of history; one-minute steps keep promtool's 3d and 30d windows affordable.
    Scenario("slow burn (0.45 %, 4.5x)", 600, 0.0045, 1440, 960, ("ticket",), step=60),
    # Every window holds exactly the objective's error ratio (no history before it), in whole
    # requests: 1 of every 1000 fails.
    Scenario("at the objective (0.1 %, 1x)", 4000, 0.001, 0, 480, ()),
    # Six requests an hour: every window up to 6 h holds fewer than min_events (100).
    Scenario("low traffic (6 req/h, all failing)", 0.1, 1.0, 360, 60, ()),
)


def availability_slo(spec: Spec) -> Slo:
    """The spec's availability SLO (the one Sloth's example also defines)."""
    for slo in spec.slos:
        if slo.name == SLO_NAME:
            return slo
    raise ValueError(f"the spec has no {SLO_NAME!r} SLO")


def sloth_series(scenario: Scenario) -> dict[str, str]:
    """Sloth's series for `scenario`: the request counter by status code."""
    per_step = scenario.per_minute * scenario.step / 60
    ok = series(SLOTH_SERIES, {**SLOTH_LABELS, "code": "200"})
    failed = series(SLOTH_SERIES, {**SLOTH_LABELS, "code": "500"})
    bad = per_step * scenario.bad_share
    return _phases(
        scenario,
        {ok: counter(per_step, scenario.good_steps), failed: counter(0, scenario.good_steps)},
        {ok: counter(per_step - bad, scenario.bad_steps), failed: counter(bad, scenario.bad_steps)},
    )


def redline_series(spec: Spec, scenario: Scenario) -> dict[str, str]:
    """redline's series for `scenario`: the gateway's request and error counters."""
    per_step = scenario.per_minute * scenario.step / 60
    labels = {"region": spec.regions[0], "model": "chat", "model_version": "v1", "status": "200"}
    good = request_counters(spec, labels, per_step, 0, scenario.good_steps)
    errors = per_step * scenario.bad_share
    bad = request_counters(spec, labels, per_step, errors, scenario.bad_steps)
    return _phases(scenario, good, bad)


def _phases(scenario: Scenario, good: dict[str, str], bad: dict[str, str]) -> dict[str, str]:
    if not scenario.good_steps:
        return in_phases((bad, scenario.bad_steps))
    return in_phases((good, scenario.good_steps), (bad, scenario.bad_steps))


def build_test_file(spec: Spec, slo: Slo, scenario: Scenario, rule_files: Sequence[str]) -> str:
    """promtool's test file: both sides' series, an empty expectation at every evaluation."""
    inputs = {**sloth_series(scenario), **redline_series(spec, scenario)}
    end = (scenario.good_steps + scenario.bad_steps) * scenario.step
    tests = [
        {"eval_time": f"{at}s", "alertname": alert, "exp_alerts": []}
        for at in range(scenario.fault_at, end + 1, scenario.step)
        for alert in (SLOTH_ALERT, slo.burn_alert_name)
    ]
    document = {
        "rule_files": list(rule_files),
        "evaluation_interval": f"{scenario.step}s",
        "tests": [
            {
                "interval": f"{scenario.step}s",
                "input_series": [{"series": k, "values": v} for k, v in inputs.items()],
                "alert_rule_test": tests,
            }
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


_DURATION_PART = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_FAILURE = re.compile(r"alertname: (\S+), time: (\S+),")
_LABELS = re.compile(r"Labels:\{(.*)\}")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_promtool_duration(text: str) -> float:
    """Seconds of a Prometheus duration as promtool prints it (`1h2m15s`, `0s`)."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a promtool duration: {text!r}")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def parse_fired(output: str) -> list[tuple[str, float, dict[str, str]]]:
    """Every alert promtool reported firing against an empty expectation: (alert name, eval
    time in seconds, the alert's labels)."""
    fired = []
    current: tuple[str, float] | None = None
    for line in output.splitlines():
        failure = _FAILURE.search(line)
        if failure is not None:
            current = (failure.group(1), parse_promtool_duration(failure.group(2)))
            continue
        labels = _LABELS.search(line)
        if labels is not None and current is not None:
            fired.append((*current, dict(_LABEL.findall(labels.group(1)))))
    return fired


def severity_of(side: str, labels: Mapping[str, str]) -> str:
    """The workbook severity (page or ticket) of a side's alert."""
    return labels.get("sloth_severity" if side == "sloth" else "severity", "")


def first_firing(
    fired: Iterable[tuple[str, float, dict[str, str]]], alerts: Mapping[str, str]
) -> dict[tuple[str, str], float]:
    """The first evaluation at which each (side, severity) fired; `alerts` maps an alert name
    to its side."""
    first: dict[tuple[str, str], float] = {}
    for alert, at, labels in fired:
        side = alerts.get(alert)
        if side is None:
            continue
        key = (side, severity_of(side, labels))
        first[key] = min(at, first.get(key, at))
    return first


@dataclass(frozen=True)
class Detection:
    """One scenario's outcome: seconds from the fault to the first firing, per side and
    severity (absent: silent throughout)."""

    scenario: Scenario
    after: dict[tuple[str, str], float]
    seconds: float


def run_scenario(
    promtool: str, workdir: Path, spec: Spec, slo: Slo, scenario: Scenario, index: int
) -> Detection:
    """promtool over one scenario with both rule sets."""
    directory = workdir / f"scenario-{index}"
    directory.mkdir()
    shutil.copy(SLOTH_RULES, directory / "sloth.yml")
    rendered = render_rule_file([build_slo_group(spec, slo)], "spec.yaml")
    (directory / "redline.yml").write_text(rendered)
    test = build_test_file(spec, slo, scenario, ["sloth.yml", "redline.yml"])
    (directory / "tests.yml").write_text(test)
    began = time.perf_counter()
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yml"],
        cwd=directory, capture_output=True, text=True, check=False,
    )  # fmt: skip
    took = time.perf_counter() - began
    output = done.stdout + done.stderr
    if done.returncode != 0 and (done.returncode != 1 or "FAILED" not in output):
        raise RuntimeError(f"promtool failed on {scenario.name!r}:\n{output[-2000:]}")
    alerts = {SLOTH_ALERT: "sloth", slo.burn_alert_name: "redline"}
    first = first_firing(parse_fired(output), alerts)
    after = {key: at - scenario.fault_at for key, at in first.items()}
    return Detection(scenario, after, took)


def _shown(seconds: float | None) -> str:
    if seconds is None:
        return "silent"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"T+{hours} h {minutes:02d} min" if hours else f"T+{minutes} min {rest:02d} s"


def render_table(detections: Sequence[Detection]) -> str:
    """The side-by-side table, Markdown."""
    lines = [
        "| scenario | should | Sloth page | redline page | Sloth ticket | redline ticket |",
        "|---|---|---|---|---|---|",
    ]
    for d in detections:
        should = " + ".join(d.scenario.expect) or "stay silent"
        cells = [_shown(d.after.get((side, sev))) for sev in SEVERITIES for side in SIDES]
        lines.append(f"| {d.scenario.name} | {should} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detection_figures(detections: Sequence[Detection]) -> list[Figure]:
    """Per scenario: redline's verdict per severity, and its lead over Sloth where both fire."""
    figures: list[Figure] = []
    for d in detections:
        for severity in SEVERITIES:
            ours = d.after.get(("redline", severity))
            theirs = d.after.get(("sloth", severity))
            should = severity in d.scenario.expect
            verdict = "fires" if should else "silent"
            figures.append(
                check(NAME, f"{d.scenario.name}: redline {severity} {verdict}",
                      (ours is not None) == should, verdict)
            )  # fmt: skip
            if should and ours is not None and theirs is not None:
                label = f"{d.scenario.name}: redline {severity} after Sloth's"
                figures.append(at_most(NAME, label, ours - theirs, "s", 0.0))
    return figures


def run(argv: list[str] | None = None) -> list[Figure]:
    """Every scenario, in parallel promtool processes; the table and the figures."""
    del argv  # no options
    promtool = shutil.which("promtool")
    if promtool is None:
        raise MissingDependencyError(
            "promtool not installed (apt-get update && apt-get install -y prometheus)"
        )
    spec = load_spec().spec
    slo = availability_slo(spec)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="redline-bench-slo-detection-") as tmp:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [
                pool.submit(run_scenario, promtool, Path(tmp), spec, slo, scenario, index)
                for index, scenario in enumerate(SCENARIOS)
            ]
            detections = [future.result() for future in futures]
    print(
        f"availability SLO, objective {slo.objective} over {slo.period}; Sloth's golden rules "
        f"({SLOTH_RULES.name}) beside redline's, promtool every {STEP} s; T = the last good "
        "sample\n"
    )
    print(render_table(detections))
    wall = time.perf_counter() - began
    print(f"\nwall time {wall:.0f} s")
    return [*detection_figures(detections), info(NAME, "wall time", wall, "s")]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
