"""One keep-alive connection of the upstream client (pool.py) to a backend: an asyncio Protocol
that sends a request as one write and parses the answer with httptools into a list of body
pieces, waking one future per read (or handing each read to a sink: relay/sinks.py). Its timer
bounds the waiting reader (`arm`); `h1_response.Response` reads what it gathers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools

from .errors import Cut, Disconnected, Headers

HIGH_WATER = 256 * 1024  # buffered body bytes before reading pauses


class Conn(asyncio.Protocol):
    """One connection to a backend, reused for one request after another (Pool)."""

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
        """The body pieces of this read go to the sink as one piece (relay/sinks.py: one write to
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
