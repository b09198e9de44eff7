"""Game days in the SLO report: the `gameday.json` files `redline gameday run --out` writes,
read back (`load_gamedays`), kept when their fault fell in the report's period
(`build_gamedays`), and the JSON model of a report that carries them (`ReportWithGamedays`).

The files are read as data, never through `redline.gameday` (a layer above this one): the model
here is the contract of `redline.gameday.report.result_as_dict`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from redline.slo.report import Report, Window

GAMEDAY_FILE = "gameday.json"

Outcome = Literal["pass", "fail", "aborted", "error"]


class GamedayError(ValueError):
    """A game-day file that is missing or malformed; `problems` holds `file: field: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _In(BaseModel):
    # Unknown keys are ignored: a newer `redline gameday` may write more than this report reads.
    model_config = ConfigDict(frozen=True, extra="ignore")


class GamedayExperiment(_In):
    """The fault's experiment object."""

    kind: str = Field(description="Its kind, e.g. NetworkChaos.")
    namespace: str
    name: str


class GamedayBudgets(_In):
    """What the game day had to stay within."""

    detect_seconds: float | None = None
    rto_seconds: float | None = None
    rpo_seconds: float | None = None


class GamedayRun(_In):
    """One `redline gameday run`: its fault, each step's seconds from the fault, its verdict."""

    drill: str
    experiment: GamedayExperiment
    expects: str | None = Field(description="The alert the fault must fire; null: none may.")
    fault_at: datetime | None = Field(description="When the fault was injected (UTC).")
    ended_at: datetime | None = Field(description="When the game day ended (UTC).")
    detect_seconds: float | None = Field(description="Fault -> the expected alert firing.")
    alertmanager_seconds: float | None = Field(description="Fault -> active in Alertmanager.")
    notify_seconds: float | None = Field(description="Fault -> the receiver's job.")
    playbook_start_seconds: float | None = Field(description="Fault -> the playbook's first step.")
    remediate_seconds: float | None = Field(description="Fault -> the playbook's verify passed.")
    rto_seconds: float | None = Field(description="Fault -> the expected alert resolved.")
    rpo_seconds: float | None = Field(description="Worst value of the drill's RPO series.")
    failed_requests: float | None = Field(description="Failed requests over the game day.")
    red_lines_fired: dict[str, float | None] = Field(
        default_factory=dict, description="Each red-line alert seen firing, seconds from the fault."
    )
    worst_error_ratio: float | None = None
    job_id: str | None = None
    budgets: GamedayBudgets
    aborted: str | None = None
    error: str | None = None
    problems: list[str] = Field(default_factory=list)
    verdict: str = Field(description="pass, FAIL: ..., ABORTED: ... or ERROR: ...")
    source: str = Field("", description="The file it was read from.")

    @field_validator("fault_at", "ended_at", mode="before")
    @classmethod
    def _unix_seconds(cls, value: object) -> object:
        # The file holds unix seconds; the report's own JSON, ISO times (read back the same).
        if value is None or isinstance(value, datetime):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, str):
            try:
                moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                pass
            else:
                return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        raise ValueError(f"expected unix seconds (a number) or null, got {value!r}")

    @property
    def at(self) -> datetime | None:
        """Where the run sits in time: its fault, or its end when no fault was injected."""
        return self.fault_at or self.ended_at

    @property
    def fault(self) -> str:
        """The §5 table's fault: `drill (kind)`."""
        return f"{self.drill} ({self.experiment.kind})"

    @property
    def outcome(self) -> Outcome:
        """The verdict as one word (its first)."""
        if self.error is not None or self.verdict.startswith("ERROR"):
            return "error"
        if self.aborted is not None or self.verdict.startswith("ABORTED"):
            return "aborted"
        return "pass" if self.verdict == "pass" else "fail"


class ReportWithGamedays(Report):
    """An SLO report (schema `redline.report/v1`); `gamedays` only when game days were given."""

    model_config = ConfigDict(title="Report")

    gamedays: list[GamedayRun] = Field(
        default_factory=list,
        description="Game days (`redline gameday run`) whose fault fell in the period, in time "
        "order; absent when the report was made without game-day files.",
    )


_RUNS = TypeAdapter(list[GamedayRun])


def _location(loc: tuple[int | str, ...]) -> str:
    parts = [f"[{item}]" if isinstance(item, int) else f".{item}" for item in loc]
    return "".join(parts).lstrip(".") or "(top level)"


def parse_gamedays(text: str, source: str) -> list[GamedayRun]:
    """Validate one `gameday.json`; GamedayError names the file and each bad field."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise GamedayError([f"{source}: {where}: malformed JSON: {exc.msg}"]) from None
    if not isinstance(data, list):
        raise GamedayError(
            [
                f"{source}: (top level): expected a JSON list of game-day results "
                f"(`redline gameday run --out`), got {type(data).__name__}"
            ]
        )
    try:
        runs = _RUNS.validate_python(data)
    except ValidationError as exc:
        problems = [
            f"{source}: {_location(tuple(e['loc']))}: "
            + (
                "required field is missing"
                if e["type"] == "missing"
                else str(e["msg"]).removeprefix("Value error, ")
            )
            for e in exc.errors()
        ]
        raise GamedayError(problems) from None
    return [run.model_copy(update={"source": source}) for run in runs]


def gameday_files(paths: Iterable[Path]) -> list[Path]:
    """Each path as given, a directory as every `gameday.json` under it (sorted)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.rglob(GAMEDAY_FILE))
            if not found:
                raise GamedayError([f"{path}: no {GAMEDAY_FILE} under this directory"])
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise GamedayError([f"{path}: no such file or directory"])
    return list(dict.fromkeys(files))


def load_gamedays(paths: Iterable[Path]) -> list[GamedayRun]:
    """Every game day in the given files and directories; GamedayError lists each problem."""
    runs: list[GamedayRun] = []
    problems: list[str] = []
    for path in gameday_files(paths):
        try:
            runs += parse_gamedays(path.read_text(encoding="utf-8"), str(path))
        except OSError as exc:
            problems.append(f"{path}: cannot be read: {exc.strerror or exc}")
        except UnicodeDecodeError:
            problems.append(f"{path}: not UTF-8 text")
        except GamedayError as exc:
            problems += exc.problems
    if problems:
        raise GamedayError(problems)
    return runs


def build_gamedays(runs: Sequence[GamedayRun], window: Window) -> list[GamedayRun]:
    """The runs whose fault fell in [start, end) of the period, in time order."""
    start = datetime.fromtimestamp(window.start, UTC)
    end = datetime.fromtimestamp(window.end, UTC)
    kept = [run for run in runs if run.at is not None and start <= run.at < end]
    return sorted(kept, key=lambda run: (run.at or start, run.drill))
