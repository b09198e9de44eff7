"""Drill results for people and machines: the timings table (or, where it does not fit, one block
per drill), the JSON artifact, a live board."""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from redline.devstack.drills.base import DrillResult

COLUMNS = (
    ("drill", "drill"),
    ("alert", "alert"),
    ("detect", "time_to_detect"),
    ("notify", "time_to_notify"),
    ("playbook start", "time_to_pipeline_end"),
    ("budget+2", "pipeline_budget_plus_2s"),
    ("remediate", "time_to_remediate"),
    ("recover", "time_to_recover"),
    ("lost", "lost"),
    ("failed req", "failed_requests"),
    ("result", "ok"),
)
TABLE_WIDTH = 150
"""Width the status table is laid out for when the output is not a terminal (logs, CI)."""
CAPTION = (
    "Seconds from the injected fault. Playbook start (or the webhook, for an alert without a "
    "playbook) is judged, in brackets, from the fault's onset against the budget: scrape + eval "
    "+ for + group_wait of the local profile, + 2 s. lost: acknowledged writes missing "
    "afterwards; failed req: user requests that failed during the drill."
)


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} s"


def build_rows(results: Sequence[DrillResult]) -> list[dict[str, str]]:
    """One row of display text per drill (durations from the fault)."""
    rows = []
    for result in results:
        data = result.as_dict()
        start = data["time_to_pipeline_end"]
        delay = data["condition_delay"]
        start_text = _seconds(start)
        if start is not None and delay:
            start_text += f" ({start - delay:.1f})"
        if result.playbook is None and start is not None:
            start_text += " webhook"
        within = data["within_budget"]
        budget = f"{data['pipeline_budget_plus_2s']:.1f} s" + (
            "" if within is None else (" ok" if within else " OVER")
        )
        lost = data["lost"]
        rows.append(
            {
                "drill": result.drill,
                "alert": result.alert or "-",
                "detect": _seconds(data["time_to_detect"]),
                "notify": _seconds(data["time_to_notify"]),
                "playbook start": start_text if result.expect_alert else "-",
                "budget+2": budget if result.expect_alert else "-",
                "remediate": _seconds(data["time_to_remediate"]),
                "recover": _seconds(data["time_to_recover"]),
                "lost": "n/a" if lost is None else str(lost),
                "failed req": _failed(result),
                "result": _verdict(result),
            }
        )
    return rows


def _failed(result: DrillResult) -> str:
    """`failed/allowed` (`-` when not counted; no bound shown when the drill's checks bound it)."""
    if result.failed_requests is None:
        return "-"
    if result.allowed_failures is None:
        return str(result.failed_requests)
    return f"{result.failed_requests}/{result.allowed_failures}"


def _verdict(result: DrillResult) -> str:
    if result.not_applicable is not None and result.ok:
        return "n/a"
    return "ok" if result.ok else "FAILED"


def build_figure_lines(results: Sequence[DrillResult]) -> list[str]:
    """One line per drill that measured more than the timings (its figures), or says why it
    does not apply to this stack."""
    lines = []
    for result in results:
        if result.not_applicable is not None:
            lines.append(f"{result.drill}: does not apply: {result.not_applicable}")
        elif result.figures:
            lines.append(f"{result.drill}: " + " · ".join(f.text() for f in result.figures))
    return lines


def build_table(results: Sequence[DrillResult], title: str = "redline drills") -> Table:
    """The timings table (seconds from the injected fault)."""
    table = Table(title=title, caption=CAPTION)
    for header, _ in COLUMNS:
        table.add_column(header, justify="left" if header in ("drill", "alert") else "right")
    for row in build_rows(results):
        style = None if row["result"] in ("ok", "n/a") else "red"
        table.add_row(*(row[header] for header, _ in COLUMNS), style=style)
    return table


def build_blocks(results: Sequence[DrillResult], title: str = "redline drills") -> Group:
    """The same timings as one block per drill (a heading line, then one line per column), for
    output too narrow for the table."""
    blocks: list[RenderableType] = [Text(title, style="italic")]
    for result, row in zip(results, build_rows(results), strict=True):
        style = "" if row["result"] in ("ok", "n/a") else "red"
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for header, _ in COLUMNS[1:-1]:
            grid.add_row(f"  {header}", row[header])
        for figure in result.figures:
            grid.add_row(f"  {figure.label}", figure.text()[len(figure.label) + 1 :])
        if result.not_applicable is not None:
            grid.add_row("  does not apply", result.not_applicable)
        blocks += [Text(""), Text(f"{row['drill']}: {row['result']}", style=style), grid]
    return Group(*blocks, Text(""), Text(CAPTION, style="dim"))


def table_width(table: Table) -> int:
    """The width `table` needs to show every cell whole (its widest layout)."""
    console = Console(width=10_000, file=io.StringIO())
    return Measurement.get(console, console.options, table).maximum


def build_report(
    results: Sequence[DrillResult], width: int, title: str = "redline drills"
) -> RenderableType:
    """The timings table when it fits `width` columns, else one block per drill: a cut cell
    (`dri…`) says nothing."""
    table = build_table(results, title)
    if table_width(table) > width:
        return build_blocks(results, title)
    lines = build_figure_lines(results)
    if not lines:
        return table
    return Group(table, *(Text(line, overflow="fold") for line in lines))


def render_json(results: Sequence[DrillResult], extra: dict[str, Any] | None = None) -> str:
    """The artifact: every result, with checks and notes."""
    payload = {
        "generated_at": time.time(),
        "ok": all(r.ok for r in results),
        **(extra or {}),
        "drills": [r.as_dict() for r in results],
    }
    return json.dumps(payload, indent=2, sort_keys=False)


def write_json(path: Path, text: str) -> None:
    """Write the artifact atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    os.replace(tmp, path)


class DrillBoard:
    """Progress of the drills for a `rich.live.Live` view (thread-safe updates)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.status = dict.fromkeys(self.names, "queued")
        self.started: dict[str, float] = {}
        self.results: dict[str, DrillResult] = {}
        self._lock = threading.Lock()

    def progress(self, drill: str, message: str) -> None:
        """A drill's latest event."""
        with self._lock:
            if drill not in self.status:
                self.names.append(drill)
            self.started.setdefault(drill, time.monotonic())
            self.status[drill] = message

    def done(self, result: DrillResult) -> None:
        """A drill's result."""
        with self._lock:
            self.results[result.drill] = result
            verdict = _verdict(result)
            self.status[result.drill] = (
                f"FAILED {result.error or ''}" if verdict == "FAILED" else verdict
            )

    def __rich__(self) -> RenderableType:
        table = Table(title="redline drills (live)", expand=True)
        table.add_column("drill", no_wrap=True)
        table.add_column("elapsed", justify="right", no_wrap=True)
        table.add_column("progress")
        with self._lock:
            for name in self.names:
                began = self.started.get(name)
                elapsed = "" if began is None else f"{time.monotonic() - began:.0f} s"
                result = self.results.get(name)
                if result is not None and result.fault_at and result.finished_at:
                    elapsed = f"{result.finished_at - result.fault_at:.0f} s"
                table.add_row(name, elapsed, self.status.get(name, ""))
        return table
