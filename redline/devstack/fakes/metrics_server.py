"""Serve a text exposition on `/metrics` (and NIM's `/v1/metrics`) from a daemon thread: a fake
engine's (`EngineMetrics`), or any prometheus-client registry's, for a real Prometheus to scrape."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4


class Exposition(Protocol):
    """Anything with a text exposition."""

    def render(self) -> bytes:
        """The text exposition (format 0.0.4)."""
        ...


@dataclass(frozen=True)
class RegistryExposition:
    """A prometheus-client registry as an `Exposition` (e.g. the exporter's collectors)."""

    registry: CollectorRegistry

    def render(self) -> bytes:
        """The registry's text exposition."""
        return generate_latest(self.registry)


class _Handler(BaseHTTPRequestHandler):
    server: _ExpositionHTTPServer

    def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
        path = self.path.split("?", 1)[0]
        if path not in self.server.paths:
            self.send_error(404)
            return
        body = self.server.exposition.render()
        self.server.count_scrape()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet: scrapes every second would flood the test output."""


class _ExpositionHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], exposition: Exposition, paths: Sequence[str]
    ) -> None:
        super().__init__(address, _Handler)
        self.exposition = exposition
        self.paths = frozenset(paths)
        self.scrapes = 0
        self._lock = threading.Lock()

    def count_scrape(self) -> None:
        with self._lock:
            self.scrapes += 1


class EngineMetricsServer:
    """Serves an exposition on `/metrics` and `/v1/metrics` from a daemon thread."""

    def __init__(
        self,
        exposition: Exposition,
        host: str = "127.0.0.1",
        port: int = 0,
        paths: Sequence[str] = ("/metrics", "/v1/metrics"),
    ) -> None:
        self._server = _ExpositionHTTPServer((host, port), exposition, paths)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()

    @property
    def target(self) -> str:
        """`host:port`, as a Prometheus static target."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The metrics URL."""
        return f"http://{self.target}/metrics"

    @property
    def scrapes(self) -> int:
        """Expositions served so far."""
        return self._server.scrapes

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> EngineMetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
