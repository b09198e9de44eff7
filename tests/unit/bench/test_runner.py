"""`make bench`'s runner: every benchmark runs to the end whatever one does, one summary table,
the exit code; and the figures' helpers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS
from bench.figures import (
    Figure,
    MissingDependencyError,
    at_least,
    at_most,
    below,
    check,
    exit_code,
    info,
    require,
)
from bench.runner import (
    INTERRUPTED_EXIT,
    Benchmark,
    Outcome,
    outcome_of_child,
    render_summary,
    run,
    run_in_process,
)

FAKES = "tests.unit.bench.fakes"


def fake(name: str) -> Benchmark:
    """A benchmark running the fake of that name."""
    return Benchmark(name, f"the {name} fake", f"{FAKES}:{name}")


def run_fakes(*names: str) -> tuple[int, str]:
    """Run the named fakes in-process; the exit code and what the runner printed."""
    out = io.StringIO()
    code = run([fake(name) for name in names], execute=run_in_process, out=out)
    return code, out.getvalue()


def summary(printed: str) -> list[list[str]]:
    """The summary table's rows (cells), header first."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("benchmark "))
    rows = [line for line in lines[start:] if " | " in line]
    return [[cell.strip() for cell in line.split(" | ")] for line in rows]


def test_a_benchmark_that_exits_does_not_stop_the_run() -> None:
    code, printed = run_fakes("exits", "misses", "passes")
    rows = summary(printed)
    assert rows[0] == ["benchmark", "figure", "target", "met"]
    assert [
        "exits",
        "FAILED: SystemExit: expositions differ in series",
        "runs to the end",
        "NO",
    ] in rows
    assert ["misses", "added at p50: 2.5 ms", "<= 2 ms", "NO"] in rows
    assert ["misses", "series per scrape: 4164", "-", "-"] in rows
    assert ["passes", "ratio: 42.5 x", ">= 42 x", "yes"] in rows
    assert code == 1
    assert "3 benchmarks run: 1 failed, 0 skipped; 1 figures missed their target" in printed


def test_a_missed_target_alone_fails_the_run() -> None:
    code, _ = run_fakes("passes", "misses")
    assert code == 1


def test_all_met_and_a_skip_pass() -> None:
    code, printed = run_fakes("passes", "lacks")
    assert code == 0
    assert ["lacks", "skipped: evidently not installed (pip install -e '.[bench]')", "-", "-"] in (
        summary(printed)
    )


def test_an_error_is_recorded_and_the_next_benchmark_runs() -> None:
    code, printed = run_fakes("breaks", "passes")
    rows = summary(printed)
    assert ["breaks", "FAILED: RuntimeError: simulator never became ready", "runs to the end",
            "NO"] in rows  # fmt: skip
    assert ["passes", "ratio: 42.5 x", ">= 42 x", "yes"] in rows
    assert code == 1


def test_ctrl_c_stops_the_run_and_shows_what_finished() -> None:
    code, printed = run_fakes("passes", "interrupted", "misses")
    rows = summary(printed)
    assert code == INTERRUPTED_EXIT
    assert ["passes", "ratio: 42.5 x", ">= 42 x", "yes"] in rows
    assert ["interrupted", "interrupted while it ran", "-", "-"] in rows
    assert ["misses", "not run: the run was interrupted", "-", "-"] in rows
    assert "interrupted, 2 not run" in printed


def test_the_child_outcome_round_trips_through_json(tmp_path: Path) -> None:
    outcome = run_in_process(fake("misses"))
    result = tmp_path / "outcome.json"
    result.write_text(json.dumps(outcome.to_json()))
    back = outcome_of_child(fake("misses"), 0, result, 1.0)
    assert back.status == "ok"
    assert back.figures == outcome.figures


def test_a_child_without_a_result_is_a_failure(tmp_path: Path) -> None:
    crashed = outcome_of_child(fake("passes"), -11, tmp_path / "missing.json", 2.0)
    assert crashed.status == "failed"
    assert crashed.detail == "its process killed by SIGSEGV without a result"
    exited = outcome_of_child(fake("passes"), 3, tmp_path / "missing.json", 2.0)
    assert exited.detail == "its process exited with code 3 without a result"


def test_an_outcome_with_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown status"):
        Outcome.from_json({"name": "x", "status": "maybe"})


def test_render_summary_lists_a_benchmark_without_figures() -> None:
    table = render_summary([Outcome("quiet", "ok")], seconds=3.2)
    assert "quiet     | (no figures reported)" in table
    assert table.endswith("wall time 3 s")


def test_figure_helpers() -> None:
    assert at_most("b", "x", 2.0, "ms", 2.0).met is True
    assert below("b", "x", 2.0, "s", 2.0).met is False
    assert at_least("b", "x", 19.9, "x", 20).target == ">= 20 x"
    assert info("b", "x", 1.0).met is None
    assert check("b", "all good", False, "all").shown() == "all good: no"
    assert check("b", "all good", True, "all").shown() == "all good: yes"
    assert exit_code([info("b", "x", 1.0), at_least("b", "y", 1, "", 0)]) == 0
    assert exit_code([at_least("b", "y", 0, "", 1)]) == 1
    figure = Figure("b", "x", float("nan"), "ms", "<= 2 ms", False)
    assert figure.shown() == "x: n/a ms"
    assert Figure.from_json(figure.to_json()).target == "<= 2 ms"


def test_require_names_the_missing_modules() -> None:
    require("json", hint="stdlib")
    with pytest.raises(MissingDependencyError, match="no_such_module_xyz not installed"):
        require("json", "no_such_module_xyz", hint="pip install it")


def test_every_benchmark_entry_names_a_run_function() -> None:
    names = [b.name for b in BENCHMARKS]
    assert len(set(names)) == len(names)
    for benchmark in BENCHMARKS:
        assert benchmark.entry == f"bench.{benchmark.name}"
