"""`redline sources [PROFILE]`: where each SLI comes from on every serving stack redline reads.

Per profile: each signal's series and matchers (or why it stands in), how the engine's labels map
onto the catalog's, and what the stack cannot provide. `--spec` shows a spec's profile with its
overrides applied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from redline.cli.common import fail, out
from redline.slo import catalog
from redline.slo.load import SpecError, load_spec
from redline.slo.sources import (
    PROFILE_NAMES,
    PROFILES,
    SIGNAL_NAMES,
    ResolvedSources,
    resolve_sources,
)


def label_mapping(resolved: ResolvedSources) -> list[str]:
    """One line per catalog label: where its value comes from."""
    profile = resolved.profile
    if not resolved.mirrored:
        return ["every catalog label is written by redline's gateway itself"]
    lines = [f"{label} <- {engine}" for label, engine in profile.labels.items()]
    if profile.model is not None:
        lines.append(f"{catalog.LABEL_MODEL} = {profile.model!r} (constant)")
    if resolved.version_from_registry():
        lines.append(
            f"{catalog.LABEL_MODEL_VERSION} <- the snapshot registry's active version "
            f"({catalog.MODEL_ACTIVE_INFO}), 'unknown' where none is active"
        )
    lines.append(f"{catalog.LABEL_SERVED_REGION} <- {catalog.LABEL_REGION}")
    lines.append(f"{catalog.LABEL_REROUTED} = 'false' (no gateway, no reroute)")
    return lines


def signal_table(resolved: ResolvedSources) -> Table:
    """Signal -> the engine series (matchers included) and how the rules read them, and why a
    series stands in where the engine has no exact equivalent."""
    table = Table(title=f"{resolved.name}: {resolved.profile.title}", title_justify="left")
    table.add_column("signal", no_wrap=True)
    table.add_column("series (-> how the rules read it)", overflow="fold", ratio=3)
    table.add_column("note", overflow="fold", ratio=2)
    for signal in SIGNAL_NAMES:
        found = resolved.series(signal)
        if found is None:
            reason = resolved.profile.missing.get(signal, "not published by this stack")
            table.add_row(signal, "-", f"not available: {reason}")
            continue
        selectors = "\n+ ".join(found.selector(name) for name in found.names)
        read = "mapped onto the catalog's labels" if resolved.mirrored else "as it is"
        table.add_row(signal, f"{selectors}\n-> {read}", found.note or "-")
    return table


def print_sources(resolved: ResolvedSources) -> None:
    """The signal table, the label mapping and what the profile cannot provide."""
    out.print(signal_table(resolved), markup=False)
    out.print("labels:", markup=False)
    for line in label_mapping(resolved):
        out.print(f"  {line}", markup=False)
    missing = [
        (key, reason) for key, reason in resolved.profile.missing.items() if key not in SIGNAL_NAMES
    ]
    out.print("not available:" + ("" if missing else " nothing"), markup=False)
    for key, reason in missing:
        out.print(f"  {key.replace('_', ' ')}: {reason}", markup=False)
    out.print(f"docs: {resolved.profile.docs}", markup=False)
    out.print("", markup=False)


def sources(
    profile: Annotated[
        str | None,
        typer.Argument(
            help=f"One profile ({', '.join(PROFILE_NAMES)}); every one when omitted.",
            show_default=False,
        ),
    ] = None,
    spec: Annotated[
        Path | None,
        typer.Option("--spec", help="Show this spec's sources, its overrides applied."),
    ] = None,
) -> None:
    """Print each source profile: signal -> series and matchers, label mapping, what is missing."""
    if spec is not None:
        try:
            loaded = load_spec(spec)
        except SpecError as exc:
            raise fail("\n".join(exc.problems)) from None
        print_sources(loaded.spec.sources.resolve())
        return
    if profile is not None and profile not in PROFILES:
        raise fail(f"unknown profile {profile!r}; allowed: {', '.join(PROFILE_NAMES)}")
    for name in [profile] if profile else PROFILE_NAMES:
        base = PROFILES[name]
        # A profile whose series name no model needs one to resolve: show a placeholder.
        model = "<sources.model>" if base.mirrored and "model" not in base.labels else None
        print_sources(resolve_sources(name, model=model))


def register(app: typer.Typer) -> None:
    """Add `redline sources` to `app`."""
    app.command("sources")(sources)
