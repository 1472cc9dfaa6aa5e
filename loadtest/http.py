"""A minimal HTTP/1.1 client for load generation: keep-alive connections on asyncio
Protocols, httptools for parsing, body bytes handed to a callback as they arrive.

Why not aiohttp here: measured against the zero-delay mock, aiohttp's client spent its
whole core at ~7k non-stream req/s (c=64), less than 2x what one router worker serves,
so the load tester would have measured itself. This client builds each request once as
bytes and does no per-chunk task switching.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools


class ResponseHandler:
    """Receives one response. Subclasses override what they need."""

    def on_status(self, status: int) -> None: ...

    def on_header(self, name: bytes, value: bytes) -> None: ...

    def on_body(self, data: bytes) -> None: ...


class Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.handler: ResponseHandler | None = None
        self.done: asyncio.Future[bool] | None = None  # result: may the connection be reused?
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionResetError("connection closed before the response ended"))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.done is not None and not self.done.done():
                self.done.set_exception(ValueError(f"bad HTTP response: {e}"))
            self.close()

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        if self.handler is not None:
            self.handler.on_status(self.parser.get_status_code())

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.handler is not None:
            self.handler.on_header(name, value)

    def on_body(self, body: bytes) -> None:
        if self.handler is not None:
            self.handler.on_body(body)

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.parser.should_keep_alive())

    # use
    async def request(self, data: bytes, handler: ResponseHandler) -> None:
        assert self.transport is not None
        self.handler = handler
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        try:
            keep = await self.done
        finally:
            self.handler = None
        if not keep:
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Client:
    """Connections to one server, reused across requests (one per concurrent request)."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()

    def build(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        head = [
            f"POST {self.prefix}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        head += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(Connection, self.host, self.port, ssl=self.ssl)
        self._all.add(conn)
        return conn

    async def send(self, data: bytes, handler: ResponseHandler, on_sent: Callable[[], None] | None = None) -> None:
        conn = None
        while self._idle:
            c = self._idle.pop()
            if not c.closed:
                conn = c
                break
        if conn is None:
            conn = await self._connect()
        if on_sent is not None:
            on_sent()
        try:
            await conn.request(data, handler)
        except BaseException:
            conn.close()
            self._all.discard(conn)
            raise
        if conn.closed:
            self._all.discard(conn)
        else:
            self._idle.append(conn)

    def close(self) -> None:
        for c in self._all:
            c.close()
        self._all.clear()
        self._idle.clear()
