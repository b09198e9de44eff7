"""A lean asyncio HTTP/1.1 keep-alive client for the gateway's calls to its upstreams.

Why not httpx: profiling the gateway showed about 70 % of its CPU per proxied request in the
httpx/httpcore/anyio layers (request models, cookie extraction, cancel scopes, h11 state
machine). A proxy needs much less: write one request, read the status and headers, then relay
the body as it arrives. This client does exactly that on asyncio streams:

- bodies framed by `Content-Length`, `Transfer-Encoding: chunked` (each chunk is yielded as soon
  as it is complete, so SSE events pass through as the upstream flushes them) or, without either,
  by the connection closing; no body for HEAD, 1xx, 204 and 304;
- one idle-connection pool per upstream (LIFO, at most `max_idle` kept, dropped after
  `keepalive_expiry` seconds, which must stay below the upstream's own keep-alive timeout — 5 s in
  uvicorn, hence 4 s here); a reused connection that the upstream closed before answering is
  retried once on a fresh connection (nothing was answered, so nothing was processed twice);
- every read bounded by `read_timeout`; a response that is abandoned before its end (cancelled,
  timed out, closed early) closes its connection instead of returning it to the pool.

Errors: `UpstreamConnectError` (refused, unreachable, connect timeout), `UpstreamTimeoutError`
(a read took longer than `read_timeout`), `UpstreamProtocolError` (malformed response, or the
connection ended mid-response).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

_MAX_HEAD = 64 * 1024
_READ_SIZE = 64 * 1024


class UpstreamError(Exception):
    """The upstream could not be reached or did not answer properly."""


class UpstreamConnectError(UpstreamError):
    """No connection: refused, unreachable, or the connect timed out."""


class UpstreamTimeoutError(UpstreamError):
    """A read from the upstream took longer than the read timeout."""


class UpstreamProtocolError(UpstreamError):
    """The response was malformed or the connection ended in the middle of it."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.reused = False

    def usable(self, now: float, expiry: float) -> bool:
        # EOF on an idle connection means the server closed it.
        return (
            now - self.idle_since < expiry
            and not self.writer.is_closing()
            and not self.reader.at_eof()
        )

    def abort(self) -> None:
        self.writer.transport.abort()


class UpstreamResponse:
    """Status, headers and the body stream of one upstream response; `aclose()` it when done."""

    def __init__(
        self,
        pool: UpstreamPool,
        connection: _Connection,
        status: int,
        headers: list[tuple[str, str]],
        framing: str,
        length: int,
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.headers = headers
        self._pool = pool
        self._connection: _Connection | None = connection
        self._framing = framing  # "none", "length", "chunked" or "close"
        self._remaining = length
        self._keep_alive = keep_alive and framing != "close"
        self._done = framing == "none"

    def header(self, name: str, default: str = "") -> str:
        """The first value of header `name` (lowercase), or `default`."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives; closes (or pools) the connection at the end."""
        connection = self._connection
        if connection is None:
            return
        reader = connection.reader
        timeout = self._pool.read_timeout
        try:
            if self._framing == "length":
                while self._remaining > 0:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(min(self._remaining, _READ_SIZE))
                    if not data:
                        raise UpstreamProtocolError(
                            f"connection closed with {self._remaining} body bytes missing"
                        )
                    self._remaining -= len(data)
                    yield data
            elif self._framing == "chunked":
                pending: list[bytes] = []
                buffered = False
                while True:
                    if buffered:  # already in memory: no timer needed to read it
                        piece = await _read_chunk(reader)
                    else:
                        async with asyncio.timeout(timeout):
                            piece = await _read_chunk(reader)
                    if piece is None:
                        break
                    pending.append(piece)
                    # Chunks that have already arrived go out together: nothing waits for them,
                    # and a burst costs one write downstream instead of one per chunk.
                    buffered = _chunk_buffered(reader)
                    if not buffered:
                        yield b"".join(pending)
                        pending = []
                if pending:
                    yield b"".join(pending)
            elif self._framing == "close":
                while True:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(_READ_SIZE)
                    if not data:
                        break
                    yield data
            self._done = True
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
            raise UpstreamProtocolError(f"response cut: {type(exc).__name__}: {exc}") from None
        except TimeoutError:
            # Only this generator's own read timers raise TimeoutError in here; an outer
            # deadline arrives as CancelledError and is converted by its own context manager.
            raise UpstreamTimeoutError(f"read timed out after {timeout:g} s") from None
        finally:
            self._release()

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self.chunks()])

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._done and self._keep_alive:
            self._pool._put(connection)  # noqa: SLF001 - the pool and its responses are one unit
        else:
            connection.abort()

    async def aclose(self) -> None:
        """Release the connection: back to the pool if the body was read, else closed."""
        self._release()

    def abort(self) -> None:
        """Release the connection now, from any task: a read waiting on it fails at once with
        UpstreamProtocolError (the gateway aborts a stream this way when a node is drained)."""
        self._release()


async def _read_chunk(reader: asyncio.StreamReader) -> bytes | None:
    """One chunk's data, or None after the last chunk and its trailers."""
    line = await reader.readuntil(b"\r\n")
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise UpstreamProtocolError(f"bad chunk size line {line[:40]!r}") from None
    if size == 0:
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass  # trailers, up to the blank line
        return None
    data = await reader.readexactly(size + 2)
    if data[-2:] != b"\r\n":
        raise UpstreamProtocolError("chunk not followed by CRLF")
    return data[:-2]


