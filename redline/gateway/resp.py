"""A lean pipelined Redis connection for the quota check, the one Redis call on a request's path.

redis-py's asyncio client spends ~100 us of CPU per command on its pool, retry and timeout
wrappers (`bench.gateway_overhead`, cProfile); the quota check needs none of them: one EVALSHA
per request on one long-lived connection. `RespConnection` writes each command at once and
matches replies to callers in order (Redis answers a connection's commands in order), so
concurrent requests pipeline on the one socket instead of queueing for it. One timer per
command enforces the timeout; a timeout or a broken socket fails every command in flight (their
replies could no longer be matched) and the next command connects again.

Only plain `redis://host[:port][/db]` URLs (with an optional password) are spoken here;
`lean_url` says which, and the quota gate keeps redis-py for the rest (TLS, unix sockets).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote, urlsplit

Reply = bytes | int | list["Reply"] | None


class RespError(Exception):
    """Redis answered a command with an error reply (e.g. NOSCRIPT)."""


class RespConnectionError(OSError):
    """The connection failed, closed or timed out with commands in flight."""


@dataclass(frozen=True)
class Address:
    """Where and how to connect: host, port, database, password."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None


def lean_url(url: str) -> Address | None:
    """The address of a plain `redis://` URL; None for anything else (rediss, unix, options)."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or parts.query or not parts.hostname:
        return None
    path = parts.path.strip("/")
    if path and not path.isdigit():
        return None
    return Address(
        parts.hostname,
        parts.port or 6379,
        int(path or 0),
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
    )


def encode(args: tuple[str | bytes | int | float, ...]) -> bytes:
    """A command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Incomplete(Exception):
    """The buffer ends inside a reply: wait for more bytes."""


def parse(buffer: bytes, start: int = 0) -> tuple[Reply | RespError, int]:
    """One RESP2 reply at `start`: (reply, offset after it); _Incomplete when cut short."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        raise _Incomplete
    kind, line = buffer[start : start + 1], buffer[start + 1 : end]
    if kind == b"+":
        return line, end + 2
    if kind == b"-":
        return RespError(line.decode(errors="replace")), end + 2
    if kind == b":":
        return int(line), end + 2
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buffer) < stop + 2:
            raise _Incomplete
        return buffer[end + 2 : stop], stop + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, end + 2
        items: list[Reply] = []
        offset = end + 2
        for _ in range(count):
            item, offset = parse(buffer, offset)
            if isinstance(item, RespError):
                raise RespConnectionError(f"nested error reply: {item}")
            items.append(item)
        return items, offset
    raise RespConnectionError(f"unexpected reply type {kind!r}")


class _Protocol(asyncio.Protocol):
    """Feeds replies to the waiting futures, in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: deque[asyncio.Future[Reply]] = deque()
        self.buffer = b""
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (a stream transport: asyncio's, or uvloop's, which is none of
        asyncio's classes but has their methods)."""
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """Resolve every waiter whose reply is complete."""
        buffer = self.buffer + data if self.buffer else data
        offset = 0
        try:
            while self.waiters and offset < len(buffer):
                try:
                    reply, offset = parse(buffer, offset)
                except _Incomplete:
                    break
                waiter = self.waiters.popleft()
                if not waiter.done():
                    if isinstance(reply, RespError):
                        waiter.set_exception(reply)
                    else:
                        waiter.set_result(reply)
        except (RespConnectionError, ValueError) as exc:
            self.fail(RespConnectionError(f"unreadable reply from Redis: {exc}"))
            return
        self.buffer = buffer[offset:]

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail whatever is still waiting."""
        self.fail(RespConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def fail(self, exc: Exception) -> None:
        """Close the connection and fail every waiter with `exc`."""
        self.closed = True
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class RespConnection:
    """One pipelined connection, connected on first use and again after a failure."""

    def __init__(self, address: Address, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        a = self.address
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, a.host, a.port), self.timeout
            )
        except (OSError, TimeoutError) as exc:
            raise RespConnectionError(f"cannot connect to {a.host}:{a.port}: {exc}") from exc
        setup: list[tuple[str | bytes | int | float, ...]] = []
        if a.password is not None:
            setup.append(("AUTH", a.username, a.password) if a.username else ("AUTH", a.password))
        if a.db:
            setup.append(("SELECT", a.db))
        for command in setup:  # rare: a few round trips once per connection
            await self._send(protocol, command)
        return protocol

    async def _ready(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.closed:
            return protocol
        if self._connecting is None:  # one connect shared by every caller waiting for it
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            protocol = await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None
        self._protocol = protocol
        return protocol

    def _send(
        self, protocol: _Protocol, args: tuple[str | bytes | int | float, ...]
    ) -> asyncio.Future[Reply]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Reply] = loop.create_future()
        assert protocol.transport is not None
        protocol.waiters.append(waiter)
        protocol.transport.write(encode(args))
        # A late reply cannot be matched any more: a timeout closes the connection.
        timer = loop.call_later(
            self.timeout,
            protocol.fail,
            RespConnectionError(f"Redis did not answer within {self.timeout} s"),
        )
        waiter.add_done_callback(lambda _: timer.cancel())
        return waiter

    async def execute(self, *args: str | bytes | int | float) -> Reply:
        """Send one command and wait for its reply; RespError for an error reply,
        RespConnectionError (an OSError) when the connection fails or times out."""
        protocol = await self._ready()
        return await self._send(protocol, args)

    def close(self) -> None:
        """Close the connection (commands in flight fail)."""
        if self._protocol is not None:
            self._protocol.fail(RespConnectionError("closed"))
            self._protocol = None
