"""Every drill against the session's stack: each loop closes, nothing is lost, timings recorded.

The drills run once, in `redline drill all` order, on the stack the session started with the real
binaries; each test asserts one drill's result. The timings go to the artifact
`.redline/artifacts/drills.json` (override with REDLINE_DRILLS_ARTIFACT).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from redline.devstack.drills.base import DrillResult
from redline.devstack.drills.registry import DRILL_ORDER
from redline.devstack.drills.run import run_drills
from redline.devstack.layout import StackLayout
from redline.devstack.report import render_json, write_json
from redline.devstack.state import load_running
from redline.gameday.audit import FileAudit
from redline.gameday.observe import Observer
from redline.gameday.plan import Safety, build_gameday_plan
from redline.gameday.report import GamedayResult
from redline.gameday.run import run_gameday
from redline.generate.chaos import ChaosOptions
from redline.platform.prometheus import PrometheusClient
from tests.support.stack import RunningStack, redline

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
# Only annotations of events the drills do not cause: the SLO burn-rate alerts need minutes of
# errors, and no playbook runs in shadow mode in the local stack.
QUIET_ANNOTATIONS = {
    "error-budgets.json annotation 'Burn-rate alerts'",
    "remediation.json annotation 'Shadow runs'",
    # QuotaThrottlingSustained needs 10 min of throttling; the quota drill's burst is seconds.
    "quotas.json annotation 'Quota alerts'",
    "quotas.json annotation 'Remediation runs'",
}
ARTIFACT = Path(
    os.environ.get("REDLINE_DRILLS_ARTIFACT", REPO / ".redline" / "artifacts" / "drills.json")
)


GAMEDAY_DRILL = "latency"
"""The drill a game day measures beside it (`redline gameday`'s loop, on the user's services:
here the stack's Prometheus, Alertmanager and receiver)."""


@dataclass
class GamedayBeside:
    """`run_gameday` in a thread, by hand (no experiment applied): its fault is the drill's,
    confirmed when the drill says it injected it."""

    stack: RunningStack
    injected: threading.Event = field(default_factory=threading.Event)
    result: GamedayResult | None = None
    failure: Exception | None = None
    thread: threading.Thread | None = None

    def start(self, tmp: Path) -> None:
        state = load_running(self.stack.run_dir)
        spec = state.load_spec()
        endpoints = state.endpoints()
        plan = build_gameday_plan(
            spec, GAMEDAY_DRILL, ChaosOptions(), Safety("redline", 600, abort_error_ratio=0.99)
        )
        token = StackLayout(self.stack.run_dir).token_file.read_text("utf-8").strip()
        observer = Observer(PrometheusClient(endpoints.prometheus_url), endpoints.alertmanager_url,
                            endpoints.receiver_url, token)  # fmt: skip

        def confirm() -> None:
            if not self.injected.wait(timeout=900):
                raise TimeoutError(f"the {GAMEDAY_DRILL} drill never injected its fault")

        def run() -> None:
            try:
                audit = FileAudit(tmp / "gameday.jsonl")
                self.result = run_gameday(
                    plan, observer, audit, confirm=confirm, poll_seconds=0.25, say=lambda _: None
                )
            except Exception as exc:  # reported by the test, not lost with the thread
                self.failure = exc
            finally:
                observer.close()

        self.thread = threading.Thread(target=run, name="gameday", daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.injected.set()  # a drill run that ended early must not leave the thread waiting
        if self.thread is not None:
            self.thread.join(timeout=900)


@dataclass(frozen=True)
class DrillRun:
    results: dict[str, DrillResult]
    gameday: GamedayBeside


@pytest.fixture(scope="module")
def drill_run(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> DrillRun:
    """Run every drill once, a game day measuring one of them; write the artifact."""
    state = load_running(stack.run_dir)
    started = time.monotonic()
    gameday = GamedayBeside(stack)

    def progress(drill: str, message: str) -> None:
        if drill == GAMEDAY_DRILL and message.startswith("fault injected"):
            gameday.injected.set()
        if not message.startswith("waiting for"):
            print(f"[{time.monotonic() - started:6.1f} s] [{drill}] {message}", flush=True)

    gameday.start(tmp_path_factory.mktemp("gameday"))
    try:
        results = run_drills(["all"], state, state.load_spec(), progress)
    finally:
        gameday.join()
    extra = {
        "run_dir": str(stack.run_dir),
        "rate": state.rate,
        "up_seconds": round(stack.up_seconds, 1),
        "drills_seconds": round(time.monotonic() - started, 1),
    }
    write_json(ARTIFACT, render_json(results, extra))
    return DrillRun({result.drill: result for result in results}, gameday)


@pytest.fixture(scope="module")
def drills(drill_run: DrillRun) -> dict[str, DrillResult]:
    """Every drill's result by name."""
    return drill_run.results


def _explain(result: DrillResult) -> str:
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    return f"{result.drill}: error={result.error} failed checks={failed} {result.as_dict()}"


@pytest.mark.parametrize("name", DRILL_ORDER)
def test_the_drill_loop_closes_within_budget(drills: dict[str, DrillResult], name: str) -> None:
    result = drills[name]
    assert result.error is None, _explain(result)
    assert all(check.ok for check in result.checks), _explain(result)
    if not result.expect_alert:
        assert result.firing_at is None, _explain(result)
        return
    fault = result.fault_at
    assert fault is not None
    detected, notified, recovered = result.firing_at, result.notified_at, result.recovered_at
    assert detected is not None and notified is not None and recovered is not None, _explain(result)
    # Detection is polled (0.1 s), so the webhook may be stamped a moment before it.
    assert fault < detected < recovered and fault < notified < recovered, _explain(result)
    if result.playbook is not None:
        started, remediated = result.playbook_started_at, result.remediated_at
        assert started is not None and remediated is not None, _explain(result)
        assert notified <= started <= remediated, _explain(result)
    assert result.within_budget, _explain(result)
    assert result.ok, _explain(result)


@pytest.mark.parametrize("name", ["staleness", "session-rpo"])
def test_no_acknowledged_write_is_lost(drills: dict[str, DrillResult], name: str) -> None:
    result = drills[name]
    assert result.lost == 0, _explain(result)
    written = int(result.lost_detail.split()[0])
    assert written > 10, result.lost_detail


@pytest.mark.parametrize("name", DRILL_ORDER)
def test_users_see_no_failed_request(drills: dict[str, DrillResult], name: str) -> None:
    result = drills[name]
    assert result.failed_requests == 0, f"{result.failed_detail} {_explain(result)}"


def test_the_partition_converges_with_every_acknowledged_message(
    drills: dict[str, DrillResult],
) -> None:
    result = drills["partition"]
    assert result.lost == 0, _explain(result)
    assert int(result.lost_detail.split()[0]) > 50, result.lost_detail
    checks = {c.name: c for c in result.checks}
    assert checks["both regions hold identical states"].ok, _explain(result)
    assert checks["states equal the CRDT merge of every acknowledged operation"].ok
    figures = {f.label: f.value for f in result.figures}
    converged = figures["convergence after heal"]
    assert isinstance(converged, float) and converged < 10.0, _explain(result)
    assert (figures["divergent sessions before the heal"] or 0) >= 1, _explain(result)


def test_a_mutated_canary_is_flagged_and_a_reformatted_one_is_not(
    drills: dict[str, DrillResult],
) -> None:
    result = drills["mutation"]
    checks = {c.name: c for c in result.checks}
    assert checks["the alert carries the diff"].ok, _explain(result)
    assert checks["flagged as a rollback candidate"].ok, _explain(result)
    assert checks["a reformatted answer is no mutation"].ok, _explain(result)


def test_a_batch_burst_is_throttled_and_downgraded_while_interactive_chat_is_unaffected(
    drills: dict[str, DrillResult],
) -> None:
    """Tenant `batch`'s long summarisation burst meets its 2000 tokens/min quota: beyond it the
    base model's requests get 429 with Retry-After and the adapter's are served by the base
    model, each counted by the gateway as the client saw it; tenant `interactive`'s chat all
    succeeds with its client-side P99 under the latency red line."""
    result = drills["quota"]
    assert result.not_applicable is None, _explain(result)
    checks = {check.name: check for check in result.checks}
    for name in (
        "redline-base: the batch burst is throttled (429 with Retry-After)",
        "chat-lora: the batch burst is downgraded to the lighter model",
        "counted in the quota series",
        "every interactive request succeeds",
        "interactive client P99 under the red line",
        "the interactive tenant is counted as admitted",
    ):
        assert checks[name].ok, f"{name}: {checks[name].detail}"
    figures = {figure.label: figure.value for figure in result.figures}
    assert (figures["batch throttled"] or 0) > 0 and (figures["batch downgraded"] or 0) > 0
    assert (figures["batch admitted"] or 0) > 0, _explain(result)
    p99 = figures["interactive P99"]
    assert isinstance(p99, float) and 0 < p99 < 0.8, _explain(result)
    assert result.failed_requests == 0, result.failed_detail


def test_each_playbook_did_its_job(drills: dict[str, DrillResult]) -> None:
    checks = {(r.drill, c.name): c for r in drills.values() for c in r.checks}
    assert checks[("latency", "gateway routes to the secondary")].ok
    assert checks[("latency", "P99 via secondary under the red line")].ok
    assert checks[("latency", "routing restored after the hold-down")].ok
    assert checks[("staleness", "writes unfrozen after the verified replay")].ok
    assert checks[("regression", "v1 active again")].ok
    assert checks[("regression", "every region serves v1")].ok
    assert checks[("regression-negative", "gate stays quiet")].ok
    assert checks[("regression-negative", "latency signal on, with enough traffic")].ok
    assert checks[("exporter-down", "every SLI of the exporter is reported absent")].ok
    assert checks[("latency-persistent", "the restore waits while primary is slow")].ok


def test_the_rollback_switches_every_pod_with_no_failed_user_request(
    drills: dict[str, DrillResult],
) -> None:
    """Two simulator pods per region behind each region's service front: the rollback acts on
    every pod, and the load generator's requests (through the gateway and the fronts) do not
    fail while it switches; every pod, asked directly, serves v1 afterwards."""
    result = drills["regression"]
    figures = {figure.label: figure for figure in result.figures}
    switch = figures["failed requests during the switch:"]
    assert switch.value == 0, _explain(result)
    assert switch.text() == "failed requests during the switch: 0"
    pods = figures["pods:"]
    assert pods.text() == "pods: 4 (2 per region) serve v1", _explain(result)
    checks = {check.name: check for check in result.checks}
    for name in (
        "no failed user request during the switch",
        "every pod serves v1",
        "the rollback verified every pod",
    ):
        assert checks[name].ok, f"{name}: {checks[name].detail}"


def test_latency_persistent_holds_the_reroute_and_restores_once(
    drills: dict[str, DrillResult],
) -> None:
    """The primary stays slow for several restore periods after the reroute: zero flips back to
    it, exactly one restore after the repair (no sooner than the restore period, within its
    bound), and the P99 users see, reroute included, under the red line outside detection."""
    result = drills["latency-persistent"]
    assert result.not_applicable is None, _explain(result)
    figures = {figure.label: figure.value for figure in result.figures}
    assert figures["flips while slow"] == 0, _explain(result)
    assert figures["restores after repair"] == 1, _explain(result)
    checks = {check.name: check for check in result.checks}
    for name in (
        "no flip back to primary while it is slow",
        "one reroute",
        "one reroute job",
        "one restore after the repair",
        "no client request served by the slow primary after the reroute",
        "client P99 under the red line outside detection",
        "recorded P99 under the red line outside detection",
    ):
        assert checks[name].ok, f"{name}: {checks[name].detail}"
    restored = [c for c in result.checks if c.name.startswith("restored within")]
    assert len(restored) == 1 and restored[0].ok, restored
    worst = figures["max recorded P99 outside detection"]
    assert worst is not None and worst <= 0.8, _explain(result)
    assert result.failed_requests == 0, result.failed_detail


def test_the_breaker_opens_within_its_window_and_closes_after_the_probes(
    drills: dict[str, DrillResult],
) -> None:
    """The primary fails 30 %: its breaker opens within the (local) window, the failed attempts
    at the primary drop to the probes, the probes close it after the repair, clients see no
    error and GatewayBreakerOpen stays quiet."""
    result = drills["breaker"]
    assert result.not_applicable is None, _explain(result)
    checks = {check.name: check for check in result.checks}
    for name in (
        "the breaker opens within its window",
        "failed attempts at the primary drop once open",
        "the breaker closes after the half-open probes",
        "the breaker stays closed",
        "GatewayBreakerOpen does not fire",
    ):
        assert checks[name].ok, f"{name}: {checks[name].detail}"
    figures = {figure.label: figure.value for figure in result.figures}
    to_open = figures["time to open"]
    assert isinstance(to_open, float) and 0 < to_open <= 11.0, _explain(result)
    assert figures["errors clients saw"] == 0, _explain(result)
    assert result.failed_requests == 0, result.failed_detail


def test_the_artifact_holds_every_drills_timings(drills: dict[str, DrillResult]) -> None:
    data = json.loads(ARTIFACT.read_text())
    assert [d["drill"] for d in data["drills"]] == list(DRILL_ORDER)
    for entry in data["drills"]:
        for key in ("time_to_detect", "time_to_notify", "time_to_remediate", "time_to_recover",
                    "lost", "pipeline_budget_plus_2s", "within_budget"):  # fmt: skip
            assert key in entry
    assert data["ok"] is all(r.ok for r in drills.values())


def test_every_dashboard_query_returns_data_from_the_live_stack(
    stack: RunningStack, drills: dict[str, DrillResult], tmp_path: Path
) -> None:
    """After the drills (alerts fired, playbooks ran, a version switched back), every panel and
    annotation query of the dashboards `redline up` wrote for the local profile returns data from
    the stack's global Prometheus, run by `redline dashboards check`. The spot dashboard's
    series come from the spot drills' own fleet (checked in tests/integration)."""
    layout = StackLayout(stack.run_dir)
    for path in layout.dashboards_dir.glob("*.json"):
        if path.name != "spot.json":
            shutil.copy(path, tmp_path / path.name)
    state = load_running(stack.run_dir)
    last = max(60.0, time.time() - state.started_at)
    check = redline(
        "dashboards", "check", "--prometheus", state.endpoints().prometheus_url,
        "--dir", str(tmp_path), "--profile", "local", "--last", f"{last:.0f}",
        timeout=300.0,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    *lines, summary = check.stdout.strip().splitlines()
    returned, total = (int(word) for word in summary.split()[:3:2])
    assert total > 80 and returned >= total - len(QUIET_ANNOTATIONS), summary
    # Only an annotation whose events the drills do not cause may find none: the SLO burn-rate
    # alerts need minutes of errors; every red line, RPO and rollback alert fired.
    quiet = {line.split(maxsplit=5)[5] for line in lines if line.startswith("none")}
    assert quiet <= QUIET_ANNOTATIONS, check.stdout
    assert not [line for line in lines if not line.startswith(("ok", "none"))], check.stdout


def test_at_night_a_trickle_of_slow_requests_pages_a_human_and_reroutes_nothing(
    drills: dict[str, DrillResult],
) -> None:
    """Fewer requests in the red line's window than min_requests: the P99 over them is their
    slowest, so the red line and its reroute stay silent; enough slow ones page a human."""
    result = drills["latency-night"]
    assert result.not_applicable is None, _explain(result)
    checks = {check.name: check for check in result.checks}
    for name in (
        "4 slow requests in 30s page nobody",
        "the P99 red line never fired on too few requests",
        "no reroute",
        "a human is paged (acknowledged, no playbook)",
    ):
        assert checks[name].ok, f"{name}: {checks[name].detail}"
    assert result.failed_requests == 0, result.failed_detail


def test_a_game_day_beside_the_drill_measures_its_loop_within_a_scrape_interval(
    drill_run: DrillRun, stack: RunningStack
) -> None:
    """`redline gameday`'s measurement, from Prometheus, Alertmanager and the receiver alone,
    agrees with what the drill measured from inside the stack, step by step."""
    drill = drill_run.results[GAMEDAY_DRILL]
    gameday = drill_run.gameday
    assert gameday.failure is None, repr(gameday.failure)
    assert gameday.result is not None and gameday.result.error is None, gameday.result
    timeline = gameday.result.timeline
    scrape = load_running(stack.run_dir).load_spec().timing.scrape_interval_seconds
    steps = {
        "detect": (drill.firing_at, timeline.firing_at),
        "notify": (drill.notified_at, timeline.notified_at),
        "playbook start": (drill.playbook_started_at, timeline.playbook_started_at),
        "remediate": (drill.remediated_at, timeline.remediated_at),
        "recover": (drill.recovered_at, timeline.recovered_at),
    }
    for step, (ours, theirs) in steps.items():
        assert ours is not None and theirs is not None, (step, _explain(drill), timeline)
        assert abs(theirs - ours) <= scrape, (step, theirs - ours, _explain(drill), timeline)
    assert timeline.job_id == drill.job_id, (timeline.job_id, drill.job_id)