def _chunk_buffered(reader: asyncio.StreamReader) -> bool:
    """True when a complete next chunk (size line, data, CRLF) is already in `reader`'s buffer.

    Reads StreamReader's private buffer (stable across CPython 3.8-3.13); without it, every
    chunk is simply yielded on its own."""
    buffer = getattr(reader, "_buffer", None)
    if not isinstance(buffer, bytearray):
        return False
    end = buffer.find(b"\r\n")
    if end < 0:
        return False
    try:
        size = int(bytes(buffer[:end]).split(b";", 1)[0].strip(), 16)
    except ValueError:
        return False  # the reading path reports the malformed line
    return len(buffer) >= end + 2 + size + 2


class UpstreamPool:
    """Keep-alive connections to one upstream base URL."""

    def __init__(
        self,
        base_url: str,
        connect_timeout: float = 1.0,
        read_timeout: float = 60.0,
        max_idle: int = 64,
        keepalive_expiry: float = 4.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc.rsplit("@", 1)[-1]
        self.prefix = parts.path.rstrip("/")
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self.keepalive_expiry = keepalive_expiry
        self._idle: list[_Connection] = []
        self._closed = False

    def _put(self, connection: _Connection) -> None:
        if self._closed or len(self._idle) >= self.max_idle:
            connection.abort()
            return
        connection.idle_since = time.monotonic()
        connection.reused = True
        self._idle.append(connection)

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                    limit=_MAX_HEAD,
                )
        except TimeoutError:
            raise UpstreamConnectError(
                f"connect to {self.host_header} timed out after {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(f"connect to {self.host_header}: {exc}") from None
        return _Connection(reader, writer)

    async def _acquire(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable(now, self.keepalive_expiry):
                return connection
            connection.abort()
        return await self._connect()

    async def request(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        trace_headers: Sequence[tuple[str, str]] = (),
    ) -> UpstreamResponse:
        """Send one request (`target` is path and query) and read the response head;
        `trace_headers` (the attempt's `traceparent` and `tracestate`) are sent after `headers`."""
        if self._closed:
            raise UpstreamConnectError("the upstream pool is closed")
        head = [f"{method} {self.prefix}{target} HTTP/1.1\r\nhost: {self.host_header}\r\n"]
        for name, value in headers:
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                continue
            head.append(f"{name}: {value}\r\n")
        for name, value in trace_headers:
            # Built by the propagator from ids and a validated tracestate: no CR/LF possible.
            head.append(f"{name}: {value}\r\n")
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            head.append(f"content-length: {len(body)}\r\n")
        head.append("\r\n")
        data = "".join(head).encode("latin-1") + body
        for attempt in (1, 2):
            connection = await self._acquire()
            reused = connection.reused
            try:
                connection.writer.write(data)
                return await self._read_head(connection, method)
            except _Stale:
                connection.abort()
                if reused and attempt == 1:
                    continue  # the upstream had closed the idle connection; nothing was answered
                raise UpstreamProtocolError(
                    f"{self.host_header} closed the connection without answering"
                ) from None
            except BaseException:
                connection.abort()
                raise
        raise AssertionError("unreachable")

    async def _read_head(self, connection: _Connection, method: str) -> UpstreamResponse:
        reader = connection.reader
        while True:
            try:
                async with asyncio.timeout(self.read_timeout):
                    raw = await reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                raise UpstreamTimeoutError(
                    f"no response head within {self.read_timeout:g} s"
                ) from None
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _Stale from None
                raise UpstreamProtocolError("connection closed inside the response head") from None
            except ConnectionError:
                raise _Stale from None
            except asyncio.LimitOverrunError:
                raise UpstreamProtocolError(f"response head over {_MAX_HEAD} bytes") from None
            lines = raw[:-4].split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise UpstreamProtocolError(f"bad status line {lines[0][:60]!r}")
            status = int(parts[1])
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and other interim responses
            break
        headers: list[tuple[str, str]] = []
        length = -1
        chunked = False
        keep_alive = parts[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise UpstreamProtocolError(f"bad header line {line[:60]!r}")
            key = name.strip().lower().decode("latin-1")
            text = value.strip().decode("latin-1")
            headers.append((key, text))
            if key == "content-length":
                if not text.isdigit():
                    raise UpstreamProtocolError(f"bad content-length {text!r}")
                length = int(text)
            elif key == "transfer-encoding":
                chunked = "chunked" in text.lower()
            elif key == "connection":
                tokens = text.lower()
                if "close" in tokens:
                    keep_alive = False
                elif "keep-alive" in tokens:
                    keep_alive = True
        if method == "HEAD" or status in (204, 304):
            framing, length = "none", 0
        elif chunked:
            framing = "chunked"
        elif length >= 0:
            framing = "none" if length == 0 else "length"
        else:
            framing = "close"
        return UpstreamResponse(self, connection, status, headers, framing, length, keep_alive)

    async def aclose(self) -> None:
        """Close every idle connection; responses in flight close theirs when released."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abort()


class _Stale(Exception):
    """The connection ended before any byte of a response."""
