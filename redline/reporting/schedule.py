"""Scheduled report exports: APScheduler 3.x with its job store in Redis.

A restart keeps the schedule (the job and its next run time live in Redis, and an unchanged job
is not replaced) and a tick never runs twice: before a run the job claims its tick with
`SET NX` in Redis, so a restarted process catching up on a missed tick, or a second scheduler on
the same store, finds the tick taken and skips it. Each report is written into a hidden folder
and renamed into its dated folder (`20250303T060000Z`) in one step; the last `keep` folders
are kept and `index.html` lists them. A failed run is logged, counted in
`redline_report_runs_total{outcome="failure"}` and, having claimed its tick, waits for the next.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
)
from apscheduler.jobstores.redis import RedisJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from pydantic import Field

from redline.core.redisconn import open_redis
from redline.core.settings import ServiceSettings
from redline.reporting.run import floor_hour, generate_report
from redline.reporting.write import BASENAME, parse_formats, write_report, write_text
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import parse_duration

log = logging.getLogger("redline.report.schedule")

KEY_PREFIX = "redline:report"
FOLDER = re.compile(r"^\d{8}T\d{6}Z$")
CLAIM_TTL = timedelta(days=400)
_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")


class ScheduleError(ValueError):
    """A malformed schedule (cron expression, period, formats)."""


class ReportRunError(RuntimeError):
    """A scheduled run failed; the message says why."""


class ReportScheduleSettings(ServiceSettings):
    """Settings of `redline report schedule` (`REDLINE_*` env, `--config FILE`, flags)."""

    cron: str | None = Field(None, description="Crontab (5 fields, UTC) or 6 with seconds first.")
    prometheus: str | None = Field(None, description="Prometheus base URL.")
    name: str = Field("default", pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Schedule id.")
    period: str = Field("7d", description="Length of each report, ending at the tick's hour.")
    formats: str = Field("md,html,csv,json", description="Formats of each report.")
    out: Path = Field(Path("reports"), description="Root folder of the dated report folders.")
    keep: int = Field(10, ge=1, description="How many report folders to keep.")
    step: int | None = Field(None, description="Time-over resolution in seconds.")
    timeout: float = Field(60.0, gt=0, description="Seconds per Prometheus query.")
    misfire_grace_seconds: int = Field(
        3600, ge=1, description="A tick missed while down still runs this long after it."
    )


@dataclass(frozen=True)
class JobConfig:
    """What one run needs; stored (pickled) with the job in Redis, so plain values only."""

    name: str
    cron: str
    prometheus: str
    redis_url: str
    spec: str | None
    profile: str | None
    period_seconds: int
    formats: tuple[str, ...]
    out: str
    keep: int
    step: int | None
    timeout: float


def _dow(field: str) -> str:
    """A crontab day-of-week field in APScheduler 3.x terms (which counts 0 as Monday)."""
    parts: list[str] = []
    for item in field.split(","):
        base, _, every = item.partition("/")
        if base == "*" and not every:
            parts.append("*")
            continue
        if base == "*":
            lo, hi = 0, 6
        elif "-" in base:
            a, b = base.split("-", 1)
            lo, hi = _dow_number(a), _dow_number(b)
        else:
            lo = hi = _dow_number(base)
        stride = int(every) if every else 1
        if stride < 1:
            raise ScheduleError(f"day-of-week step must be positive in {field!r}")
        parts.extend(_DOW_NAMES[n] for n in range(lo, hi + 1, stride))
    return ",".join(dict.fromkeys(parts))


def _dow_number(text: str) -> int:
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text)
    names = {n: i for i, n in enumerate(_DOW_NAMES[:7])}
    if text.lower()[:3] in names:
        return names[text.lower()[:3]]
    raise ScheduleError(f"{text!r} is not a day of week (0-7 or sun..sat)")


def parse_cron(text: str) -> CronTrigger:
    """A UTC CronTrigger from crontab syntax (5 fields) or 6 fields with seconds first."""
    fields = text.split()
    if len(fields) == 5:
        second, (minute, hour, day, month, dow) = "0", fields
    elif len(fields) == 6:
        second, minute, hour, day, month, dow = fields
    else:
        raise ScheduleError(
            f"--cron {text!r}: expected 5 fields (minute hour day month weekday) or 6 with "
            "seconds first"
        )
    try:
        return CronTrigger(
            second=second,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=_dow(dow),
            timezone=UTC,
        )
    except ValueError as exc:
        raise ScheduleError(f"--cron {text!r}: {exc}") from None


def latest_tick(trigger: CronTrigger, now: datetime) -> datetime:
    """The trigger's most recent fire time at or before `now`."""
    for lookback in (60, 3600, 86400, 8 * 86400, 32 * 86400, 400 * 86400, 3000 * 86400):
        start = now - timedelta(seconds=lookback)
        tick: datetime | None = trigger.get_next_fire_time(None, start)
        if tick is not None and tick <= now:
            while True:
                later: datetime | None = trigger.get_next_fire_time(
                    tick, tick + timedelta(microseconds=1)
                )
                if later is None or later > now:
                    return tick
                tick = later
    raise ScheduleError(f"cron {trigger} never fired before {now.isoformat()}")


