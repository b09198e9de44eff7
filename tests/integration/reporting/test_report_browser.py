"""The HTML report as a person sees it: headless Chromium renders it, the PDF's first page too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from redline.devstack.samples.report import ts
from redline.reporting.pdf import run_chromium
from redline.reporting.run import generate_report
from redline.reporting.write import write_report
from redline.slo.load import load_spec
from redline.slo.report import Report, Window
from tests.support.report import sample_blocks, sample_prometheus

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("chromium") is None or shutil.which("pdftoppm") is None,
        reason="needs Debian's chromium and poppler-utils (make services installs them)",
    ),
]

ARTIFACTS = "REDLINE_REPORT_ARTIFACTS"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Report, Path]]:
    _, blocks = sample_blocks(tmp_path_factory)
    out = tmp_path_factory.mktemp("browser")
    with sample_prometheus(blocks, out / "prom") as service:
        window = Window(ts("2025-03-01T00:00"), ts("2025-03-31T00:00"))
        report = generate_report(service.url, load_spec(None).spec, "default", window).report
    write_report(report, out / "report", ["html", "pdf"])
    yield report, out


def _pixels(png: Path) -> np.ndarray:
    pixels: np.ndarray = image.imread(str(png))
    return pixels


def test_html_renders_charts_in_chromium_and_pdf_first_page(
    written: tuple[Report, Path],
) -> None:
    report, out = written
    page = (out / "report" / "slo-report.html").resolve()
    # The DOM after rendering, with every console message logged to stderr.
    dom = run_chromium(["--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()])
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    svgs = re.findall(r"<svg\b.*?</svg>", dom.stdout, flags=re.S)
    charts = [s for s in svgs if 'aria-label="chart-' in s]
    # Budget, one burn chart per SLO, one per red line, RPO target and drift instance.
    expected = 1 + len(report.slos) + len(report.red_lines) + len(report.rpos) + len(report.drift)
    assert len(charts) == expected
    for svg in charts:
        paths = re.findall(r'<path[^>]*\sd="([^"]+)"', svg)
        drawn = [d for d in paths if len(re.findall(r"[ML]", d)) >= 4]
        assert drawn, "a chart without a plotted line"
    assert "SLO report: genai-chat" in dom.stdout

    screenshot = out / "screenshot.png"
    shot = run_chromium(
        [
            "--window-size=1280,2400",
            "--hide-scrollbars",
            f"--screenshot={screenshot}",
            page.as_uri(),
        ]
    )
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    pixels = _pixels(screenshot)
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1200
    rgb = pixels[..., :3]
    assert float(rgb.std()) > 0.05
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 50  # text, badges, lines: not blank
    # The red FAIL badge and the blue plotted lines are on screen.
    red = (rgb[..., 0] > 0.6) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3)
    blue = (rgb[..., 2] > 0.7) & (rgb[..., 0] < 0.3)
    assert red.sum() > 100 and blue.sum() > 100

    pdf = out / "report" / "slo-report.pdf"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True)
    pages = int(re.search(r"Pages:\s+(\d+)", info.stdout).group(1))  # type: ignore[union-attr]
    assert pages >= 3
    subprocess.run(
        ["pdftoppm", "-png", "-r", "80", "-f", "1", "-l", "1", str(pdf), str(out / "pdf-page")],
        check=True,
        timeout=60,
    )
    first = next(out.glob("pdf-page*.png"))
    page_pixels = _pixels(first)[..., :3]
    assert page_pixels.shape[0] > page_pixels.shape[1]  # A4 portrait
    assert float(page_pixels.std()) > 0.05
    assert len(np.unique(page_pixels.reshape(-1, 3), axis=0)) > 50
    text = subprocess.run(
        ["pdftotext", "-f", "1", "-l", "1", str(pdf), "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "SLO report: genai-chat" in text and "availability" in text
    if os.environ.get(ARTIFACTS):
        keep = Path(os.environ[ARTIFACTS])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, keep / "screenshot.png")
        shutil.copy(first, keep / "pdf-page-1.png")
