"""uvicorn's httptools protocol with bounds per connection (issue 10).

uvicorn bounds neither the size of a request head with httptools nor the time a client may
take to send it or its body: a thousand connections trickling headers at 1 byte/s, or a
hundred sending an unfinished 1 MiB header, were held forever and their memory kept. This
subclass adds, per connection:

- a request head (request line + headers) larger than `max_header_bytes` (64 KiB) → 431
  and the connection is closed;
- a head not complete within `header_timeout` (10 s) of its first byte (or of the
  connection) → 408 and closed;
- a body that idles longer than `body_idle_timeout` (30 s) between two pieces → closed
  (the app sees a disconnect).

It also offers the relay a synchronous writer of body pieces (`BodyWriter`, in the scope
under `BODY_WRITER`): the upstream client hands a relayed stream's pieces to it from its own
data callback (upstream/relay.py) instead of waking the request's task per chunk.

`nomyo-router` serves with it; with plain uvicorn pass
`--http nomyo_router.protocol:GuardedHttpToolsProtocol`. The number of connections is
bounded by uvicorn's own `limit_concurrency` (`max_connections`; beyond it, 503).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .api.asgi import BODY_WRITER, DISCONNECT_HOOK

DEFAULTS = {"max_header_bytes": 64 * 1024, "header_timeout": 10.0, "body_idle_timeout": 30.0}


def _limits(app: Any) -> dict[str, float]:
    """The router's configured limits, found through uvicorn's middleware wrappers."""
    for _ in range(8):
        router = getattr(app, "router", None)
        config = getattr(router, "config", None)
        if config is not None:
            return {k: getattr(config, k, v) for k, v in DEFAULTS.items()}
        app = getattr(app, "app", None)
        if app is None:
            break
    return dict(DEFAULTS)


class _LeanEvent:
    """What uvicorn asks of its two `asyncio.Event`s per connection (set, clear, wait), without
    the `deque` each `asyncio.Event` allocates (~630 B, so ~1.3 KB per open stream, issue 16)."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._value = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if not self._value:
            self._value = True
            waiters, self._waiters = self._waiters, None
            for fut in waiters or ():
                if not fut.done():
                    fut.set_result(None)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        if self._value:
            return True
        fut = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if self._waiters is not None and fut in self._waiters:
                self._waiters.remove(fut)
        return True


def _lean(obj: object, name: str) -> None:
    """Swap uvicorn's `asyncio.Event` attribute for a `_LeanEvent` in the same state."""
    ev = getattr(obj, name, None)
    if isinstance(ev, asyncio.Event):
        setattr(obj, name, _LeanEvent(ev.is_set()))


class _Guard:
    """This connection's bounds and where it is. One attribute on the protocol: uvicorn's
    protocol has 27; a 30th turns its shared-key `__dict__` (296 B) into a full one
    (1,584 B), paid by every open connection (issue 16)."""

    __slots__ = ("max_head", "head_timeout", "body_timeout", "head_bytes", "in_head", "timer")

    def __init__(self, limits: dict[str, float]) -> None:
        self.max_head = int(limits["max_header_bytes"])
        self.head_timeout = limits["header_timeout"]
        self.body_timeout = limits["body_idle_timeout"]
        self.head_bytes = 0
        self.in_head = True
        self.timer: asyncio.TimerHandle | None = None


class BodyWriter:
    """Writes pieces of a started chunked response now, as uvicorn's `send` would for an
    `http.response.body` message with `more_body` — when it may: `ready()` is False while
    the client's transport is paused (back-pressure) or closing, after a disconnect, before
    the head was sent or after the end, or once the connection moved on to another request;
    the caller then takes the ASGI path, which waits or fails as uvicorn decides."""

    __slots__ = ("proto", "cycle", "flow", "transport")

    def __init__(self, proto: "GuardedHttpToolsProtocol", cycle: Any) -> None:
        self.proto, self.cycle, self.flow, self.transport = proto, cycle, proto.flow, proto.transport

    def ready(self) -> bool:
        cycle = self.cycle
        return (not self.flow.write_paused and cycle.chunked_encoding is True and not cycle.response_complete
                and not cycle.disconnected and cycle.response_started and self.proto.cycle is cycle
                and not self.transport.is_closing())  # (a write then could raise in the backend's callback)

    def write(self, data: bytes) -> None:
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _lean(self.flow, "_is_writable_event")
        g = self._g = _Guard(_limits(self.app))
        g.timer = self.loop.call_later(g.head_timeout, self._expire, 408)

    def _unsupported_upgrade_warning(self) -> None:
        # `nomyo-router` serves with ws="none" (no WebSocket routes, ~2 MB less per worker): an
        # upgrade request is then answered as plain HTTP (405/404 on our routes). uvicorn would
        # log two warnings per such request, advising to install websockets; any client could
        # fill the log with them.
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None:
            cycle.scope.pop(BODY_WRITER, None)  # (it refers to the cycle: no reference cycle left)
            if cycle.disconnected:  # the client left mid-request: tell the app
                hook = cycle.scope.get(DISCONNECT_HOOK)
                if hook is not None:
                    hook()

    def _stop_timer(self) -> None:
        g = self._g
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None

    def _expire(self, status: int) -> None:
        self._g.timer = None
        if self.transport.is_closing():
            return
        if status == 408 and self._g.in_head:
            self._refuse(b"408 Request Timeout")
        elif status == 0:  # body idle: the app gets a disconnect
            self.transport.close()

    def _refuse(self, status_line: bytes) -> None:
        self.transport.write(b"HTTP/1.1 " + status_line + b"\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        g = self._g
        if not g.in_head:
            if g.timer is not None:  # a body piece arrived: the idle clock restarts
                g.timer.cancel()
                g.timer = self.loop.call_later(g.body_timeout, self._expire, 0)
            return super().data_received(data)
        g.head_bytes += len(data)
        super().data_received(data)
        if g.in_head and g.head_bytes > g.max_head and not self.transport.is_closing():
            self._stop_timer()
            self._refuse(b"431 Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        g = self._g
        if not g.in_head:  # the next request on a kept-alive connection
            g.in_head = True
            g.head_bytes = 0
            self._stop_timer()
            g.timer = self.loop.call_later(g.head_timeout, self._expire, 408)

    def on_headers_complete(self) -> None:
        g = self._g
        g.in_head = False
        self._stop_timer()
        g.timer = self.loop.call_later(g.body_timeout, self._expire, 0)
        super().on_headers_complete()
        if self.cycle is not None:  # the app may register a disconnect hook (api/asgi.py)
            self.cycle.scope[DISCONNECT_HOOK] = None
            self.cycle.scope[BODY_WRITER] = BodyWriter(self, self.cycle)
            _lean(self.cycle, "message_event")

    def on_message_complete(self) -> None:
        self._stop_timer()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self.cycle is not None and self.cycle.response_complete:
            self.cycle.scope.pop(BODY_WRITER, None)
        super().on_response_complete()
