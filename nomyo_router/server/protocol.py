"""uvicorn's httptools protocol with bounds per connection.

uvicorn bounds neither the size of a request head with httptools nor the time a client may
take to send it or its body: a thousand connections trickling headers at 1 byte/s, or a
hundred sending an unfinished 1 MiB header, were held forever and their memory kept. This
subclass adds, per connection:

- a request head (request line + headers) larger than `max_header_bytes` (64 KiB) → 431
  and the connection is closed, however the head arrives: in many reads (counted as they
  come) or in one (measured once parsed, only when the read was larger than the limit);
- a head not complete within `header_timeout` (10 s) of its first byte (or of the
  connection) → 408 and closed;
- a body that idles longer than `body_idle_timeout` (30 s) between two pieces → closed
  (the app sees a disconnect);
- a body not whole within `body_timeout` (60 s) of its head → 408 and closed (the app sees
  a disconnect and frees what the request held). A body the app streams through as it
  arrives (a blob upload: `STREAMED_BODY` in the scope) has only the idle bound;
- a response the client stops reading: writing paused (the transport's buffer full) for
  `stream_idle_timeout` (60 s) while the app answers → the connection is aborted, so the
  app sees a disconnect: the request is cancelled, its slot freed, the backend's connection
  closed, and nothing is counted against the backend (the client's fault). Without it, a
  stream whose client stopped reading held its slot as long as the client held the socket.

While the app answers, the client's socket is read again (uvicorn pauses reading once more
than 64 KiB of body are waiting for the app, and resumes only at the app's next `receive()`,
which a request whose body is whole never makes): so a client that leaves — closes its
socket after a large body — is seen at once (its end of file), and the app's disconnect
hook cancels the request, instead of the socket waiting in CLOSE-WAIT until the backend
answered. A client gone before the app set its hook is remembered in the scope (`GONE`).

These bounds, and uvicorn's keep-alive timeout, are one deadline per connection, moved
lazily (one timer per connection, not 3–4 `call_later`/`cancel` pairs per request).

It also offers a synchronous writer (server/body_writer.py's `BodyWriter`, in the scope under
`BODY_WRITER`): the upstream client hands a relayed stream's pieces to it from its own data
callback (relay/sinks.py) instead of waking the request's task per chunk, and the proxy
writes a whole answer through it in one go. Any other response's head is held until its
body's first write or the end of the loop turn (`Cork`), so a response is one send, not two.

`nomyo-router` serves with it; with plain uvicorn pass
`--http nomyo_router.server.protocol:GuardedHttpToolsProtocol`. The number of connections is
bounded by uvicorn's own `limit_concurrency` (`max_connections`; beyond it, 503).
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .asgi import BODY_WRITER, DISCONNECT_HOOK, GONE, SHUTDOWN_HOOK, STREAMED_BODY, Scope
from .body_writer import BodyWriter, Cork
from .idle_spin import IdleSpin

log = logging.getLogger("nomyo_router.server.protocol")
DEFAULTS = {
    "max_header_bytes": 64 * 1024,
    "header_timeout": 10.0,
    "body_idle_timeout": 30.0,
    "body_timeout": 60.0,
    "stream_idle_timeout": 60.0,
}


def _router(app: object) -> object | None:
    """The running router, found through uvicorn's middleware wrappers (None: another app)."""
    for _ in range(8):
        router = getattr(app, "router", None)
        if getattr(router, "config", None) is not None:
            return router
        inner = getattr(app, "app", None)
        if inner is None:
            break
        app = inner
    return None


def _limits(router: object | None) -> dict[str, float]:
    """The router's configured limits (the defaults for another app)."""
    config = getattr(router, "config", None)
    if config is None:
        return dict(DEFAULTS)
    return {k: getattr(config, k, v) for k, v in DEFAULTS.items()}


NO_SPIN = IdleSpin(0.0)


