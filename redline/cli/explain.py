"""`redline explain [ALERT]`: each alert's exact condition, its time to fire on a total outage and
the slowest failure that still fires it, from the numbers the rules are built from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from redline.cli.common import fail, out
from redline.rules.explain import Explanation, build_explanations, render_explanations_markdown
from redline.slo.load import SpecError, apply_profile, load_spec


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


def _table(explanations: list[Explanation]) -> Table:
    table = Table(title="redline alerts", title_justify="left")
    for column, ratio in (("alert", 2), ("severity", 1), ("fires when", 5), ("outage", 1),
                          ("slowest failure that fires", 3)):  # fmt: skip
        table.add_column(column, overflow="fold", ratio=ratio)
    for item in explanations:
        table.add_row(
            item.alert, item.severity, item.condition, _seconds(item.outage_seconds), item.slowest
        )
    return table


def explain(
    alert: Annotated[
        str | None, typer.Argument(help="Only this alert (all when omitted).", show_default=False)
    ] = None,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Spec YAML file; the embedded default if omitted.")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="Explain the spec as this profile sees it.")
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print a Markdown table (docs/spec-and-rules.md).")
    ] = False,
) -> None:
    """Each alert's condition, time to fire on a total outage, and slowest failure that fires."""
    try:
        loaded = load_spec(spec)
        explanations = build_explanations(apply_profile(loaded.spec, profile))
    except SpecError as exc:
        raise fail("\n".join(exc.problems)) from None
    if alert is not None:
        explanations = [item for item in explanations if item.alert == alert]
        if not explanations:
            known = sorted({item.alert for item in build_explanations(loaded.spec)})
            raise fail(f"no alert {alert!r} in this spec's rules; known: {', '.join(known)}")
    if markdown:
        out.print(render_explanations_markdown(explanations), end="", markup=False)
    else:
        out.print(_table(explanations), markup=False)


def register(app: typer.Typer) -> None:
    """Add `redline explain` to `app`."""
    app.command("explain")(explain)
