"""A small HTTP/1.1 server on asyncio + httptools, just enough for the mock.

Why not aiohttp's server: measured here, aiohttp's low-level server tops out near 16k
req/s for an empty handler on one core, and the mock must serve several times what a
router worker does (~5k) with room left for its own work. This one parses with
httptools (uvicorn's parser), writes each whole response with one `transport.write`,
and supports keep-alive, pipelining, chunked streaming with back-pressure, and
cancelling a handler when its client goes away.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import httptools

log = logging.getLogger("mock.http")

_REASONS = {s.value: s.phrase for s in HTTPStatus}


class Request:
    __slots__ = ("method", "path", "headers", "body", "transport", "keep_alive")

    def __init__(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        transport: asyncio.Transport,
        keep_alive: bool,
    ) -> None:
        self.method, self.path, self.headers, self.body = method, path, headers, body
        self.transport, self.keep_alive = transport, keep_alive

    async def read(self) -> bytes:
        return self.body


class Response:
    """A whole response, written at once."""

    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status, self.body, self.content_type, self.headers = status, body, content_type, headers

    def encode(self, keep_alive: bool) -> bytes:
        head = [
            f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
        ]
        if self.headers:
            head += [f"{k}: {v}" for k, v in self.headers.items()]
        if not keep_alive:
            head.append("Connection: close")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + self.body


def json_response(obj: object, status: int = 200) -> Response:
    """`obj` as a whole JSON answer."""
    return Response(status, json.dumps(obj).encode())


class StreamResponse:
    """A chunked response: `prepare`, then `write` pieces, then `write_eof`."""

    def __init__(self, headers: dict[str, str] | None = None, status: int = 200) -> None:
        self.status = status
        self.headers = headers or {}
        self._conn: HttpProtocol | None = None
        self._keep_alive = True

    async def prepare(self, request: Request) -> None:
        self._conn = request.transport.get_protocol()  # type: ignore[assignment]
        self._keep_alive = request.keep_alive
        head = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}", "Transfer-Encoding: chunked"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        if not request.keep_alive:
            head.append("Connection: close")
        await self._send(("\r\n".join(head) + "\r\n\r\n").encode())

    async def write(self, data: bytes) -> None:
        if data:
            await self._send(b"%x\r\n%b\r\n" % (len(data), data))

    async def write_eof(self) -> None:
        await self._send(b"0\r\n\r\n")

    # Without waiting (mock.ticker): the caller checks `writable()` first.
    def writable(self) -> bool:
        conn = self._conn
        return conn is not None and conn.transport is not None and not conn.paused and not conn.transport.is_closing()

    def gone(self) -> bool:
        conn = self._conn
        return conn is None or conn.transport is None or conn.transport.is_closing()

    def write_nowait(self, data: bytes) -> None:
        if data:
            self._conn.transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # type: ignore[union-attr]

    def write_eof_nowait(self) -> None:
        self._conn.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]

    async def _send(self, data: bytes) -> None:
        conn = self._conn
        if conn is None or conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("client went away")
        conn.transport.write(data)
        if conn.paused:
            await conn.drain()


Reply = Response | StreamResponse
Handler = Callable[[Request], Awaitable[Reply]]


class HttpProtocol(asyncio.Protocol):
    """One connection. Requests are handled one after another (pipelining keeps order)."""

    def __init__(self, handler: Handler, connections: set[HttpProtocol]) -> None:
        self.handler = handler
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.paused = False
        self._drain: asyncio.Future | None = None
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: stop its handler (frees slots, ends hangs)
        self._pending.clear()
        self.transport = None
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("client went away"))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(Response(400, b'{"error":"bad request"}').encode(False))
                self.transport.close()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def drain(self) -> None:
        if self.paused:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        req = Request(
            self.parser.get_method().decode(),
            path,
            self._headers,
            b"".join(self._body),
            self.transport,
            self.parser.should_keep_alive(),
        )
        self._pending.append(req)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while self._pending and self.transport is not None:
            req = self._pending.popleft()
            try:
                resp = await self.handler(req)
            except (asyncio.CancelledError, ConnectionError):
                return  # the client left
            except Exception:
                log.exception("handler failed")
                resp = Response(500, b'{"error":"internal error"}')
            if self.transport is None:
                return
            if isinstance(resp, Response):
                self.transport.write(resp.encode(req.keep_alive))
            if not req.keep_alive:
                self.transport.close()
                return


class Server:
    """A listening socket plus its open connections, so `close` really disconnects clients."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections: set[HttpProtocol] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self, host: str, port: int, backlog: int = 1024) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpProtocol(self.handler, self.connections), host, port, backlog=backlog, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
