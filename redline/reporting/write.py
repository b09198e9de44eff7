"""Write a report in the requested formats into a directory (each file atomically)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from redline.reporting.gamedays import GamedayRun
from redline.reporting.pdf import write_pdf
from redline.reporting.render.html import render_html
from redline.reporting.render.markdown import render_markdown
from redline.reporting.render.tables import render_csv_tables, render_json
from redline.slo.report import Report

FORMATS = ("md", "html", "pdf", "csv", "json")
BASENAME = "slo-report"


class FormatError(ValueError):
    """An unknown output format."""


def parse_formats(text: str) -> list[str]:
    """`md,html` -> ["md", "html"]; FormatError naming the allowed values."""
    wanted = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in FORMATS]
    if unknown or not wanted:
        raise FormatError(
            f"unknown format(s) {', '.join(unknown) or '(none given)'}; "
            f"allowed: {', '.join(FORMATS)}"
        )
    return list(dict.fromkeys(wanted))


def write_text(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically (temp file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; reports are meant to be read and served
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_report(
    report: Report,
    out_dir: Path,
    formats: Iterable[str],
    gamedays: Sequence[GamedayRun] | None = None,
) -> list[Path]:
    """Render and write each format (with a Game days section when `gamedays` is given);
    returns the files written."""
    wanted = list(formats)
    written: list[Path] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    if "md" in wanted:
        written.append(write_text(out_dir / f"{BASENAME}.md", render_markdown(report, gamedays)))
    html_path = out_dir / f"{BASENAME}.html"
    if "html" in wanted or "pdf" in wanted:
        written.append(write_text(html_path, render_html(report, gamedays=gamedays)))
    if "pdf" in wanted:
        pdf = out_dir / f"{BASENAME}.pdf"
        tmp = out_dir / f".{BASENAME}.pdf.tmp"
        write_pdf(html_path, tmp)
        os.replace(tmp, pdf)
        written.append(pdf)
        if "html" not in wanted:
            html_path.unlink()
            written.remove(html_path)
    if "json" in wanted:
        written.append(write_text(out_dir / f"{BASENAME}.json", render_json(report, gamedays)))
    if "csv" in wanted:
        for name, text in render_csv_tables(report, gamedays).items():
            written.append(write_text(out_dir / "csv" / name, text))
    return written