def folder_name(tick: datetime) -> str:
    """The dated folder of a tick."""
    return tick.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def build_job_config(settings: ReportScheduleSettings) -> JobConfig:
    """Validate the settings into a job config; ScheduleError on bad input."""
    if not settings.cron:
        raise ScheduleError('--cron is required, e.g. --cron "0 6 * * 1" (Mondays 06:00 UTC)')
    if not settings.prometheus:
        raise ScheduleError("--prometheus URL is required")
    parse_cron(settings.cron)
    try:
        seconds = int(parse_duration(settings.period))
        formats = tuple(parse_formats(settings.formats))
    except ValueError as exc:
        raise ScheduleError(str(exc)) from None
    if seconds <= 0 or seconds % 3600:
        raise ScheduleError(f"--period {settings.period} must be a whole number of hours")
    return JobConfig(
        name=settings.name,
        cron=settings.cron,
        prometheus=settings.prometheus,
        redis_url=settings.redis_url,
        spec=str(settings.spec) if settings.spec else None,
        profile=settings.profile,
        period_seconds=seconds,
        formats=formats,
        out=str(settings.out.resolve()),
        keep=settings.keep,
        step=settings.step,
        timeout=settings.timeout,
    )


def claim_key(name: str, tick: datetime) -> str:
    """The Redis key that marks a tick as taken."""
    return f"{KEY_PREFIX}:{name}:tick:{folder_name(tick)}"


def run_scheduled_report(**config: Any) -> str | None:
    """The scheduled job: claim the tick, build the report, publish its folder.

    Returns the folder written, or None when the tick was already taken.
    """
    job = JobConfig(**{**config, "formats": tuple(config["formats"])})
    tick = latest_tick(parse_cron(job.cron), datetime.now(UTC))
    client = open_redis(job.redis_url)
    try:
        key = claim_key(job.name, tick)
        if not client.set(key, f"running pid={os.getpid()}", nx=True, ex=CLAIM_TTL):
            log.info("report %s: tick %s already taken; skipped", job.name, folder_name(tick))
            return None
        try:
            folder = _produce(job, tick)
        except Exception as exc:
            client.set(key, f"failed: {exc}"[:500], ex=CLAIM_TTL)
            raise ReportRunError(f"report {job.name} for tick {folder_name(tick)}: {exc}") from exc
        client.set(key, f"ok {folder.name}", ex=CLAIM_TTL)
        return str(folder)
    finally:
        client.close()


