"""Serve an ASGI app with uvicorn in a daemon thread (tests, benchmarks, the demo's fakes).

uvicorn is imported when a server starts, so code that only names `ServerThread` does not pay
for it.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import uvicorn


class ServerStartError(Exception):
    """The server thread exited or did not accept connections in time."""


@dataclass
class ServerThread:
    """An ASGI app served by uvicorn in a daemon thread; a context manager that stops it."""

    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    timeout_graceful_shutdown: float = 2.0,
    start_timeout: float = 10.0,
    lifespan: Literal["auto", "on", "off"] = "on",
    **options: Any,
) -> ServerThread:
    """Start `app` on `host:port` (0: a free port) in a thread; return once it accepts.

    `options` go to `uvicorn.Config` as they are (`access_log=False`, `log_config=None`, ...).
    The socket is bound here, before the thread starts, so port 0 never races another server.
    The loop is asyncio's unless `loop=` says otherwise: uvloop (which uvicorn picks when it is
    installed) fails to close a loop in a thread that still holds a kept-alive connection's
    handle (EBUSY) and leaves its transports unclosed, which pytest reports as errors.
    """
    import uvicorn

    options.setdefault("loop", "asyncio")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=int(math.ceil(timeout_graceful_shutdown)),
        lifespan=lifespan,
        **options,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn:{bound_port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            sock.close()
            raise ServerStartError(f"server on {host}:{bound_port} did not start")
        time.sleep(0.01)
    return ServerThread(server, thread, host, bound_port)


__all__ = ["ServerStartError", "ServerThread", "serve_in_thread"]
