"""Plumbing shared by the CLI's command modules: consoles, common options, failing, serving.

Kept light to import (typer and rich only; uvicorn is imported when a server actually runs) so
that the lazily loaded command modules can share it without slowing `redline validate`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from redline.core.settings import ServiceSettings

out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)

HostOpt = Annotated[str | None, typer.Option("--host", help="Address to listen on.")]
PortOpt = Annotated[int | None, typer.Option("--port", help="Port to listen on.")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="Settings YAML (flags and REDLINE_* env win).")
]
RegionsOpt = Annotated[
    int | None,
    typer.Option(
        "--regions",
        min=1,
        help="Run a Prometheus for each of the spec's first N regions (external_labels "
        "region) and a global one that federates them and evaluates the rules.",
    ),
]
"""`redline up` and `redline demo`: one Prometheus per region instead of one."""


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` line by line to stderr; return the exit to raise (`code`; 2: bad input).

    Usage: `raise fail(str(exc), 1) from None`.
    """
    for line in message.splitlines():
        err.print(line, markup=False)
    return typer.Exit(code)


def require_redis(url: str, setting: str = "redis_url (--redis-url, REDLINE_REDIS_URL)") -> None:
    """Exit 2 naming `setting` when the Redis URL cannot be used (malformed, no sentinel...)."""
    from redline.core.redisconn import RedisConfigError, check_redis  # light module import

    try:
        check_redis(url, setting)
    except RedisConfigError as exc:
        raise fail(str(exc)) from None


def serve(app: Any, settings: ServiceSettings, port: int, banner: str) -> None:
    """Check the Redis URL, log at the settings' level, print `banner`, run `app` under uvicorn."""
    import uvicorn  # here, not at the top: the module must stay light to import

    require_redis(settings.redis_url)

    logging.basicConfig(level=settings.log_level.upper())
    out.print(banner, markup=False)
    uvicorn.run(app, host=settings.host, port=port, log_level=settings.log_level, access_log=False)
