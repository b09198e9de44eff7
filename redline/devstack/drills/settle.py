"""Before a fault: wait for the stack to settle, within a bound, and say why when it does not.

A drill starts from a quiet stack: its alert inactive. Right after another drill, or on a machine
busy with other work, the stack's own signals may still be over a line (the P99 over a loaded
machine's queueing delays, say). The drill then waits for as long as the alert's own evidence
takes to clear — its window, its `for`, the pipeline, twice over — and, when it still holds,
fails with what it found: the alert's own figure, the machine's load, the parts using the most
CPU and how long the stack's HTTP parts take to answer a health check.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from redline.devstack.drills.base import DrillError
from redline.devstack.drills.context import DrillContext
from redline.devstack.parts import health_path
from redline.devstack.state import PartState
from redline.rules.records import p99_record, window_requests_record
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

MIN_SETTLE_SECONDS = 90.0
"""The shortest wait for a quiet stack (the default before this module measured nothing)."""
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def evidence_seconds(spec: Spec, alert: str) -> float:
    """How long the evidence of `alert` lasts once its cause is gone: the window it is computed
    over (the latency red line's P99 window, the rollback gate's window) plus its `for`."""
    red = spec.red_lines
    if alert == Alert.RED_LINE_LATENCY_P99:
        return parse_duration(red.latency_p99.window) + red.latency_p99.for_seconds
    if alert == Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL:
        return spec.rollback.window_seconds + spec.rollback.for_seconds
    return 0.0


def settle_seconds(spec: Spec, alert: str, pipeline_seconds: float) -> float:
    """The bound of the wait for `alert` to be inactive before a fault: twice its evidence and
    the pipeline, at least MIN_SETTLE_SECONDS."""
    return max(MIN_SETTLE_SECONDS, 2 * (evidence_seconds(spec, alert) + pipeline_seconds))


@dataclass(frozen=True)
class PartLoad:
    """A part's share of one core over the sample."""

    name: str
    cpu: float


def _cpu_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def sample_part_load(parts: Sequence[PartState], seconds: float = 1.0) -> list[PartLoad]:
    """Each part's CPU over `seconds` (1.0 = one core), busiest first."""
    before = {part.name: _cpu_ticks(part.pid) for part in parts}
    time.sleep(seconds)
    loads = []
    for part in parts:
        start, end = before.get(part.name), _cpu_ticks(part.pid)
        if start is not None and end is not None:
            loads.append(PartLoad(part.name, (end - start) / _CLK_TCK / seconds))
    return sorted(loads, key=lambda load: -load.cpu)


def time_health(parts: Sequence[PartState], http: httpx.Client) -> dict[str, float | str]:
    """Seconds each HTTP part takes to answer its health path (or why it did not)."""
    times: dict[str, float | str] = {}
    for part in parts:
        path = health_path(part)
        if not part.url or path is None:
            continue
        started = time.monotonic()
        try:
            http.get(f"{part.url}{path}", timeout=5.0)
        except httpx.HTTPError as exc:
            times[part.name] = type(exc).__name__
            continue
        times[part.name] = round(time.monotonic() - started, 3)
    return times


def diagnose(ctx: DrillContext, alert: str, labels: Mapping[str, str]) -> str:
    """What keeps `alert` active: its own figure, the machine's load, the busiest parts and the
    slowest health answers."""
    active = ctx.probe.alerts(alert, labels)
    figures = "; ".join(
        str(a.get("annotations", {}).get("description") or a.get("labels")) for a in active
    )
    load1, _, _ = os.getloadavg()
    cores = os.cpu_count() or 1
    parts = [part for part in ctx.state.parts if part.pid]
    busiest = ", ".join(f"{p.name} {p.cpu:.0%}" for p in sample_part_load(parts)[:3])
    health = time_health(parts, ctx.probe.http)
    slow = sorted(
        ((name, t) for name, t in health.items() if isinstance(t, float)), key=lambda x: -x[1]
    )[:3]
    failing = [f"{name}: {t}" for name, t in health.items() if isinstance(t, str)]
    parts_text = ", ".join(f"{name} {t:.3f} s" for name, t in slow)
    return (
        f"{alert} {figures or 'active'}; load average {load1:.1f} on {cores} cores; busiest "
        f"parts {busiest or '-'}; slowest health answers {parts_text or '-'}"
        + (f"; not answering: {', '.join(failing)}" if failing else "")
    )


def build_window_problems(
    regions: Sequence[str],
    requests: Mapping[str, float],
    p99: Mapping[str, float],
    min_requests: int,
    threshold: float,
) -> list[str]:
    """What keeps each region's latency window from being a daytime one: some requests but fewer
    than the red line's `min_requests` (a P99 over a few requests is their slowest, so it proves
    nothing either way: one slowish request reads as a breach) or a P99 over the line. A region
    whose window holds no request serves nothing to judge (the secondary, before a reroute).
    Empty when every region is settled."""
    problems = []
    for region in regions:
        seen = requests.get(region, 0.0)
        if seen < 1:
            continue
        if seen < min_requests:
            problems.append(f"{region}: {seen:.0f} requests in the window < {min_requests}")
            continue
        value = p99.get(region)
        if value is not None and value > threshold:
            problems.append(f"{region}: P99 {value:.3f} s > {threshold:g} s")
    return problems


def wait_daytime_window(ctx: DrillContext, drill: str, bound: float) -> None:
    """Wait until every region's latency window holds the red line's `min_requests` and a P99
    under the line (after the night drill's paused load generator, say); DrillError naming what
    is missing and the machine's load after `bound` s."""
    red = ctx.spec.red_lines.latency_p99
    regions = ctx.endpoints.regions
    problems: list[str] = []

    def by_region(record: str) -> dict[str, float]:
        return {
            labels["region"]: value
            for labels, value in ctx.probe.query(record)
            if "region" in labels and not math.isnan(value)
        }

    def settled() -> bool | None:
        problems[:] = build_window_problems(
            regions,
            by_region(window_requests_record(ctx.spec)),
            by_region(p99_record(ctx.spec)),
            red.min_requests,
            red.threshold_seconds,
        )
        return True if not problems else None

    what = f"a {red.window} window of daytime traffic under the red line in every region"
    try:
        ctx.wait_for(drill, what, settled, bound, 0.5)
    except DrillError:
        load1, _, _ = os.getloadavg()
        raise DrillError(
            f"the stack did not settle within {bound:.0f} s: {'; '.join(problems)}; load "
            f"average {load1:.1f} on {os.cpu_count() or 1} cores"
        ) from None


__all__ = [
    "MIN_SETTLE_SECONDS",
    "PartLoad",
    "diagnose",
    "evidence_seconds",
    "sample_part_load",
    "settle_seconds",
    "time_health",
    "build_window_problems",
    "wait_daytime_window",
]
