"""A real Prometheus holding hours of sample series, for the dashboard checks and the README's
picture: the catalog's series backfilled with `promtool tsdb create-blocks-from openmetrics`,
the recording rules backfilled over the same range with `promtool tsdb create-blocks-from
rules`, and the generated rule file loaded so recording and alerting go on live."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from redline.devstack.processes import Service, find_binary, start_prometheus
from redline.devstack.samples.dashboards import build_sample_openmetrics
from redline.rules.build import build_rule_groups
from redline.rules.model import RuleGroup, format_duration
from redline.rules.render import render_rule_file, render_yaml
from redline.slo.spec import Spec


class BackfillError(Exception):
    """promtool could not create the blocks."""


@dataclass
class SamplePrometheus:
    """The running Prometheus and the time range its sample series cover."""

    service: Service
    start: float
    end: float
    rule_file: Path

    def stop(self) -> None:
        """Stop the Prometheus process."""
        self.service.stop()


def build_backfill_groups(spec: Spec, step: float) -> list[list[RuleGroup]]:
    """The recording rules in passes: those over scraped series first, then each rule in the
    pass after the last recording it reads.

    `promtool tsdb create-blocks-from rules` evaluates every rule against the data already in
    Prometheus, never against what it is backfilling, so a recording of a recording needs the
    pass before it loaded first. Engine profiles chain deepest: the version join, the quantiles
    and ratios over the engine's series (which read the join), then what reads those.
    """
    groups = build_rule_groups(spec)
    recorded = {rule.record for group in groups for rule in group.recordings}
    reads: dict[str, set[str]] = {}
    for group in groups:
        for rule in group.recordings:
            # Several rules may record one name (one per SLO): a name waits for all they read.
            reads.setdefault(rule.record, set()).update(
                name
                for name in recorded - {rule.record}
                if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", rule.expr)
            )
    passes: dict[str, int] = {}

    def depth(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name in seen:
            raise BackfillError(f"recording rules read each other in a cycle through {name}")
        if name not in passes:
            inner = [depth(used, seen | {name}) for used in reads[name]]
            passes[name] = 1 + max(inner) if inner else 0
        return passes[name]

    out: list[list[RuleGroup]] = [[] for _ in range(1 + max(map(depth, recorded), default=0))]
    for group in groups:
        for level, batch in enumerate(out):
            rules = tuple(r for r in group.recordings if depth(r.record) == level)
            if rules:
                batch.append(RuleGroup(group.name, step, rules))
    return out


def build_prometheus_config(spec: Spec, rule_file: Path) -> dict[str, object]:
    """A Prometheus config that scrapes itself and evaluates `rule_file` at the spec's pace."""
    timing = spec.timing
    return {
        "global": {
            "scrape_interval": format_duration(timing.scrape_interval_seconds),
            "evaluation_interval": format_duration(timing.evaluation_interval_seconds),
        },
        "rule_files": [str(rule_file)],
    }


def lookback_delta(step: float) -> str:
    """The sample Prometheus' `--query.lookback-delta`: just under one sample step.

    Backfilled blocks carry no staleness markers, so with Prometheus' default 5 m lookback a
    series that ends (the old version's `model_active_info` after a switch) would still be read
    for 5 minutes beside its successor, which a scraped target's staleness marker prevents: the
    version join would then see two active versions of one model and fail. A lookback shorter
    than the step drops an ended series one step later, as a staleness marker does, while every
    instant still finds exactly one sample of a live series (samples are one step apart).
    """
    return f"{max(1, round(step * 1000) - 1)}ms"


def start_sample_prometheus_process(
    workdir: Path, config: Path, step: float, port: int | None = None
) -> Service:
    """`processes.start_prometheus` on `workdir/data` with the lookback of the sample's step
    (`lookback_delta`)."""
    lookback = f"--query.lookback-delta={lookback_delta(step)}"
    return start_prometheus(workdir, config, port, extra_args=(lookback,))


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BackfillError(f"{' '.join(argv[:4])} failed:\n{result.stdout}\n{result.stderr}")


