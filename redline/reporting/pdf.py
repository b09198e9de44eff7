"""PDF from the report's HTML with headless Chromium (`--print-to-pdf`), the same engine a
reader's browser uses, so the PDF shows exactly the page the HTML shows."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


class PdfError(Exception):
    """Chromium is missing or failed to print the page."""


def find_chromium() -> str:
    """The Chromium binary; PdfError with the install command when there is none."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise PdfError(
        "PDF output needs Chromium and none was found on PATH; install it with: "
        "apt-get update && apt-get install -y chromium"
    )


def run_chromium(args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with a throw-away profile."""
    binary = find_chromium()
    with tempfile.TemporaryDirectory(prefix="redline-chromium-") as profile:
        argv = [binary, *HEADLESS_FLAGS, f"--user-data-dir={profile}", *args]
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise PdfError(f"Chromium did not finish within {timeout:g} s") from None


def write_pdf(html_path: Path, pdf_path: Path, timeout: float = 120.0) -> Path:
    """Print `html_path` to `pdf_path` (A4, the page's print CSS, no header or footer)."""
    done = run_chromium(
        [
            f"--print-to-pdf={pdf_path}",
            "--no-pdf-header-footer",
            html_path.resolve().as_uri(),
        ],
        timeout,
    )
    if done.returncode != 0 or not pdf_path.exists() or pdf_path.stat().st_size == 0:
        raise PdfError(f"Chromium could not print {html_path}: {done.stderr[-1000:]}")
    return pdf_path
