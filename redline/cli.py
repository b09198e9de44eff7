"""The `redline` command line: parses arguments and calls the packages (layer 5, thin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from redline.slo.load import LoadedSpec, SpecError, load_spec

app = typer.Typer(
    name="redline",
    help="SLA red lines, SLOs and remediation for generative-AI serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

SpecArg = Annotated[
    Path | None,
    typer.Argument(help="Spec YAML file; the embedded default when omitted.", show_default=False),
]
SpecOpt = Annotated[
    Path | None,
    typer.Option("--spec", help="Spec YAML file; the embedded default when omitted."),
]


@app.callback()
def root() -> None:
    """redline: generate rules from the spec, run the exporters and the remediation receiver."""


def load_or_exit(path: Path | None) -> LoadedSpec:
    """Load a spec or print its problems (`file: field: message`) and exit 2."""
    try:
        loaded = load_spec(path)
    except SpecError as exc:
        for line in exc.problems:
            err.print(line, markup=False, highlight=False)
        raise typer.Exit(2) from None
    for finding in loaded.warnings:
        err.print(finding.render(loaded.source), markup=False, highlight=False)
    return loaded


@app.command()
def validate(spec: SpecArg = None) -> None:
    """Validate a spec: exit 0 when usable (warnings printed), 2 with one line per problem."""
    loaded = load_or_exit(spec)
    s = loaded.spec
    console.print(
        f"{loaded.source}: ok: spec {s.version} for {s.service}, regions {', '.join(s.regions)}, "
        f"{len(s.slos)} SLOs, {len(loaded.warnings)} warning(s)",
        markup=False,
        highlight=False,
    )


from redline.cli_sessions import sessions_app  # noqa: E402

app.add_typer(sessions_app, name="sessions")

from redline.cli_index import index_app  # noqa: E402

app.add_typer(index_app, name="index")


from redline.cli_exporters import register_exporter_commands  # noqa: E402

register_exporter_commands(app)


from redline.cli_remediation import register as register_remediation  # noqa: E402

register_remediation(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
