"""One answer from the upstream client (pool.py), read as it arrives: what the proxy reads of
it, and the hand-over of its connection's socket to the compiled relay (relay/pump.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import httptools

from .connection import Conn
from .errors import TooLarge, record_too_large


class Keeper(Protocol):
    """Where a connection goes back when its answer was read whole (h1.Pool)."""

    def put(self, conn: Conn) -> None: ...


class Response:
    """One answer, read as it arrives: the subset of aiohttp's `ClientResponse` the proxy uses
    (`status`, `headers`, `read`, `release`, `close`, and `content.readany/readline/iter_any`)."""

    __slots__ = ("status", "headers", "_conn", "_pool", "_read_s", "_line", "_done")

    def __init__(self, conn: Conn, pool: Keeper, read_s: float | None) -> None:
        self.status = conn.status
        self.headers = conn.headers
        self._conn = conn
        self._pool = pool
        self._read_s = read_s
        self._line = b""  # what readline() read past the newline
        self._done = False

    @property
    def content(self) -> Response:
        """aiohttp's `resp.content.readany()` spelling (a property: an attribute pointing at
        the response itself was a reference cycle per answer, left to the cyclic collector)."""
        return self

    async def _more(self) -> bool:
        """Wait for body bytes; False at the end of the body."""
        c = self._conn
        while not c.chunks:
            if c.eof:
                return False
            if c.error is not None:
                raise c.error
            c.waiter = w = c.loop.create_future()
            if self._read_s or c.until is not None:
                c.arm(self._read_s)
            try:
                await w
            finally:
                c.waiter = None
        return True

    def _take(self) -> bytes:
        c = self._conn
        data = c.chunks[0] if len(c.chunks) == 1 else b"".join(c.chunks)
        c.chunks.clear()
        c.size = 0
        if c.paused and c.transport is not None:
            c.paused = False
            c.transport.resume_reading()
        return data

    async def readany(self) -> bytes:
        if self._line:
            data, self._line = self._line, b""
            return data
        c = self._conn
        if not c.chunks and (c.eof or not await self._more()):
            return b""
        return self._take()

    async def readline(self, limit: int = 0) -> bytes:
        """The next line, with its b"\\n" (the body's unterminated end; b"": no more). `limit`
        > 0: a longer line raises `TooLarge`. A long line's pieces are searched as they come
        and joined once (`buf += piece` and a search of all of it per read was quadratic)."""
        buf = self._line
        self._line = b""
        i = buf.find(b"\n")
        if i >= 0:
            self._line = buf[i + 1 :]
            return buf[: i + 1]
        parts, size = [buf], len(buf)
        while True:
            if limit and size > limit:
                raise record_too_large(limit)
            if not await self._more():
                return b"".join(parts)
            piece = self._take()
            i = piece.find(b"\n")
            if i >= 0:
                if limit and size + i + 1 > limit:
                    raise record_too_large(limit)
                self._line = piece[i + 1 :]
                parts.append(piece[: i + 1])
                return b"".join(parts)
            parts.append(piece)
            size += len(piece)

    async def read(self, limit: int = 0) -> bytes:
        """The rest of the body; `limit` > 0: a longer one raises `TooLarge`."""
        data = await self.hold(limit or (1 << 62), False)
        if data is None:
            raise TooLarge(f"an answer longer than {limit} bytes", "response_too_large")
        return data

    async def hold(self, limit: int, keep: bool) -> bytes | None:
        """The rest of the body if it is at most `limit` bytes; else None, having read a little
        more than `limit`, which `keep` puts back for `readany` (the caller relays the answer
        as it comes) or drops (it refuses it)."""
        parts = [self._line] if self._line else []
        size = len(self._line)
        self._line = b""
        c = self._conn
        # (no coroutine made to learn what is already known: a whole answer is usually all in)
        while c.chunks or (not c.eof and await self._more()):
            piece = self._take()
            parts.append(piece)
            size += len(piece)
            if size > limit:
                if keep:
                    self._line = b"".join(parts)
                return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def sink(self, fn: Callable[[bytes], bool] | None) -> None:
        """Body pieces go to `fn` as they arrive, one per read (relay/sinks.py); what it refuses
        (False), and what came before, waits for `readany`. None: back to `readany` only."""
        self._conn.sink = None if self._line or self._done else fn

    @property
    def read_s(self) -> float | None:
        return self._read_s

    def detach(self) -> tuple[int, bool] | None:
        """The connection's socket for relay/pump.py, which reads the rest of a chunked body
        itself: (fd, whether the connection may be reused after the body). Only between
        two chunks with nothing unread, else None (go on reading here). Reading through the
        transport pauses until `attach`. Not over TLS (the socket carries ciphertext)."""
        c = self._conn
        if (
            not c.edge
            or c.chunks
            or self._line
            or c.eof
            or c.error is not None
            or c.lost
            or c.paused
            or c.transport is None
            or c.headers.get("transfer-encoding") != "chunked"
        ):
            return None
        sock = c.transport.get_extra_info("socket")
        # (TLS: the bytes on the socket are ciphertext)
        if sock is None or c.transport.get_extra_info("ssl_object") is not None:
            return None
        c.transport.pause_reading()
        return sock.fileno(), c.parser.should_keep_alive()

    def attach(self, ended: bool, keep: bool) -> None:
        """After relay/pump.py read the body: `ended` — all of it (then `keep`: the connection may
        be reused). The parser starts afresh for the connection's next answer."""
        c = self._conn
        c.parser = httptools.HttpResponseParser(c)
        c.edge = False
        c.eof, c.keep = ended, ended and keep
        if not c.lost and c.transport is not None:
            c.transport.resume_reading()

    def unbound(self) -> None:
        """The request's bound (`within`) no longer applies: the rest of a stream is read
        within `sock_read` only."""
        self._conn.until = None

    def release(self) -> None:
        """Back to the pool if the whole answer was read and the connection may be reused."""
        if self._done:
            return
        self._done = True
        c = self._conn
        c.sink = None
        if c.eof and c.keep and not c.lost and not c.chunks and not self._line:
            self._pool.put(c)
        else:
            c.close()

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._conn.close()