def _move_blocks(source: Path, data: Path) -> None:
    for block in sorted(source.iterdir()):
        if block.is_dir():
            shutil.move(str(block), data / block.name)


def start_sample_prometheus(
    workdir: Path, spec: Spec, hours: float = 3.0, step: float = 30.0, end: float | None = None
) -> SamplePrometheus:
    """Backfill `hours` of sample series ending at `end` (now) and start Prometheus on them."""
    promtool = find_binary("promtool")
    workdir.mkdir(parents=True, exist_ok=True)
    end = float(end if end is not None else time.time() // step * step)
    start = end - hours * 3600
    sample = workdir / "sample.om"
    sample.write_text(build_sample_openmetrics(spec, start, end, step), "utf-8")
    data = workdir / "data"
    _run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(sample), str(data)])
    sample.unlink()
    rule_file = workdir / "redline.rules.yml"
    rule_file.write_text(render_rule_file(build_rule_groups(spec), "sample"), "utf-8")
    config = workdir / "prometheus.yml"
    config.write_text(render_yaml(build_prometheus_config(spec, rule_file), "sample"), "utf-8")
    service = start_sample_prometheus_process(workdir, config, step)
    try:
        for index, groups in enumerate(build_backfill_groups(spec, step)):
            if not groups:
                continue
            rules = workdir / f"backfill-{index}.rules.yml"
            rules.write_text(render_rule_file(groups, "sample"), "utf-8")
            blocks = workdir / f"backfill-{index}"
            _run([
                promtool, "tsdb", "create-blocks-from", "rules", "-q",
                f"--url={service.url}", f"--start={int(start)}", f"--end={int(end)}",
                f"--output-dir={blocks}", str(rules),
            ])  # fmt: skip
            service.stop()
            _move_blocks(blocks, data)
            service = start_sample_prometheus_process(workdir, config, step, port=service.port)
    except BaseException:
        service.stop()
        raise
    return SamplePrometheus(service, start, end, rule_file)


def render_preview(
    workdir: Path, spec: Spec, dashboard_file: Path, out: Path, hours: float = 3.0
) -> list[str]:
    """Draw `dashboard_file` from the sample Prometheus into `out`; return empty panels' titles."""
    import json

    from redline.dashboards.queries import GrafanaContext, variable_queries
    from redline.devstack.dashcheck.preview import fetch_annotation_spans, fetch_panels, render_png
    from redline.platform.prometheus import PrometheusClient

    dashboard = json.loads(dashboard_file.read_text("utf-8"))
    sample = start_sample_prometheus(workdir, spec, hours=hours)
    try:
        with PrometheusClient(sample.service.url, timeout=30) as client:
            values = {
                v.name: client.label_values(v.label, v.match, sample.start, sample.end)
                for v in variable_queries(dashboard)
            }
            context = GrafanaContext(
                sample.start, sample.end, spec.timing.scrape_interval_seconds, values, 240
            )
            panels = fetch_panels(client, dashboard, context)
            annotations = [a for a in dashboard["annotations"]["list"] if "expr" in a]
            spans = fetch_annotation_spans(client, annotations[0]["expr"], context)
    finally:
        sample.stop()
    render_png(dashboard["title"], panels, spans, out)
    return [p.panel["title"] for p in panels if p.panel["type"] != "row" and not p.series]


def main(argv: list[str] | None = None) -> None:
    """`python -m redline.devstack.samples.prometheus DASHBOARD.json OUT.png`: README picture."""
    import argparse
    import tempfile

    from redline.slo.load import load_spec

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dashboard", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="redline-preview-") as tmp:
        empty = render_preview(Path(tmp), load_spec().spec, args.dashboard, args.out)
    print(f"{args.out}: written" + (f"; panels without data: {empty}" if empty else ""))


if __name__ == "__main__":
    main()
