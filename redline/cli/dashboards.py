"""`redline dashboards check`: every query of the generated dashboards against a Prometheus.

Thin: reads the dashboards, calls `redline.devstack.dashcheck.check`, prints one line per query.
Exit codes: 0 every query returned data; 1 a query failed or came back empty; 2 bad input
(options, dashboard files); 3 Prometheus unreachable.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from redline.cli.common import err, fail, out
from redline.dashboards.render import DASHBOARDS_DIR
from redline.devstack.dashcheck.check import (
    DashboardCheckError,
    check_dashboards,
    load_dashboards,
    render_outcomes,
)
from redline.platform.prometheus import PrometheusClient, PrometheusUnavailableError
from redline.slo.load import SpecError, apply_profile, load_spec

dashboards_app = typer.Typer(
    help="Generated Grafana dashboards: check their queries against a live Prometheus.",
    no_args_is_help=True,
)


@dashboards_app.command("check")
def check(
    prometheus: Annotated[
        str, typer.Option("--prometheus", help="Prometheus base URL, e.g. http://127.0.0.1:9090.")
    ],
    directory: Annotated[
        Path, typer.Option("--dir", help="Directory of dashboard JSON files.")
    ] = DASHBOARDS_DIR,
    last: Annotated[
        float, typer.Option("--last", min=60.0, help="Seconds of history to query, up to now.")
    ] = 3600.0,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Spec YAML (scrape interval; default: embedded).")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="Timing profile the dashboards were made for.")
    ] = None,
) -> None:
    """Run every panel and annotation query as Grafana would; exit 1 if one fails or is empty."""
    try:
        loaded = load_spec(spec)
        timing = (apply_profile(loaded.spec, profile) if profile else loaded.spec).timing
        dashboards = load_dashboards(directory)
    except SpecError as exc:
        raise fail("\n".join(exc.problems)) from None
    except DashboardCheckError as exc:
        raise fail(str(exc)) from None
    end = time.time()
    try:
        with PrometheusClient(prometheus, timeout=30.0, trust_env=False) as client:
            outcomes = check_dashboards(
                client, dashboards, end - last, end, timing.scrape_interval_seconds
            )
    except PrometheusUnavailableError as exc:
        err.print(f"Prometheus unreachable: {exc}", markup=False)
        raise typer.Exit(3) from None
    out.print(render_outcomes(outcomes), markup=False)
    if not all(outcome.ok for outcome in outcomes):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the `dashboards` group to the main CLI."""
    app.add_typer(dashboards_app, name="dashboards")
