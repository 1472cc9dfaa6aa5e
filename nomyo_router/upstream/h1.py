"""The process's upstream HTTP/1.1 client: keep-alive connections per endpoint on asyncio
Protocols, `httptools` for parsing, bodies read as they arrive.

Why not aiohttp (it stays only for model management, imported when first used): per
request, aiohttp's client builds a request object, `request_info`, a multidict of headers, a
stream reader with its own buffering, timer contexts and several tasks' worth of state; it
was ~40% of a worker's CPU on short requests and most of the ~50 KB each open stream held
(issues 15 and 16). This client writes each request as one pre-built head plus the body,
parses the answer with httptools into a list of chunks, and wakes one future per read.

Discovery, health probes, /api/show, /api/status and unloading use it too (`fetch`: a
whole answer within a total timeout), through the same pools: aiohttp and the ~10 MB it
costs to import are not loaded by a worker that is not asked to manage models (issue 15).

What it does: requests with a content-length body (POST) or none (GET); responses with
content-length, chunked or close-delimited bodies, after any interim 1xx answers (read and
dropped, as HTTP/1.1 says; a 101 nobody asked for is a failure); keep-alive reuse (a
connection the backend closed while idle is noticed, and a request that finds its reused
connection dead before any byte of the answer is sent once more on a fresh one);
backpressure (reading pauses while 256 KiB are waiting); TLS through asyncio's `ssl`;
connect and per-read timeouts (aiohttp's `sock_connect` and `sock_read`). What it does not:
proxies from the environment (ignored by design, like the aiohttp session before it),
redirects, HEAD, streamed request bodies, compression (the router asks for identity),
HTTP/2.
Errors derive from `ClientError` (`errors.py`, with `Timeout` and `Headers`); `Timeout` has
the field names of aiohttp's `ClientTimeout` (which is accepted too).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import httptools

# (callers name these h1.ClientError, h1.Response, ...: re-exported)
from .errors import ClientError as ClientError
from .errors import Cut as Cut
from .errors import Disconnected as Disconnected
from .errors import Headers as Headers
from .errors import Timeout as Timeout
from .errors import TooLarge as TooLarge
from .errors import Unreachable as Unreachable
from .errors import record_too_large as record_too_large
from .h1_response import Response as Response

if TYPE_CHECKING:
    from ..domain import Endpoint
    from .native import Pump


class TimeoutLike(Protocol):
    """A request's connect and per-read limits in seconds (None: none): `Timeout`, or
    aiohttp's `ClientTimeout`, whose field names it has."""

    @property
    def sock_connect(self) -> float | None: ...
    @property
    def sock_read(self) -> float | None: ...


HIGH_WATER = 256 * 1024  # buffered body bytes before reading pauses
IDLE_S = 60.0  # an idle connection older than this is not reused (servers drop them)
FETCH_LIMIT = 64 * 1024 * 1024  # `fetch`'s answers (model lists, /api/show): a larger one is an error


