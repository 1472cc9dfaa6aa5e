"""The process's upstream HTTP/1.1 client: keep-alive connections per endpoint on asyncio
Protocols, `httptools` for parsing, bodies read as they arrive.

Why not aiohttp (it stays only for model management, imported when first used): per
request, aiohttp's client builds a request object, `request_info`, a multidict of headers, a
stream reader with its own buffering, timer contexts and several tasks' worth of state:
py-spy put ~60% of a worker's CPU on short requests in it and uvicorn's HTTP handling together
(docs/benchmarks.md), and it was most of the ~50 KB each open stream held.
This client writes each request as one pre-built head plus the body, parses the answer with
httptools into a list of chunks, and wakes one future per read.

Discovery, health probes, /api/show, /api/status and unloading use it too (`fetch`: a
whole answer within a total timeout), through the same pools: aiohttp and the ~10 MB it
costs to import are not loaded by a worker that is not asked to manage models.

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
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from . import descriptors
from .connection import Conn

# (callers name these h1.ClientError, h1.Response, ...: re-exported)
from .errors import ClientError as ClientError
from .errors import Cut as Cut
from .errors import Disconnected as Disconnected
from .errors import Headers as Headers
from .errors import OutOfDescriptors as OutOfDescriptors
from .errors import Timeout as Timeout
from .errors import TooLarge as TooLarge
from .errors import Unreachable as Unreachable
from .errors import record_too_large as record_too_large
from .response import Response as Response

if TYPE_CHECKING:
    from ..domain import Endpoint


class TimeoutLike(Protocol):
    """A request's connect and per-read limits in seconds (None: none): `Timeout`, or
    aiohttp's `ClientTimeout`, whose field names it has."""

    @property
    def sock_connect(self) -> float | None: ...
    @property
    def sock_read(self) -> float | None: ...


IDLE_S = 60.0  # an idle connection older than this is not reused (servers drop them)
FETCH_LIMIT = 64 * 1024 * 1024  # `fetch`'s answers (model lists, /api/show): a larger one is an error


class Attached(Protocol):
    """What a relay keeps with the client and has closed with its pools (the compiled pump)."""

    def close(self) -> None: ...


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
        self._idle: list[Conn] = []

    def put(self, conn: Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _reuse(self) -> Conn | None:
        now = time.monotonic()
        while self._idle:
            c = self._idle.pop()
            if not c.lost and now - c.idle_since < IDLE_S:
                return c
            c.close()
        return None

    async def _connect(self, connect_s: float | None) -> Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(Conn, self.host, self.port, ssl=self.ssl)
        except (OSError, TimeoutError) as e:
            if e.errno in descriptors.EXHAUSTED or "Too many open files" in str(e):  # (or several addresses' errors)
                descriptors.exhausted("connect", f"to {self.host}:{self.port}")
                raise OutOfDescriptors(f"cannot connect to {self.host}:{self.port}: out of file descriptors") from None
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
        self.pump: Attached | None = None  # the relay's compiled pump, made on first use, closed with the pools

    def pool(self, ep: Endpoint) -> Pool:
        """A pool for `ep`'s `url` and `headers`."""
        pool = self._pools.get(ep)
        if pool is None:
            pool = self._pools[ep] = Pool(ep.url, ep.headers)
        return pool

    def post(
        self,
        ep: Endpoint,
        path: str,
        body: bytes,
        timeout: TimeoutLike,
        ctype: str | None = None,
        within: float | None = None,
    ) -> Coroutine[object, object, Response]:
        """`within`: see `Pool.request`. (Its coroutine, awaited by the caller: no frame of its
        own that every wake-up of the request passes through.)"""
        pool = self._pools.get(ep) or self.pool(ep)
        return pool.request(b"POST", path, body, timeout.sock_connect, timeout.sock_read, ctype, within)

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