class _LeanEvent:
    """What uvicorn asks of its two `asyncio.Event`s per connection (set, clear, wait), without
    the `deque` each `asyncio.Event` allocates (~630 B, so ~1.3 KB per open stream)."""

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
    (1,584 B), paid by every open connection."""

    __slots__ = (
        "max_head",
        "head_timeout",
        "body_timeout",
        "body_total",
        "body_end",
        "stall_timeout",
        "head_bytes",
        "chunk",
        "loose",
        "in_head",
        "timer",
        "due",
        "deadline",
        "status",
        "spin",
    )

    def __init__(self, limits: dict[str, float], spin: IdleSpin) -> None:
        self.max_head = int(limits["max_header_bytes"])
        self.head_timeout = limits["header_timeout"]
        self.body_timeout = limits["body_idle_timeout"]
        self.body_total = limits["body_timeout"]
        self.body_end = 0.0  # when this request's body must be whole
        self.stall_timeout = limits["stream_idle_timeout"]  # no write progress to the client while answering
        self.head_bytes = 0  # bytes read since this request's head began (at most: see `loose`)
        self.chunk = 0  # the size of the read being parsed
        self.loose = False  # head_bytes counts the whole read this head began in, not only its part
        self.in_head = True
        self.timer: asyncio.TimerHandle | None = None  # fires at `due`, at or before `deadline`
        self.due = 0.0
        self.deadline: float | None = None  # when this connection's current bound runs out ...
        self.status = 0  # ... and what then: 408 (head), BODY_IDLE or KEEP_ALIVE (closed), WRITE_STALL (aborted)
        self.spin = spin  # the worker's idle spin, armed when a request is read and when its answer ends


BODY_IDLE, KEEP_ALIVE, WRITE_STALL = 0, 1, 2
HEAD_TOO_LARGE = b"431 Request Header Fields Too Large"


class _HeadTooLarge(Exception):
    """Raised in the parser's callback to stop parsing a head that was refused (431)."""


