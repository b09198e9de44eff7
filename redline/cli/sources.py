"""`redline sources [PROFILE]`: where each SLI comes from on every serving stack redline reads.

Per profile: each signal's series and matchers (or why it stands in), how the engine's labels map
onto the catalog's, and what the stack cannot provide. `--spec` shows a spec's profile with its
overrides applied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import httpx
import typer
import yaml
from rich.table import Table

from redline.cli.common import fail, out
from redline.slo import catalog
from redline.slo.detect import (
    Detection,
    DetectionError,
    ExpositionError,
    build_detection,
    same_buckets,
)
from redline.slo.load import SpecError, load_spec, threshold_findings
from redline.slo.sources import (
    PROFILE_NAMES,
    PROFILES,
    SIGNAL_NAMES,
    ResolvedSources,
    resolve_sources,
)
from redline.slo.spec import Spec


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


DETECT = "detect"
"""`redline sources detect`: the word in PROFILE's place (no profile is named so)."""
EXIT_UNREACHABLE = 3
EXIT_NOT_EXPOSITION = 4
EXIT_NO_ENGINE = 5
"""Exit codes of `sources detect`: the URL cannot be read; the body is no exposition; no profile
reads it, or two engines are in it."""


def fetch_exposition(url: str, timeout: float = 10.0) -> str:
    """The body of a /metrics URL; exits EXIT_UNREACHABLE naming the URL and why."""
    try:
        response = httpx.get(url, timeout=timeout, follow_redirects=True)
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: httpx rejects the URL itself
        raise fail(f"{url}: cannot be read: {exc}", EXIT_UNREACHABLE) from None
    if response.status_code != 200:
        raise fail(f"{url}: answered HTTP {response.status_code}", EXIT_UNREACHABLE)
    return response.text


def load_exposition(metrics_url: str | None, file: Path | None) -> tuple[str, str]:
    """(where, text) of the exposition named by exactly one of `--metrics-url` and `--file`."""
    if (metrics_url is None) == (file is None):
        raise fail("sources detect: give one of --metrics-url URL and --file F")
    if file is not None:
        try:
            return str(file), file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise fail(f"{file}: cannot be read: {exc}") from None
    assert metrics_url is not None
    return metrics_url, fetch_exposition(metrics_url)


def detect_or_exit(where: str, text: str) -> Detection:
    """`build_detection`, each failure exiting with its own code and the source named."""
    try:
        return build_detection(text)
    except ExpositionError as exc:
        raise fail(f"{where}: {exc}", EXIT_NOT_EXPOSITION) from None
    except DetectionError as exc:
        raise fail(f"{where}: {exc}", EXIT_NO_ENGINE) from None


def detection_lines(where: str, detection: Detection) -> list[str]:
    """What `sources detect` prints above the block: engine, version hints, buckets, labels."""
    profile = detection.profile
    listed = ", ".join(f"{b:g}" for b in detection.buckets)
    lines = [
        f"{where}: {profile.title} (profile {profile.name}, by {detection.histogram})",
        *(f"  version: {hint}" for hint in detection.hints),
        f"  buckets served: {listed}"
        + ("" if detection.buckets_differ else f" (the {profile.name} profile's own)"),
        f"  labels: {', '.join(detection.labels) or 'none'}",
    ]
    for presence in detection.signals:
        state = "missing " + ", ".join(presence.missing) if presence.missing else "present"
        lines.append(f"  {presence.signal}: {' + '.join(presence.names)}: {state}")
    return lines


def spec_findings(spec: Spec, detection: Detection) -> list[str]:
    """The spec against the served engine: another profile, other buckets, thresholds that are
    no served bucket (the spec's own checks with the served buckets), missing series."""
    lines = []
    if spec.sources.profile != detection.profile.name:
        lines.append(
            f"error: sources.profile is {spec.sources.profile!r}, the engine is "
            f"{detection.profile.name!r}"
        )
        return lines
    if detection.buckets and not same_buckets(spec.sources.buckets, detection.buckets):
        lines.append(
            "error: sources.histogram_buckets: the engine serves "
            f"{', '.join(f'{b:g}' for b in detection.buckets)}, the spec reads "
            f"{', '.join(f'{b:g}' for b in spec.sources.buckets)}"
        )
    served = spec.sources.model_copy(update={"histogram_buckets": detection.buckets or None})
    for finding in threshold_findings(spec.model_copy(update={"sources": served})):
        lines.append(f"{finding.level}: {finding.field}: {finding.message}")
    resolved = spec.sources.resolve()
    lines += [
        f"warning: {p.signal}: the engine serves no {', '.join(p.missing)}"
        for p in detection.signals
        if p.missing and resolved.series(p.signal) is not None
    ]
    return lines


def detect(metrics_url: str | None, file: Path | None, spec: Path | None) -> None:
    """`redline sources detect`: the engine behind an exposition and the `sources:` to paste."""
    where, text = load_exposition(metrics_url, file)
    detection = detect_or_exit(where, text)
    for line in detection_lines(where, detection):
        out.print(line, markup=False)
    block = detection.sources_block()
    out.print("\n# paste into the spec:", markup=False)
    out.print(yaml.safe_dump({"sources": block}, sort_keys=False).rstrip(), markup=False)
    if spec is not None:
        try:
            loaded = load_spec(spec)
        except SpecError as exc:
            raise fail("\n".join(exc.problems)) from None
        check_against_engine(loaded.source, loaded.spec, detection)


def check_against_engine(source: str, spec: Spec, detection: Detection) -> None:
    """Print the spec's findings against the engine; exit 2 when one is an error."""
    problems = spec_findings(spec, detection)
    for line in problems:
        out.print(f"{source}: {line}", markup=False)
    if any(line.startswith("error") for line in problems):
        raise typer.Exit(2)


def sources(
    profile: Annotated[
        str | None,
        typer.Argument(
            help=f"One profile ({', '.join(PROFILE_NAMES)}), every one when omitted; or "
            f"`{DETECT}` with --metrics-url or --file: which engine serves an exposition, "
            "its buckets and labels, and the `sources:` block to paste.",
            show_default=False,
        ),
    ] = None,
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="Show this spec's sources, its overrides applied; with detect, check the spec "
            "against the engine.",
        ),
    ] = None,
    metrics_url: Annotated[
        str | None, typer.Option("--metrics-url", help="detect: an engine's /metrics URL.")
    ] = None,
    file: Annotated[Path | None, typer.Option("--file", help="detect: a saved exposition.")] = None,
) -> None:
    """Print each source profile: signal -> series and matchers, label mapping, what is missing.

    `redline sources detect --metrics-url URL` (or `--file F`) exits 3 when the URL cannot be
    read, 4 when the body is no exposition, 5 when no profile reads it or it holds two engines.
    """
    if profile == DETECT:
        detect(metrics_url, file, spec)
        return
    if metrics_url is not None or file is not None:
        raise fail(f"--metrics-url and --file go with `redline sources {DETECT}`")
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
