"""`redline report` (one report now) and `redline report schedule` (reports on a cron schedule).

Thin: parses options, picks the period, calls `redline.reporting` (imported when a command
runs, so registering the group costs other commands nothing). Exit codes: 0 written,
2 bad input (options, spec), 3 Prometheus unreachable or failing, 4 no data for the period,
5 a renderer failed (e.g. Chromium missing for PDF).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from redline.slo.load import LoadedSpec

report_app = typer.Typer(
    name="report",
    help="SLO reports from Prometheus: Markdown, HTML, PDF, CSV, JSON; once or on a schedule.",
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

PrometheusOpt = Annotated[
    str | None,
    typer.Option("--prometheus", help="Prometheus base URL, e.g. http://127.0.0.1:9090."),
]
SpecOpt = Annotated[Path | None, typer.Option("--spec", help="Spec YAML (default: embedded).")]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="Timing profile of the spec.")]
PeriodOpt = Annotated[
    str | None,
    typer.Option("--period", help="Length, e.g. 7d or 30d, ending at the last full hour."),
]
FromOpt = Annotated[str | None, typer.Option("--from", help="Start (UTC), e.g. 2025-03-01.")]
ToOpt = Annotated[str | None, typer.Option("--to", help="End (UTC, exclusive), e.g. 2025-03-31.")]
FormatOpt = Annotated[
    str, typer.Option("--format", help="Comma-separated: md, html, pdf, csv, json.")
]
StepOpt = Annotated[
    int | None,
    typer.Option(
        "--step",
        help="Time-over resolution in seconds (divides 3600); default: the scrape interval, or "
        "the data's sampling interval when coarser.",
    ),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds per Prometheus query.")]
GamedaysOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--gamedays",
        help="A gameday.json of `redline gameday run --out`, or a directory searched for them "
        "(repeatable): a Game days section with those whose fault fell in the period.",
    ),
]


def _say(console_: Console, text: str) -> None:
    console_.print(text, markup=False, highlight=False)


def _spec(path: Path | None, profile: str | None) -> LoadedSpec:
    from redline.slo.load import LoadedSpec, SpecError, apply_profile, load_spec

    try:
        loaded = load_spec(path)
        spec = apply_profile(loaded.spec, profile)
    except SpecError as exc:
        for line in exc.problems:
            _say(err, line)
        raise typer.Exit(2) from None
    return LoadedSpec(spec, loaded.source, loaded.warnings)


def register(app: typer.Typer) -> None:
    """Add the `report` command group to the main CLI."""
    app.add_typer(report_app, name="report")


@report_app.callback(invoke_without_command=True)
def report(
    ctx: typer.Context,
    prometheus: PrometheusOpt = None,
    spec: SpecOpt = None,
    profile: ProfileOpt = None,
    period: PeriodOpt = None,
    start: FromOpt = None,
    end: ToOpt = None,
    formats: FormatOpt = "md,html,csv,json",
    out: Annotated[Path, typer.Option("--out", help="Directory to write into.")] = Path("report"),
    step: StepOpt = None,
    timeout: TimeoutOpt = 60.0,
    gamedays: GamedaysOpt = None,
) -> None:
    """Write one SLO report for a period (default: the last 7 days)."""
    if ctx.invoked_subcommand is not None:
        return
    from redline.platform.prometheus import PrometheusError
    from redline.reporting.gamedays import GamedayError, build_gamedays, load_gamedays
    from redline.reporting.pdf import PdfError
    from redline.reporting.run import PeriodError, choose_window, generate_report
    from redline.reporting.write import FormatError, parse_formats, write_report
    from redline.slo.report import ReportError

    if not prometheus:
        _say(err, "--prometheus URL is required (e.g. --prometheus http://127.0.0.1:9090)")
        raise typer.Exit(2)
    try:
        wanted = parse_formats(formats)
        window = choose_window(period, start, end, time.time())
    except (FormatError, PeriodError) as exc:
        _say(err, f"error: {exc}")
        raise typer.Exit(2) from None
    try:
        # Read before Prometheus is, so a bad file fails fast; None: no section at all.
        runs = build_gamedays(load_gamedays(gamedays), window) if gamedays else None
    except GamedayError as exc:
        for line in exc.problems:
            _say(err, f"error: {line}")
        raise typer.Exit(2) from None
    loaded = _spec(spec, profile)
    try:
        generated = generate_report(
            prometheus, loaded.spec, loaded.source, window, step=step, timeout=timeout
        )
    except PrometheusError as exc:
        _say(err, f"error: {exc}")
        raise typer.Exit(3) from None
    except ReportError as exc:
        _say(err, f"error: {exc}")
        raise typer.Exit(4) from None
    for note in generated.report.notes:
        _say(err, f"note: {note}")
    try:
        files = write_report(generated.report, out, wanted, runs)
    except PdfError as exc:
        _say(err, f"error: {exc}")
        raise typer.Exit(5) from None
    summary = generated.report.summary
    _say(
        console,
        f"{summary.status.upper()}: {len(generated.report.slos)} SLOs, {summary.incidents} "
        f"incident(s)"
        + (f", {len(runs)} game day(s)" if runs is not None else "")
        + f"; {generated.queries} queries in {generated.seconds:.2f} s; "
        f"{len(files)} file(s) in {out}",
    )


@report_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of the report's JSON output."""
    from redline.reporting.render.tables import render_schema

    console.out(render_schema(), end="", highlight=False)


@report_app.command("schedule")
def schedule(
    cron: Annotated[
        str | None,
        typer.Option("--cron", help='Crontab in UTC, e.g. "0 6 * * 1" (6 fields: seconds first).'),
    ] = None,
    prometheus: PrometheusOpt = None,
    spec: SpecOpt = None,
    profile: ProfileOpt = None,
    period: Annotated[
        str | None, typer.Option("--period", help="Report length (default 7d).")
    ] = None,
    formats: Annotated[
        str | None, typer.Option("--format", help="Formats (default md,html,csv,json).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Root of the dated folders.")] = None,
    keep: Annotated[
        int | None, typer.Option("--keep", help="Folders to keep (default 10).")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Schedule id (default: default).")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option("--redis-url", help="Redis of the job store.")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address of /metrics.")] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="Port of /metrics (0: no metrics server).")
    ] = None,
    step: StepOpt = None,
    config: Annotated[Path | None, typer.Option("--config", help="Settings YAML file.")] = None,
) -> None:
    """Publish a report on a cron schedule into dated folders, keeping the last N (runs until
    SIGTERM; the schedule lives in Redis, so a restart keeps it and never runs a tick twice)."""
    from redline.core.settings import SettingsError, load_settings
    from redline.reporting.schedule import (
        ReportScheduleSettings,
        ScheduleError,
        build_job_config,
        run_schedule,
    )

    try:
        settings = load_settings(
            ReportScheduleSettings,
            config,
            cron=cron,
            prometheus=prometheus,
            spec=spec,
            profile=profile,
            period=period,
            formats=formats,
            out=out,
            keep=keep,
            name=name,
            redis_url=redis_url,
            host=host,
            port=port,
            step=step,
        )
        build_job_config(settings)
        _spec(settings.spec, settings.profile)
    except (SettingsError, ScheduleError) as exc:
        _say(err, f"error: {exc}")
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # A failed run is reported once, by the scheduler's listener, without a traceback.
    logging.getLogger("apscheduler.executors.default").setLevel(logging.CRITICAL)

    def wait(done: threading.Event) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            done.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not done.wait(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    run_schedule(settings, wait)
