"""What an HTTP endpoint answers while Redis is unreachable or its primary is changing: 503 with
`Retry-After`, never a 500.

Endpoints that touch Redis answer so themselves; `install_failover_handlers` is the safety net
behind them: one exception handler per class of `FAILOVER_ERRORS`, so an error of that kind that
escapes an endpoint still becomes a 503 the client retries. The handlers cost a request nothing
until such an error is raised (Starlette looks them up only then).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from redline.core.redisconn import FAILOVER_ERRORS

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1
"""What `Retry-After` says: a failover takes seconds, a client retrying every second sees the
new primary soon after it is elected."""
RETRY_AFTER = {"Retry-After": str(RETRY_AFTER_SECONDS)}


def failover_message(exc: BaseException) -> str:
    """The one-line reason of a 503 caused by `exc` (its type, never its text: no addresses)."""
    return (
        f"a store this endpoint needs is unavailable ({type(exc).__name__}: Redis unreachable "
        f"or failing over); retry in {RETRY_AFTER_SECONDS} s"
    )


def install_failover_handlers(
    app: Starlette, body: Callable[[str], dict[str, Any]], service: str
) -> None:
    """Answer 503 + Retry-After, with `body(message)` as JSON, whenever one of
    `FAILOVER_ERRORS` escapes an endpoint of `app` (`service` names it in the log)."""

    async def unavailable(request: Request, exc: Exception) -> Response:
        message = failover_message(exc)
        log.warning("%s: %s %s: 503: %s", service, request.method, request.url.path, message)
        return JSONResponse(body(message), status_code=503, headers=RETRY_AFTER)

    for error in FAILOVER_ERRORS:
        app.add_exception_handler(error, unavailable)