class _Conn(asyncio.Protocol):
    __slots__ = (
        "transport",
        "parser",
        "chunks",
        "size",
        "status",
        "headers",
        "head",
        "waiter",
        "eof",
        "keep",
        "lost",
        "error",
        "paused",
        "got_bytes",
        "idle_since",
        "deadline",
        "timer",
        "sink",
        "read_s",
        "due",
        "until",
        "loop",
        "edge",
        "interim",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.chunks: list[bytes] = []  # usually 0 or 1 piece: a list is 56 B, a deque 600
        self.size = 0
        self.status = 0
        self.headers: Headers = Headers()
        self.head: asyncio.Future[None] | None = None  # resolved when the status and headers are in
        self.waiter: asyncio.Future[None] | None = None  # a reader waiting for body bytes
        self.eof = False  # the answer's body is complete
        self.keep = False  # ... and the connection may carry another request
        self.lost = False
        self.error: BaseException | None = None
        self.paused = False
        self.got_bytes = False  # any byte of the answer arrived
        self.idle_since = 0.0
        self.deadline = 0.0  # when the waiting reader times out (sock_read)
        self.timer: asyncio.TimerHandle | None = None  # one per connection, not one per read
        self.sink: Callable[[bytes], bool] | None = None  # takes body pieces as they arrive (Response.sink)
        self.read_s = 0.0
        self.due = 0.0  # when `timer` fires (at or before `deadline`)
        self.until: float | None = None  # the current request's bound (Pool.request's `within`)
        self.loop = asyncio.get_running_loop()  # (each get_running_loop() is a getpid() syscall)
        self.edge = False  # the last read ended with a chunk (Response.detach)
        self.interim = False  # an interim (1xx) answer is being read: it is dropped

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Cut("unexpected protocol upgrade from the backend"))
        except httptools.HttpParserError as e:
            self._fail(Cut(f"bad HTTP answer from the backend: {e}"))
        if self.edge and not data.endswith(b"\r\n"):  # (the next chunk's size line began)
            self.edge = False
        if self.sink is not None and self.chunks:
            self._offer()

    def _offer(self) -> None:
        """The body pieces of this read go to the sink as one piece (relay.py: one write to
        the client per read, however many chunks it held); a piece it refuses waits for the reader."""
        chunks = self.chunks
        if not self.sink(chunks[0] if len(chunks) == 1 else b"".join(chunks)):  # type: ignore[misc]
            self._wake()
            return
        chunks.clear()
        self.size = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        if self.timer is not None and self.read_s:  # the waiting reader's sock_read clock restarts
            self.deadline = self.loop.time() + self.read_s

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.eof:
            if self.head is not None and not self.head.done():
                self._fail(Disconnected("the backend closed the connection before answering"))
            elif "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", ""):
                self.eof = True  # a body delimited by the connection's end: it ends here
            else:
                self._fail(Cut("the backend closed the connection mid-answer"))
        self._wake()

    # ---- httptools callbacks ------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # interim answers (RFC 9110 15.2) precede the final one: dropped
            if status == 101:  # a protocol switch no request of ours asked for
                self._fail(Cut("the backend switched protocols (HTTP 101) unasked"))
            self.interim = True
            self.headers = Headers()
            return
        self.status = status
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.size += len(body)
        if self.size > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        if self.sink is None:  # (else data_received offers them to the sink first)
            self._wake()

    def on_chunk_header(self) -> None:
        self.edge = False

    def on_chunk_complete(self) -> None:
        self.edge = True

    def on_message_complete(self) -> None:
        if self.interim:  # (the end of a 1xx: the final answer follows)
            self.interim = False
            return
        self.eof = True
        self.keep = self.parser.should_keep_alive()
        self._wake()

    # ---- internals ------------------------------------------------------------------------------
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        self._wake()
        if self.transport is not None:
            self.transport.close()

    def start(self, data: bytes) -> asyncio.Future[None]:
        """Send one request; the future resolves when its status and headers are in."""
        assert self.transport is not None
        self.chunks.clear()
        self.size, self.status, self.headers = 0, 0, Headers()
        self.eof = self.keep = self.got_bytes = self.interim = False
        self.error = self.sink = None
        self.head = self.loop.create_future()
        self.transport.write(data)
        return self.head

    def arm(self, read_s: float | None) -> None:
        """The waiting reader times out `read_s` from now, or at the request's bound `until` if
        that is sooner. One timer per connection, moved lazily: it fires, finds the deadline
        moved on, and sleeps again (a call_later per read cost ~1 µs and ~1 KB per open
        stream; per request, with asyncio.timeout for the bound, ~9 µs)."""
        loop = self.loop
        when = loop.time() + read_s if read_s else None
        if self.until is not None and (when is None or self.until < when):
            when = self.until
        if when is None:
            return
        self.deadline = when
        self.read_s = read_s or 0.0
        if self.timer is not None:
            if self.due <= when:
                return
            self.timer.cancel()
        self.timer = loop.call_at(when, self._check)
        self.due = when

    def _check(self) -> None:
        self.timer = None
        w = self.waiter
        if w is None or w.done():
            return
        if self.loop.time() >= self.deadline:
            w.set_exception(TimeoutError("no data from the backend within sock_read or the request's bound"))
        else:
            self.timer = self.loop.call_at(self.deadline, self._check)
            self.due = self.deadline

    def close(self) -> None:
        self.lost = True
        self.sink = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Keep-alive connections to one endpoint."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        own = {k.lower() for k in headers}
        lines = [f"Host: {parts.netloc}"] if "host" not in own else []
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("content-length", "content-type")]
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), None)
        self._ctype = b"Content-Type: %s\r\n" % ctype.encode("latin-1") if ctype else b""
        self._idle: list[_Conn] = []

    def put(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _reuse(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            c = self._idle.pop()
            if not c.lost and now - c.idle_since < IDLE_S:
                return c
            c.close()
        return None

    async def _connect(self, connect_s: float | None) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self.ssl)
        except (OSError, TimeoutError) as e:
            raise Unreachable(f"cannot connect to {self.host}:{self.port}: {type(e).__name__}: {e}") from None
        return conn

    async def request(
        self,
        method: bytes,
        path: str,
        body: bytes | None,
        connect_s: float | None,
        read_s: float | None,
        ctype: str | None = None,
        within: float | None = None,
        extra: bytes = b"",
    ) -> Response:
        """`body` None: no body and no content headers (GET). `ctype`: the body's content type
        when it is not the endpoint's (JSON). `within`: seconds from now by which the head and
        every read of the answer must have come (TimeoutError), until `Response.unbound()` —
        asyncio.timeout's effect without its timer per request. `extra`: more header lines,
        each ending in CRLF (a trace's `traceparent`)."""
        target = (self.prefix + path).encode("latin-1")
        if body is None:
            data = b"".join((method, b" ", target, b" HTTP/1.1\r\n", self._head, extra, b"\r\n"))
        else:
            content_type = self._ctype if ctype is None else b"Content-Type: %s\r\n" % ctype.encode("latin-1")
            data = b"".join(
                (
                    method,
                    b" ",
                    target,
                    b" HTTP/1.1\r\n",
                    self._head,
                    extra,
                    content_type,
                    b"Content-Length: %d\r\n\r\n" % len(body),
                    body,
                )
            )
        conn = self._reuse()
        reused = conn is not None
        until = None if conn is None or within is None else conn.loop.time() + within
        while True:
            if conn is None:
                if within is not None and (connect_s is None or within < connect_s):
                    connect_s = within
                conn = await self._connect(connect_s)
                if until is None and within is not None:
                    until = conn.loop.time() + within
            head = conn.start(data)
            conn.until = until
            conn.waiter = head  # the head times out like a read (sock_read, or the bound)
            conn.arm(read_s)
            try:
                await head
            except BaseException as e:
                conn.waiter = None
                conn.close()
                if isinstance(e, Disconnected) and reused and not conn.got_bytes:
                    conn, reused = None, False  # the backend had dropped the idle connection
                    continue
                raise
            conn.waiter = None
            conn.head = None  # (a done future per open stream is memory for nothing)
            return Response(conn, self, read_s)

    def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()


class Upstream:
    """One per process: a `Pool` per endpoint, made on first use (keyed by the endpoint object,
    so a reloaded endpoint with a new URL or key gets a new pool; a removed one's goes with it)."""

    def __init__(self) -> None:
        self._pools: weakref.WeakKeyDictionary[Endpoint, Pool] = weakref.WeakKeyDictionary()
        self.pump: Pump | None = None  # native.py's, made on first use (it is closed with the pools)

    def pool(self, ep: Endpoint) -> Pool:
        """A pool for `ep`'s `url` and `headers`."""
        pool = self._pools.get(ep)
        if pool is None:
            pool = self._pools[ep] = Pool(ep.url, ep.headers)
        return pool

    async def post(
        self,
        ep: Endpoint,
        path: str,
        body: bytes,
        timeout: TimeoutLike,
        ctype: str | None = None,
        within: float | None = None,
    ) -> Response:
        """`within`: see `Pool.request`."""
        pool = self._pools.get(ep) or self.pool(ep)
        return await pool.request(b"POST", path, body, timeout.sock_connect, timeout.sock_read, ctype, within)

    async def fetch(
        self, ep: Endpoint, path: str, body: bytes | None = None, *, total: float | None
    ) -> tuple[int, Headers, bytes]:
        """A whole answer (status, headers, body) within `total` seconds (TimeoutError after):
        GET without a body, POST with one. TooLarge beyond FETCH_LIMIT bytes."""
        async with asyncio.timeout(total):
            resp = await self.pool(ep).request(b"GET" if body is None else b"POST", path, body, None, None)
            try:
                data = await resp.read(FETCH_LIMIT)
            except BaseException:
                resp.close()
                raise
        resp.release()
        return resp.status, resp.headers, data

    def close(self) -> None:
        if self.pump is not None:
            self.pump.close()
            self.pump = None
        for pool in list(self._pools.values()):
            pool.close()
        self._pools.clear()
