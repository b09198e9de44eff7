"""A deterministic month of platform series with known incidents, for demos, tests and benches.

`build_sample()` makes the series (counters as cumulative totals, gauges, firing `ALERTS`) at a
fixed resolution, `write_openmetrics()` writes them as OpenMetrics text, and `backfill()` turns
that into TSDB blocks with `promtool tsdb create-blocks-from openmetrics`, to be placed in a
Prometheus data directory before Prometheus starts. The injected incidents are kept as plain
data so a test can compute every expected number from them independently of Prometheus.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from redline.devstack.processes import ServiceError, find_binary
from redline.devstack.samples.openmetrics import Family, Series, render_openmetrics
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.catalog import Metric

SAMPLE_START = int(datetime(2025, 3, 1, tzinfo=UTC).timestamp())
SAMPLE_DAYS = 30
SAMPLE_STEP = 60
MINUTE = 60


def ts(text: str) -> int:
    """Epoch seconds of a `YYYY-MM-DDTHH:MM` UTC time."""
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M").replace(tzinfo=UTC).timestamp())


@dataclass(frozen=True)
class InjectedAlert:
    """An alert written as firing from `start` for `seconds` (samples every step)."""

    labels: tuple[tuple[str, str], ...]
    start: int
    seconds: int

    @property
    def name(self) -> str:
        """The alertname."""
        return dict(self.labels)["alertname"]


@dataclass(frozen=True)
class RemediationRun:
    """A playbook run counted at `at`."""

    playbook: str
    outcome: str
    at: int
    seconds: float


@dataclass
class Sample:
    """Every series of the sample: name -> list of (labels, values at each timestamp)."""

    start: int
    step: int
    count: int
    series: dict[str, list[tuple[dict[str, str], np.ndarray]]] = field(default_factory=dict)
    alerts: list[InjectedAlert] = field(default_factory=list)
    runs: list[RemediationRun] = field(default_factory=list)

    @property
    def times(self) -> np.ndarray:
        """Sample timestamps."""
        return self.start + self.step * np.arange(self.count, dtype=np.int64)

    @property
    def end(self) -> int:
        """The last timestamp."""
        return self.start + self.step * (self.count - 1)

    def add(self, name: str | Metric, labels: dict[str, str], values: np.ndarray) -> None:
        """Add one series."""
        self.series.setdefault(str(name), []).append((labels, values))

    def values(self, name: str | Metric, **labels: str) -> np.ndarray:
        """Sum of the series of `name` whose labels include `labels`."""
        picked = [
            v
            for lab, v in self.series[str(name)]
            if all(lab.get(k) == x for k, x in labels.items())
        ]
        if not picked:
            raise KeyError(f"{name}{labels}")
        total: np.ndarray = np.sum(picked, axis=0)
        return total

    def mask(self, start: int, seconds: int) -> np.ndarray:
        """True at the timestamps in [start, start + seconds)."""
        t = self.times
        return (t >= start) & (t < start + seconds)


LATENCY = (ts("2025-03-03T10:00"), 45 * MINUTE)  # 40 % of primary's requests slower than 0.8 s
LATENCY_PREVIOUS_WEEK = (ts("2025-03-18T09:00"), 20 * MINUTE)  # 5 % slow in both regions
ERRORS = (ts("2025-03-12T14:30"), 40 * MINUTE)  # 5 % errors
STALENESS = (ts("2025-03-20T02:00"), 25 * MINUTE)  # replica 30 s behind
KEEPALIVE = (ts("2025-03-08T16:00"), 10 * MINUTE)  # context TTL falls to 120 s
SESSION_RPO = (ts("2025-03-25T08:00"), 5 * MINUTE)  # CDC 7 s behind
LORA_STALL = (ts("2025-03-15T12:00"), 10 * MINUTE)  # no checkpoint
DRIFT = (ts("2025-03-27T00:00"), 3 * 3600)  # MMD score 0.03 over a 0.01 threshold
PROBE_DOWN = (ts("2025-03-05T07:00"), 5 * MINUTE)  # secondary healthz failing
REGRESSION = (ts("2025-03-10T10:00"), 30 * MINUTE)  # chat v2 regressed; rollback in shadow mode
DIVERGENCE = (ts("2025-03-22T06:00"), 6 * 3600)  # secondary's canary answers differ from primary's
SIMILARITY_DIVERGED = 0.62  # the embedding similarity of the answers meanwhile
AGREEMENT_DIVERGED = 0.25  # and the share of identical answers

BUCKETS = ("0.4", "0.8", "1.5", "+Inf")
REGIONS = ("primary", "secondary")


def _alert(start: int, seconds: int, **labels: str) -> InjectedAlert:
    return InjectedAlert(tuple(sorted({"alertstate": "firing", **labels}.items())), start, seconds)


def build_sample(
    start: int = SAMPLE_START, days: int = SAMPLE_DAYS, step: int = SAMPLE_STEP, seed: int = 7
) -> Sample:
    """The sample month: steady traffic with small noise and the incidents above."""
    rng = np.random.default_rng(seed)
    count = days * 86400 // step + 1
    sample = Sample(start, step, count)
    per_step = step / MINUTE
    for region in REGIONS:
        requests = np.round(rng.integers(270, 331, count) * per_step).astype(np.int64)
        requests[0] = 0
        slow = rng.binomial(requests, 0.001)
        errors = rng.binomial(requests, 0.0002)
        if region == "primary":
            m = sample.mask(*LATENCY)
            slow[m] = np.round(requests[m] * 0.4).astype(np.int64)
        m = sample.mask(*LATENCY_PREVIOUS_WEEK)
        slow[m] = np.round(requests[m] * 0.05).astype(np.int64)
        m = sample.mask(*ERRORS)
        errors[m] = np.round(requests[m] * 0.05).astype(np.int64)
        # A counter's value at t counts the requests of (t - step, t].
        fast = requests - slow
        le04 = np.round(fast * 0.8).astype(np.int64)
        cum = {
            "0.4": np.cumsum(le04),
            "0.8": np.cumsum(fast),
            "1.5": np.cumsum(fast + np.round(slow * 0.9).astype(np.int64)),
            "+Inf": np.cumsum(requests),
        }
        for le in BUCKETS:
            sample.add(
                catalog.LLM_REQUEST_DURATION_SECONDS.bucket, {"region": region, "le": le}, cum[le]
            )
        sample.add(catalog.LLM_REQUEST_DURATION_SECONDS.count, {"region": region}, cum["+Inf"])
        sample.add(
            catalog.LLM_REQUEST_DURATION_SECONDS.sum,
            {"region": region},
            np.cumsum(le04 * 0.25 + (fast - le04) * 0.6 + slow * 1.2),
        )
        sample.add(catalog.LLM_REQUESTS_TOTAL, {"region": region}, np.cumsum(requests))
        sample.add(catalog.LLM_REQUEST_ERRORS_TOTAL, {"region": region}, np.cumsum(errors))
        for probe in ("healthz", "chat_dry_run"):
            ok = np.ones(count)
            if region == "secondary" and probe == "healthz":
                ok[sample.mask(*PROBE_DOWN)] = 0
            sample.add(catalog.LLM_PROBE_SUCCESS, {"region": region, "probe": probe}, ok)

    staleness = rng.uniform(0.5, 3.0, count)
    staleness[sample.mask(*STALENESS)] = 30.0
    sample.add(
        catalog.VECTORDB_INDEX_STALENESS_SECONDS,
        {"collection": "documents", "replica": "secondary"},
        staleness,
    )
    sample.add(
        catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS,
        {"collection": "documents"},
        rng.uniform(0.0, 4.0, count),
    )
    cdc = rng.uniform(0.05, 0.8, count)
    cdc[sample.mask(*SESSION_RPO)] = 7.0
    sample.add(catalog.SESSION_CDC_RPO_SECONDS, {"stream": "sessions", "group": "replica"}, cdc)
    ttl = np.full(count, 600.0)
    ttl[sample.mask(*KEEPALIVE)] = 120.0
    sample.add(catalog.SESSION_CONTEXT_TTL_SECONDS, {}, ttl)
    sample.add(catalog.SESSION_KEEPALIVE_PROBE_SUCCESS, {}, np.ones(count))
    sample.add(catalog.SESSION_CONTEXT_EVICTED_TOTAL, {}, np.zeros(count))
    # A checkpoint every step, 20 s before the sample; none while stalled.
    times = sample.times.astype(np.float64)
    checkpoint = times - 20
    stall = sample.mask(*LORA_STALL)
    checkpoint[stall] = LORA_STALL[0] - 20
    sample.add(
        catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS,
        {"adapter": "support-bot"},
        checkpoint,
    )
    drift = rng.uniform(0.001, 0.006, count)
    drift[sample.mask(*DRIFT)] = 0.03
    labels = {"collection": "documents", "method": "mmd"}
    sample.add(catalog.EMBEDDING_DRIFT_SCORE, labels, drift)
    sample.add(catalog.EMBEDDING_DRIFT_THRESHOLD, labels, np.full(count, 0.01))
    sample.add(
        catalog.LLM_EVAL_REQUESTS_TOTAL,
        {"model": "chat", "model_version": "v7"},
        np.cumsum(np.full(count, 10)),
    )
    # Drains happened (recoverable interruptions, resumed elsewhere) and none failed a client.
    interrupted = np.cumsum(rng.poisson(0.01, count).astype(float))
    sample.add(catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL, {"recoverable": "true"}, interrupted)
    sample.add(
        catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL, {"recoverable": "false"}, np.zeros(count)
    )

    add_cross_region(sample, seed)

    sample.runs = [
        RemediationRun("reroute", "succeeded", LATENCY[0] + 3 * MINUTE, 12.0),
        # The latency alert flapped: the second reroute within the hour is over budget.
        RemediationRun("reroute", "over_budget", LATENCY[0] + 20 * MINUTE, 0.0),
        RemediationRun("reroute", "failed", LATENCY_PREVIOUS_WEEK[0] + 5 * MINUTE, 30.0),
        RemediationRun("freeze_and_replay", "succeeded", STALENESS[0] + 2 * MINUTE, 95.0),
        # semantic_rollback in shadow mode: planned and checked, nothing changed.
        RemediationRun("semantic_rollback", "shadow", REGRESSION[0] + 2 * MINUTE, 3.0),
    ]
    for playbook, outcome in sorted({(r.playbook, r.outcome) for r in sample.runs}):
        counts = np.zeros(count)
        for run in sample.runs:
            if (run.playbook, run.outcome) == (playbook, outcome):
                counts[sample.times >= run.at] += 1
        sample.add(
            catalog.REDLINE_REMEDIATION_RUNS_TOTAL,
            {"playbook": playbook, "outcome": outcome},
            counts,
        )
    for playbook in sorted({r.playbook for r in sample.runs}):
        total = np.zeros(count)
        seconds = np.zeros(count)
        for run in sample.runs:
            if (
                run.playbook == playbook and run.outcome not in catalog.SKIP_OUTCOMES
            ):  # skips: no time
                total[sample.times >= run.at] += 1
                seconds[sample.times >= run.at] += run.seconds
        sample.add(
            catalog.REDLINE_REMEDIATION_DURATION_SECONDS.count, {"playbook": playbook}, total
        )
        sample.add(
            catalog.REDLINE_REMEDIATION_DURATION_SECONDS.sum, {"playbook": playbook}, seconds
        )

    sample.alerts = [
        _alert(LATENCY[0] + 2 * MINUTE, 47 * MINUTE, alertname=Alert.RED_LINE_LATENCY_P99,
               severity="critical", red_line="latency_p99", region="primary", playbook="reroute"),
        _alert(LATENCY[0] + 5 * MINUTE, 85 * MINUTE, alertname="LatencyErrorBudgetBurn",
               severity="page", slo="latency"),
        _alert(ERRORS[0] + 3 * MINUTE, 67 * MINUTE, alertname="AvailabilityErrorBudgetBurn",
               severity="page", slo="availability"),
        _alert(KEEPALIVE[0] + MINUTE, 9 * MINUTE, alertname=Alert.RED_LINE_CONTEXT_KEEPALIVE,
               severity="critical", red_line="context_keepalive"),
        _alert(LORA_STALL[0] + 2 * MINUTE, 9 * MINUTE, alertname=Alert.LORA_CHECKPOINT_RPO_BREACH,
               severity="critical", rpo="lora_adapter", adapter="support-bot"),
        _alert(STALENESS[0] + MINUTE, 24 * MINUTE, alertname=Alert.RED_LINE_INDEX_STALENESS,
               severity="critical", red_line="index_consistency", collection="documents",
               replica="secondary", playbook="freeze_and_replay"),
        _alert(SESSION_RPO[0], 5 * MINUTE, alertname=Alert.SESSION_RPO_BREACH, severity="critical",
               rpo="session_state", stream="sessions", group="replica"),
        _alert(DRIFT[0] + 5 * MINUTE, 175 * MINUTE, alertname=Alert.EMBEDDING_DRIFT,
               severity="warning", collection="documents", method="mmd"),
        _alert(REGRESSION[0], REGRESSION[1], alertname=Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL,
               severity="critical", model="chat", model_version="v2",
               playbook="semantic_rollback"),
    ]  # fmt: skip
    # The receiver's guard gauges: semantic_rollback in shadow mode all month, nothing paused.
    for playbook in sorted({r.playbook for r in sample.runs}):
        current = "shadow" if playbook == "semantic_rollback" else "act"
        for mode in catalog.REMEDIATION_MODES:
            sample.add(
                catalog.REDLINE_REMEDIATION_MODE,
                {"playbook": playbook, catalog.REDLINE_REMEDIATION_MODE.labels[1]: mode},
                np.full(count, float(mode == current)),
            )
        sample.add(catalog.REDLINE_REMEDIATION_PAUSED, {"playbook": playbook}, np.zeros(count))
        sample.add(
            catalog.REDLINE_REMEDIATION_BREAKER_OPEN, {"playbook": playbook}, np.zeros(count)
        )
    return sample


def add_cross_region(sample: Sample, seed: int = 7) -> None:
    """The consistency probe's gauges for model chat, secondary against primary: answers
    nearly always identical, and diverging during DIVERGENCE."""
    # A generator of its own, so the other series keep the values they always had.
    rng = np.random.default_rng(seed + 1)
    labels = {catalog.LABEL_MODEL: "chat", catalog.LABEL_REGION: "secondary"}
    similarity = rng.uniform(0.995, 1.0, sample.count)
    agreement = np.where(similarity > 0.9975, 1.0, 11 / 12)
    diverged = sample.mask(*DIVERGENCE)
    similarity[diverged] = SIMILARITY_DIVERGED
    agreement[diverged] = AGREEMENT_DIVERGED
    sample.add(catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY, labels, similarity)
    sample.add(catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN, labels, similarity - 0.01)
    sample.add(catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO, labels, agreement)


def _points(times: list[int], values: np.ndarray) -> Iterator[tuple[float, float]]:
    # A generator, so a series' values become Python numbers only while it is written.
    yield from zip(times, values.tolist(), strict=True)


def build_families(sample: Sample) -> Iterator[Family]:
    """The sample's series and firing `ALERTS` as untyped OpenMetrics families."""
    times = sample.times.tolist()
    for name, entries in sample.series.items():
        series = (
            Series(name, labels.items(), _points(times, values)) for labels, values in entries
        )
        yield Family(name, None, series)
    alerts = (
        Series(
            "ALERTS",
            alert.labels,
            ((t, 1) for t in range(alert.start, alert.start + alert.seconds, sample.step)),
        )
        for alert in sample.alerts
    )
    yield Family("ALERTS", None, alerts)


