"""Prometheus' alert template functions, so promtool cases can expect the exact annotations."""

from __future__ import annotations

import math
import re
from collections.abc import Callable


def humanize(value: float) -> str:
    """Prometheus' `humanize` template function."""
    if value == 0 or math.isnan(value) or math.isinf(value):
        return _g(value)
    prefix = ""
    if abs(value) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(value) < 1000:
                break
            prefix, value = p, value / 1000
        return _g(value) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix, value = p, value * 1000
    return _g(value) + prefix


def humanize_duration(value: float) -> str:
    """Prometheus' `humanizeDuration` template function."""
    if math.isnan(value) or math.isinf(value):
        return _g(value)
    if value == 0:
        return _g(value) + "s"
    if abs(value) >= 1:
        sign = "-" if value < 0 else ""
        value = abs(value)
        whole = int(value)
        seconds, minutes = whole % 60, (whole // 60) % 60
        hours, days = (whole // 3600) % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_g(value)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix, value = p, value * 1000
    return f"{_g(value)}{prefix}s"


def _g(value: float) -> str:
    text = f"{value:.4g}"
    return {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}.get(text, text)


_TEMPLATE = re.compile(r"\{\{\s*(\$labels\.(\w+)|\$value(?:\s*\|\s*(\w+))?)\s*\}\}")


def humanize_percentage(value: float) -> str:
    """Prometheus' `humanizePercentage` template function."""
    return f"{value * 100:.4g}%"


_FUNCTIONS: dict[str | None, Callable[[float], str]] = {
    None: _g,
    "humanize": humanize,
    "humanizeDuration": humanize_duration,
    "humanizePercentage": humanize_percentage,
}


def expand(template: str, labels: dict[str, str], value: float) -> str:
    """Expand the subset of Prometheus alert templating that redline's annotations use."""

    def one(match: re.Match[str]) -> str:
        if match.group(2):
            return labels.get(match.group(2), "")
        return _FUNCTIONS[match.group(3)](value)

    return _TEMPLATE.sub(one, template)
