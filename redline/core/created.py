"""prometheus-client's `_created` series, switched on or off in one place."""

from __future__ import annotations

from prometheus_client import disable_created_metrics, enable_created_metrics


def apply_created_series(on: bool) -> None:
    """Turn prometheus-client's `_created` series on or off, for the whole process.

    The library reads this switch at every scrape, for every registry, so it cannot differ
    between two apps of one process: the last one built decides. Each redline process (an
    exporter, a gateway) builds one app, so its setting holds for it.
    """
    # prometheus-client leaves these two untyped.
    if on:
        enable_created_metrics()  # type: ignore[no-untyped-call]
    else:
        disable_created_metrics()  # type: ignore[no-untyped-call]