def _scope(cycle: RequestResponseCycle) -> Scope:
    """The cycle's ASGI scope as the plain dict it is: uvicorn types it as a TypedDict of the
    spec's keys, without the router's own (the disconnect hook, the body writer)."""
    return cast(Scope, cycle.scope)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _lean(self.flow, "_is_writable_event")
        router = _router(self.app)
        g = self._g = _Guard(_limits(router), getattr(router, "idle_spin", NO_SPIN))
        self._arm(g.head_timeout, 408)

    def _unsupported_upgrade_warning(self) -> None:
        # `nomyo-router` serves with ws="none" (no WebSocket routes, ~2 MB less per worker): an
        # upgrade request is then answered as plain HTTP (405/404 on our routes). uvicorn would
        # log two warnings per such request, advising to install websockets; any client could
        # fill the log with them.
        pass

    def shutdown(self) -> None:
        """The server is stopping: an answer that would never end on its own is told to end
        (its scope's SHUTDOWN_HOOK); the others finish within shutdown_grace, as uvicorn lets them."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            hook = _scope(cycle).get(SHUTDOWN_HOOK)
            if hook is not None:
                hook()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None:
            scope = _scope(cycle)
            scope.pop(BODY_WRITER, None)  # (it refers to the cycle: no reference cycle left)
            if cycle.disconnected:  # the client left mid-request: tell the app
                hook = scope.get(DISCONNECT_HOOK)
                if hook is not None and hook is not GONE:
                    hook()
                elif DISCONNECT_HOOK in scope:
                    scope[DISCONNECT_HOOK] = GONE  # (no hook yet: the app finds this when it sets one)

    def _arm(self, delay: float, status: int) -> None:
        """The connection's one bound — its head's time, its body's idle gap, or keep-alive —
        now ends `delay` from now. One timer per connection, moved lazily (it fires, finds the
        deadline moved on, and sleeps again): a `call_later` and its `cancel` cost ~3 µs, and
        were paid four times per request (uvicorn's keep-alive timer included)."""
        self._arm_at(self.loop.time() + delay, status)

    def _arm_at(self, when: float, status: int) -> None:
        g = self._g
        g.deadline = when
        g.status = status
        if g.timer is not None:
            if g.due <= when:
                return
            g.timer.cancel()
        g.timer = self.loop.call_at(when, self._expire)
        g.due = when

    def _stop_timer(self) -> None:
        g = self._g
        g.deadline = None
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None

    def _expire(self) -> None:
        g = self._g
        g.timer = None
        if g.deadline is None or self.transport.is_closing():
            return
        if self.loop.time() < g.deadline:
            g.timer = self.loop.call_at(g.deadline, self._expire)
            g.due = g.deadline
        elif g.status == 408:
            if g.in_head:
                self._refuse(b"408 Request Timeout")
        elif g.status == WRITE_STALL:
            if self.flow.write_paused:
                log.info("closing a connection whose client read nothing for %gs of its answer", g.stall_timeout)
                self.transport.abort()  # (close() would wait for the client to take what is buffered)
        elif g.status == BODY_IDLE and g.deadline >= g.body_end:  # the body's total time is up
            cycle = self.cycle
            if cycle is not None and _scope(cycle).get(STREAMED_BODY):
                g.body_end = float("inf")  # (streamed through as it comes: only the idle bound)
                self._arm(g.body_timeout, BODY_IDLE)
            elif cycle is not None and not cycle.response_started:
                self._refuse(b"408 Request Timeout")  # (the app sees a disconnect)
            else:
                self.transport.close()
        else:  # body idle (the app gets a disconnect), or a kept-alive connection left idle
            self.transport.close()

    def _refuse(self, status_line: bytes) -> None:
        self.transport.write(b"HTTP/1.1 " + status_line + b"\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is not None:
            cork = cycle.transport
            if isinstance(cork, Cork) and cork.held is not None:
                cork.flush()  # (a held head leaves before anything we may write now)
        g = self._g
        g.chunk = len(data)
        if not g.in_head:
            if g.status == BODY_IDLE and g.deadline is not None:  # a body piece: the idle clock restarts
                self._arm_body(self.loop.time())
            return self._feed(data)
        g.head_bytes += len(data)
        self._feed(data)
        if g.in_head and g.head_bytes > g.max_head and not self.transport.is_closing():
            if g.loose and self._head_size() <= g.max_head:
                # (the read this head began in held the end of the request before it: count
                # the head's complete lines instead, and every read from now on in full)
                g.loose = False
                g.head_bytes = self._head_size()
            else:
                self._stop_timer()
                self._refuse(HEAD_TOO_LARGE)

    def _feed(self, data: bytes) -> None:
        """uvicorn's `data_received`, except that a head refused while it was parsed (431,
        already answered) is not answered again, nor logged as an invalid request."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport.is_closing():
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _head_size(self) -> int:
        """The size of the head parsed so far: its request line and complete header lines."""
        return len(self.url) + 16 + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _arm_body(self, now: float) -> None:
        """The body's bound: its idle gap from now, or its total time, whichever ends first."""
        g = self._g
        self._arm_at(min(now + g.body_timeout, g.body_end), BODY_IDLE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        g = self._g
        if not g.in_head:  # the next request on a kept-alive connection
            g.in_head = True
            g.head_bytes = g.chunk  # (its head began in this read: at most all of it is the head's)
            g.loose = True
            self._arm(g.head_timeout, 408)

    def on_headers_complete(self) -> None:
        g = self._g
        g.in_head = False
        if g.head_bytes > g.max_head and self._head_size() > g.max_head:  # (a large read: measure the head)
            self._stop_timer()
            self._refuse(HEAD_TOO_LARGE)
            raise _HeadTooLarge  # (stops the parser: no request starts)
        now = self.loop.time()
        g.body_end = now + g.body_total
        self._arm_body(now)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:  # the app may register a disconnect hook (server/asgi.py)
            cork = Cork(self.transport, self.loop)
            # (the cycle writes, closes and asks is_closing() of its transport: what Cork does)
            cycle.transport = cast(asyncio.Transport, cork)
            scope = _scope(cycle)
            scope[DISCONNECT_HOOK] = None
            scope[BODY_WRITER] = BodyWriter(self, cycle, cork)
            # uvicorn's message event, made a moment ago and not set: a lean one instead (set
            # directly, not through `_lean`'s look at the old one: ~0.4 µs less per request)
            cycle.message_event = _LeanEvent()  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        g = self._g
        g.deadline = None  # no bound while the app answers (the timer, if any, stays)
        g.spin.arm(len(self.tasks))  # the app's work and the backend's answer may come soon: keep polling for them
        super().on_message_complete()
        if self.cycle is not None and not self.pipeline:
            self.flow.resume_reading()  # watch the client's socket while the app answers (see above)

    def pause_writing(self) -> None:
        super().pause_writing()
        g = self._g
        if g.deadline is None and not g.in_head and self.cycle is not None and not self.cycle.response_complete:
            self._arm(g.stall_timeout, WRITE_STALL)  # the app is answering and the client takes nothing

    def resume_writing(self) -> None:
        super().resume_writing()
        g = self._g
        if g.status == WRITE_STALL:
            g.deadline = None  # the client reads again: no bound while the app answers

    def on_response_complete(self) -> None:
        if self.cycle is not None and self.cycle.response_complete:
            _scope(self.cycle).pop(BODY_WRITER, None)
        if self.pipeline or self.transport.is_closing():
            super().on_response_complete()
            return
        # uvicorn's own steps when no request is pipelined, with its keep-alive timer (a
        # call_later per request) replaced by this connection's deadline
        self.server_state.total_requests += 1
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        self._arm(self.timeout_keep_alive, KEEP_ALIVE)
        self._g.spin.arm(len(self.tasks))  # a client at low load sends its next request soon: keep polling for it