def _produce(job: JobConfig, tick: datetime) -> Path:
    loaded = load_spec(Path(job.spec) if job.spec else None)
    spec = apply_profile(loaded.spec, job.profile)
    from redline.slo.report import Window

    end = floor_hour(tick.timestamp())
    window = Window(end - job.period_seconds, end)
    generated = generate_report(
        job.prometheus, spec, loaded.source, window, step=job.step, timeout=job.timeout
    )
    root = Path(job.out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / folder_name(tick)
    partial = root / f".partial-{folder_name(tick)}-{uuid.uuid4().hex[:8]}"
    try:
        write_report(generated.report, partial, job.formats)
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    prune(root, job.keep)
    write_index(root)
    return final


def report_folders(root: Path) -> list[Path]:
    """The dated report folders under `root`, newest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and FOLDER.match(p.name)), reverse=True)


def prune(root: Path, keep: int, stale_partial_seconds: float = 3600.0) -> list[Path]:
    """Delete all but the newest `keep` folders (and abandoned partial folders)."""
    removed = report_folders(root)[keep:]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    now = time.time()
    for partial in root.glob(".partial-*"):
        if now - partial.stat().st_mtime > stale_partial_seconds:
            shutil.rmtree(partial, ignore_errors=True)
    return removed


def render_index(root: Path) -> str:
    """index.html listing every report folder, newest first, with its headline."""
    rows: list[str] = []
    for folder in report_folders(root):
        summary = "?"
        period = ""
        data = folder / f"{BASENAME}.json"
        if data.exists():
            try:
                parsed = json.loads(data.read_text("utf-8"))
                s = parsed["summary"]
                summary = (
                    f"{str(s['status']).upper()}: {s['slos_failing']} SLO(s) failing, "
                    f"{s['incidents']} incident(s)"
                )
                period = f"{parsed['period']['start']} to {parsed['period']['end']}"
            except (OSError, ValueError, KeyError, TypeError):
                summary = "unreadable report.json"
        links = []
        for suffix, label in (
            ("html", "HTML"),
            ("pdf", "PDF"),
            ("md", "Markdown"),
            ("json", "JSON"),
        ):
            if (folder / f"{BASENAME}.{suffix}").exists():
                links.append(f'<a href="{folder.name}/{BASENAME}.{suffix}">{label}</a>')
        if (folder / "csv").is_dir():
            links.append(f'<a href="{folder.name}/csv/">CSV</a>')
        rows.append(
            f"<tr><td>{html.escape(folder.name)}</td><td>{html.escape(period)}</td>"
            f"<td>{html.escape(summary)}</td><td>{' | '.join(links)}</td></tr>"
        )
    body = "\n".join(rows) or '<tr><td colspan="4">No report yet.</td></tr>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\"><title>redline SLO reports</title><style>"
        "body{font:14px sans-serif;margin:24px}table{border-collapse:collapse}"
        "td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}</style></head>"
        "<body><h1>redline SLO reports</h1><table><thead><tr><th>run</th><th>period</th>"
        f"<th>summary</th><th>formats</th></tr></thead><tbody>\n{body}\n</tbody></table>"
        "</body></html>\n"
    )


def write_index(root: Path) -> Path:
    """Rewrite index.html atomically."""
    return write_text(root / "index.html", render_index(root))


class ScheduleMetrics:
    """Run counters of one scheduler process (an explicit registry, served on /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        runs, last = (
            catalog.REDLINE_REPORT_RUNS_TOTAL,
            catalog.REDLINE_REPORT_LAST_SUCCESS_TIMESTAMP_SECONDS,
        )
        self.runs = Counter(runs.family, runs.help, runs.labels, registry=self.registry)
        self.last_success = Gauge(last.family, last.help, last.labels, registry=self.registry)


@dataclass
class ScheduleRunner:
    """A scheduler process: the APScheduler instance, its Redis job store and metrics."""

    settings: ReportScheduleSettings
    metrics: ScheduleMetrics

    def __post_init__(self) -> None:
        self.config = build_job_config(self.settings)
        self.trigger = parse_cron(self.config.cron)
        self.job_id = f"redline-report-{self.config.name}"
        store = RedisJobStore(
            jobs_key=f"{KEY_PREFIX}:{self.config.name}:jobs",
            run_times_key=f"{KEY_PREFIX}:{self.config.name}:run_times",
        )
        # RedisJobStore builds a plain Redis(host, port); its client is swapped for the shared
        # factory's so TLS and Sentinel URLs work too (the default client never connected).
        store.redis = open_redis(self.settings.redis_url)
        self.scheduler = BackgroundScheduler(
            jobstores={"default": store},
            executors={"default": {"type": "threadpool", "max_workers": 1}},
            timezone=UTC,
        )
        self.scheduler.add_listener(
            self._on_event, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED
        )
        self.done = threading.Event()

    def _on_event(self, event: JobExecutionEvent) -> None:
        name = self.config.name
        if event.code == EVENT_JOB_ERROR:
            self.metrics.runs.labels(name, "failure").inc()
            log.error("report %s failed: %s (retried at the next tick)", name, event.exception)
        elif event.code == EVENT_JOB_MISSED:
            log.warning("report %s missed its run at %s", name, event.scheduled_run_time)
        elif event.retval is None:
            self.metrics.runs.labels(name, "skipped").inc()
        else:
            self.metrics.runs.labels(name, "success").inc()
            self.metrics.last_success.labels(name).set(time.time())
            log.info("report %s published %s", name, event.retval)

    def start(self) -> str:
        """Start; keep an identical stored job (and its next run time), else (re)place it."""
        kwargs = asdict(self.config)
        kwargs["formats"] = list(self.config.formats)
        self.scheduler.start(paused=True)
        existing = self.scheduler.get_job(self.job_id)
        if (
            existing is not None
            and str(existing.trigger) == str(self.trigger)
            and existing.kwargs == kwargs
        ):
            state = "kept"
        else:
            self.scheduler.add_job(
                "redline.reporting.schedule:run_scheduled_report",
                trigger=self.trigger,
                id=self.job_id,
                name=f"SLO report {self.config.name}",
                kwargs=kwargs,
                replace_existing=True,
                coalesce=True,
                max_instances=1,
                misfire_grace_time=self.settings.misfire_grace_seconds,
            )
            state = "replaced" if existing is not None else "added"
        self.scheduler.resume()
        job = self.scheduler.get_job(self.job_id)
        next_run = job.next_run_time.isoformat() if job and job.next_run_time else "never"
        log.info(
            "report %s: schedule %s (%s); next run %s",
            self.config.name,
            self.config.cron,
            state,
            next_run,
        )
        return state

    def stop(self) -> None:
        """Stop after the running report (if any) finishes; the schedule stays in Redis."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)


@contextmanager
def metrics_server(metrics: ScheduleMetrics, host: str, port: int) -> Iterator[int]:
    """Serve /metrics on host:port (0: no server) while the block runs."""
    if port == 0:
        yield 0
        return
    server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def run_schedule(settings: ReportScheduleSettings, wait: Callable[[threading.Event], None]) -> None:
    """Run the scheduler until `wait` returns (the CLI waits for SIGTERM/SIGINT)."""
    metrics = ScheduleMetrics()
    runner = ScheduleRunner(settings, metrics)
    with metrics_server(metrics, settings.host, settings.port):
        runner.start()
        try:
            wait(runner.done)
        finally:
            runner.stop()
