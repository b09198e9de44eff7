"""`make bench`'s runner: every benchmark to the end, whatever one of them does, then one table.

Each benchmark runs in a process of its own (`python -m bench --child ENTRY NAME RESULT`), and
that process runs it with `run_in_process`. Why a process rather than a `try` around the call:

- nothing a benchmark does can end the run: `SystemExit`, `os._exit`, a crash in a native
  library (Milvus Lite's client, torch), a hang (a timeout ends it) — the runner records a
  failure and goes on;
- nothing it leaves behind skews the next one's figures: process-wide switches (BLAS threads,
  prometheus-client's `_created`, warnings filters, logging), threads still running, a heap
  grown by a loaded model; each benchmark measures from the same fresh interpreter.

Inside the benchmark's process `run_in_process` catches every BaseException but
KeyboardInterrupt, records it and writes the outcome (figures or failure) as JSON for the
runner. Ctrl-C reaches the runner and the benchmark alike (one process group): the benchmark's
own `finally` blocks stop the services it started, the runner waits for that, prints the table
of what finished and exits 130. The runner takes the benchmarks and the way to run each as
arguments, so a test gives it fakes and runs them in-process.
"""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from bench.figures import Figure, MissingDependencyError

Status = Literal["ok", "failed", "skipped"]
INTERRUPTED_EXIT = 130
CLEANUP_SECONDS = 60.0
"""How long an interrupted benchmark may take to stop its services before it is killed."""


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its name, what it compares, and its entry point."""

    name: str
    what: str
    entry: str
    """`module` or `module:function`; the function (default `run`) takes argv and returns
    a list of `Figure`."""
    timeout_seconds: float = 3600.0


@dataclass
class Outcome:
    """How one benchmark ended: ok (its figures), failed or skipped (and why)."""

    name: str
    status: Status
    figures: list[Figure] = field(default_factory=list)
    detail: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the benchmark's process writes it for the runner)."""
        return {
            "name": self.name,
            "status": self.status,
            "figures": [figure.to_json() for figure in self.figures],
            "detail": self.detail,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        """The outcome `to_json` wrote."""
        status = data["status"]
        if status not in ("ok", "failed", "skipped"):
            raise ValueError(f"unknown status {status!r}")
        return cls(
            name=str(data["name"]),
            status=status,
            figures=[Figure.from_json(f) for f in data.get("figures", [])],
            detail=str(data.get("detail", "")),
            seconds=float(data.get("seconds", 0.0)),
        )


Executor = Callable[[Benchmark], Outcome]


def load_entry(entry: str) -> Callable[[list[str]], Sequence[Figure]]:
    """The function an entry names (`module:function`, or `module` for its `run`)."""
    module_name, _, attribute = entry.partition(":")
    module = importlib.import_module(module_name)
    function: Callable[[list[str]], Sequence[Figure]] = getattr(module, attribute or "run")
    return function


def run_in_process(benchmark: Benchmark) -> Outcome:
    """Run one benchmark here; whatever it raises but KeyboardInterrupt becomes its outcome."""
    started = time.perf_counter()

    def outcome(status: Status, figures: Sequence[Figure] = (), detail: str = "") -> Outcome:
        return Outcome(benchmark.name, status, list(figures), detail, time.perf_counter() - started)

    try:
        figures = load_entry(benchmark.entry)([])
    except KeyboardInterrupt:
        raise
    except MissingDependencyError as exc:
        return outcome("skipped", detail=str(exc))
    except SystemExit as exc:
        # A benchmark that exits ends only itself: its message is the failure's reason.
        if exc.code in (0, None):
            return outcome("failed", detail="exited (code 0) before reporting its figures")
        reason = exc.code if isinstance(exc.code, str) else f"exit code {exc.code}"
        return outcome("failed", detail=f"SystemExit: {reason}")
    except BaseException as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
        traceback.print_exc()
        return outcome("failed", detail=f"{type(exc).__name__}: {exc}")
    return outcome("ok", figures)


def _child_argv(benchmark: Benchmark, result: Path) -> list[str]:
    return [sys.executable, "-m", "bench", "--child", benchmark.entry, benchmark.name, str(result)]


def outcome_of_child(
    benchmark: Benchmark, returncode: int, result: Path, seconds: float
) -> Outcome:
    """The outcome a benchmark's process wrote, or a failure saying how the process ended."""
    try:
        return Outcome.from_json(json.loads(result.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if returncode < 0:
        how = f"killed by {signal.Signals(-returncode).name}"
    else:
        how = f"exited with code {returncode}"
    return Outcome(benchmark.name, "failed", [], f"its process {how} without a result", seconds)


def _stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait up to `timeout` for the process to end; kill it after that."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_in_subprocess(benchmark: Benchmark) -> Outcome:
    """Run one benchmark in a fresh interpreter (see the module docstring for why)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="redline-bench-run-") as tmp:
        result = Path(tmp) / "outcome.json"
        sys.stdout.flush()
        sys.stderr.flush()
        process = subprocess.Popen(_child_argv(benchmark, result))
        try:
            returncode = process.wait(benchmark.timeout_seconds)
        except subprocess.TimeoutExpired:
            # SIGINT, not SIGKILL: its finally blocks stop the services it started.
            process.send_signal(signal.SIGINT)
            _stop(process, CLEANUP_SECONDS)
            detail = f"timed out after {benchmark.timeout_seconds:g} s"
            return Outcome(benchmark.name, "failed", [], detail, time.perf_counter() - started)
        except KeyboardInterrupt:
            # The same Ctrl-C reached the benchmark: let it stop its services, then stop too.
            _stop(process, CLEANUP_SECONDS)
            raise
        if returncode in (INTERRUPTED_EXIT, -signal.SIGINT) and not result.exists():
            raise KeyboardInterrupt  # someone interrupted the benchmark itself: stop the run
        return outcome_of_child(benchmark, returncode, result, time.perf_counter() - started)


def child_main(entry: str, name: str, result: str) -> int:
    """The benchmark's process: run it in-process, write its outcome to `result`."""
    try:
        outcome = run_in_process(Benchmark(name, "", entry))
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
    Path(result).write_text(json.dumps(outcome.to_json()))
    return 0


def _met(figure: Figure) -> str:
    return "-" if figure.met is None else ("yes" if figure.met else "NO")


def summary_rows(outcomes: Sequence[Outcome], not_run: Sequence[str]) -> list[tuple[str, ...]]:
    """The summary's rows: benchmark, figure, target, met."""
    rows: list[tuple[str, ...]] = []
    for outcome in outcomes:
        if outcome.status == "skipped":
            rows.append((outcome.name, f"skipped: {outcome.detail}", "-", "-"))
            continue
        for figure in outcome.figures:
            rows.append((outcome.name, figure.shown(), figure.target or "-", _met(figure)))
        if outcome.status == "failed":
            rows.append((outcome.name, f"FAILED: {outcome.detail}", "runs to the end", "NO"))
        elif not outcome.figures:
            rows.append((outcome.name, "(no figures reported)", "-", "-"))
    for index, name in enumerate(not_run):
        shown = "interrupted while it ran" if index == 0 else "not run: the run was interrupted"
        rows.append((name, shown, "-", "-"))
    return rows


def render_summary(
    outcomes: Sequence[Outcome], not_run: Sequence[str] = (), seconds: float | None = None
) -> str:
    """The one summary table of a run: benchmark | figure | target | met."""
    header = ("benchmark", "figure", "target", "met")
    rows = summary_rows(outcomes, not_run)
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))

    lines = [line(header), "-+-".join("-" * width for width in widths)]
    lines += [line(row) for row in rows]
    failed = sum(o.status == "failed" for o in outcomes)
    skipped = sum(o.status == "skipped" for o in outcomes)
    missed = sum(f.met is False for o in outcomes for f in o.figures)
    tail = (
        f"{len(outcomes)} benchmarks run: {failed} failed, {skipped} skipped; "
        f"{missed} figures missed their target"
    )
    if not_run:
        tail += f"; interrupted, {len(not_run)} not run"
    if seconds is not None:
        tail += f"; wall time {seconds:.0f} s"
    return "\n".join([*lines, tail])


def run_code(outcomes: Sequence[Outcome], interrupted: bool) -> int:
    """130 when interrupted; 1 when a benchmark failed or a figure missed its target; else 0."""
    if interrupted:
        return INTERRUPTED_EXIT
    failed = any(o.status == "failed" for o in outcomes)
    missed = any(f.met is False for o in outcomes for f in o.figures)
    return 1 if failed or missed else 0


def run(
    benchmarks: Sequence[Benchmark],
    execute: Executor = run_in_subprocess,
    out: TextIO | None = None,
) -> int:
    """Run every benchmark with `execute`, print the summary table; the exit code."""
    stream = sys.stdout if out is None else out
    outcomes: list[Outcome] = []
    interrupted = False
    started = time.perf_counter()
    try:
        for benchmark in benchmarks:
            print(f"\n=== bench.{benchmark.name}: {benchmark.what}", file=stream, flush=True)
            outcome = execute(benchmark)
            outcomes.append(outcome)
            shown = outcome.status + (f": {outcome.detail}" if outcome.detail else "")
            print(
                f"--- {benchmark.name} {shown} ({outcome.seconds:.1f} s)", file=stream, flush=True
            )
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: the table shows what finished", file=stream)
    not_run = [b.name for b in benchmarks[len(outcomes) :]]
    print(file=stream)
    print(render_summary(outcomes, not_run, time.perf_counter() - started), file=stream)
    stream.flush()
    return run_code(outcomes, interrupted)