def write_openmetrics(sample: Sample, path: Path) -> Path:
    """Write the sample as an OpenMetrics file."""
    with path.open("w", encoding="utf-8") as out:
        for chunk in render_openmetrics(build_families(sample)):
            out.write(chunk)
    return path


def backfill(openmetrics: Path, data_dir: Path, timeout: float = 120.0) -> None:
    """Create TSDB blocks from an OpenMetrics file into a (stopped) Prometheus data dir."""
    promtool = find_binary("promtool")
    data_dir.mkdir(parents=True, exist_ok=True)
    # Large blocks: with the default 2 h blocks promtool rereads the input once per block.
    argv = [
        promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet",
        "--max-block-duration=1458h", str(openmetrics), str(data_dir),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ServiceError(f"promtool backfill failed ({done.returncode}): {done.stderr[-2000:]}")


EXAMPLE_FILES = ("slo-report.md", "slo-report.html", "report.schema.json", "slo-report-page-1.png")
"""What `docs/report-example/` holds."""
EXAMPLE_PROMETHEUS = "http://127.0.0.1:9090"
EXAMPLE_SPEC = "slo/specs/default.yaml"
EXAMPLE_GENERATED = datetime(2025, 3, 31, 0, 5, tzinfo=UTC)
"""The example's Prometheus address, spec and generation time as printed: fixed, so the example
changes only when the report does (the Prometheus it reads runs on a free port)."""
PAGE_DPI = 50


def write_example(out: Path, workdir: Path, png: bool = True) -> list[Path]:
    """The docs' example report of the sample month: Markdown, HTML, the JSON Schema and the
    PDF's first page as a PNG (headless Chromium and pdftoppm), from a real Prometheus holding
    the backfilled sample."""
    from redline.devstack.processes import start_prometheus
    from redline.reporting.pdf import write_pdf
    from redline.reporting.render.tables import render_schema
    from redline.reporting.run import generate_report
    from redline.reporting.write import BASENAME, write_report, write_text
    from redline.slo.load import load_spec
    from redline.slo.report import Window

    sample = build_sample()
    source = write_openmetrics(sample, workdir / "sample.om")
    backfill(source, workdir / "data")
    source.unlink()
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n", encoding="utf-8")
    service = start_prometheus(workdir, config)
    try:
        window = Window(sample.start, sample.start + SAMPLE_DAYS * 86400)
        generated = generate_report(
            service.url, load_spec(None).spec, EXAMPLE_SPEC, window, now=EXAMPLE_GENERATED
        )
    finally:
        service.stop()
    report = generated.report.model_copy(update={"prometheus": EXAMPLE_PROMETHEUS})
    written = write_report(report, out, ["md", "html"])
    written.append(write_text(out / "report.schema.json", render_schema()))
    if png:
        pdf = write_pdf(out / f"{BASENAME}.html", workdir / f"{BASENAME}.pdf")
        prefix = workdir / "page"
        argv = [
            "pdftoppm",
            "-png",
            "-r",
            str(PAGE_DPI),
            "-f",
            "1",
            "-l",
            "1",
            str(pdf),
            str(prefix),
        ]
        subprocess.run(argv, check=True, timeout=120, capture_output=True)
        page = out / EXAMPLE_FILES[-1]
        next(workdir.glob("page*.png")).replace(page)
        page.chmod(0o644)
        written.append(page)
    return written


def main(argv: list[str] | None = None) -> None:
    """`python -m redline.devstack.samples.report docs/report-example`: the docs' example."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--no-png", action="store_true", help="skip the PDF page (no Chromium)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="redline-example-") as tmp:
        for path in write_example(args.out, Path(tmp), png=not args.no_png):
            print(f"{path}: written")


if __name__ == "__main__":
    main()
