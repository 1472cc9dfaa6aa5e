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

`nomyo-router` serves with it; with plain uvicorn pass
`--http nomyo_router.protocol:GuardedHttpToolsProtocol`. The number of connections is
bounded by uvicorn's own `limit_concurrency` (`max_connections`; beyond it, 503).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .api.asgi import DISCONNECT_HOOK

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


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = _limits(self.app)
        self._max_head = int(limits["max_header_bytes"])
        self._head_timeout = limits["header_timeout"]
        self._body_timeout = limits["body_idle_timeout"]
        self._head_bytes = 0
        self._in_head = True
        self._timer: asyncio.TimerHandle | None = self.loop.call_later(self._head_timeout, self._expire, 408)

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
        if cycle is not None and cycle.disconnected:  # the client left mid-request: tell the app
            hook = cycle.scope.get(DISCONNECT_HOOK)
            if hook is not None:
                hook()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, status: int) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if status == 408 and self._in_head:
            self._refuse(b"408 Request Timeout")
        elif status == 0:  # body idle: the app gets a disconnect
            self.transport.close()

    def _refuse(self, status_line: bytes) -> None:
        self.transport.write(b"HTTP/1.1 " + status_line + b"\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            if self._timer is not None:  # a body piece arrived: the idle clock restarts
                self._timer.cancel()
                self._timer = self.loop.call_later(self._body_timeout, self._expire, 0)
            return super().data_received(data)
        self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self._max_head and not self.transport.is_closing():
            self._stop_timer()
            self._refuse(b"431 Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # the next request on a kept-alive connection
            self._in_head = True
            self._head_bytes = 0
            self._stop_timer()
            self._timer = self.loop.call_later(self._head_timeout, self._expire, 408)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_timer()
        self._timer = self.loop.call_later(self._body_timeout, self._expire, 0)
        super().on_headers_complete()
        if self.cycle is not None:  # the app may register a disconnect hook (api/asgi.py)
            self.cycle.scope[DISCONNECT_HOOK] = None

    def on_message_complete(self) -> None:
        self._stop_timer()
        super().on_message_complete()
