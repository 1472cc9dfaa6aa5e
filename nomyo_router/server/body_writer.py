"""How the server's protocol (server/protocol.py) writes a response: a corked transport, so a
response's head and body leave in one send, and the direct writer the relays and the proxy
use to write without going through ASGI messages (bench/overhead.py: see the CHANGELOG)."""

from __future__ import annotations

import asyncio
import socket
from operator import itemgetter

from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

_VALUE = itemgetter(1)  # a header's value
_LINE = b": ".join  # a header's line, without its end


class Cork:
    """The client's transport as one response's cycle sees it: the first thing the cycle
    writes (the head uvicorn builds at `http.response.start`) is held until its next write
    (the body) or the end of this loop turn, whichever is first. A whole response then leaves
    in one send — one packet for the client to wake up for, not two (bench/overhead.py
    --floor: see the CHANGELOG for the figures). A stream's head waits at most one turn."""

    __slots__ = ("transport", "loop", "held", "armed")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop  # (not get_running_loop(): on 3.11 each call is a getpid() syscall)
        self.held: bytes | None = None
        self.armed = True

    def write(self, data: bytes) -> None:
        held = self.held
        if held is not None:
            self.held = None
            self.transport.writelines((held, data))
        elif self.armed:
            self.armed = False
            self.held = data
            self.loop.call_soon(self.flush)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        held = self.held
        if held is not None:
            self.held = None
            if not self.transport.is_closing():
                self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class BodyWriter:
    """Writes a response's bytes now, as uvicorn's `send` would for the same ASGI messages,
    when it may.

    `write`: a piece of a started chunked response (an `http.response.body` message with
    `more_body`). `ready()` is False while the client's transport is paused (back-pressure) or
    closing, after a disconnect, before the head was sent or after the end, or once the
    connection moved on to another request; the caller then takes the ASGI path, which waits
    or fails as uvicorn decides.

    `whole`: a whole response with a content-length (`http.response.start` and one final body
    message) in one go, without the two message dicts and uvicorn's per-header checks
    (bench/overhead.py: see the CHANGELOG). False — nothing written — when the response has
    started, the client is gone or pushes back, the request is HEAD, uvicorn's access log is
    on (plain uvicorn: it is written in `send`), or a header value holds a control character
    (uvicorn raises for it): the caller then sends the same through ASGI."""

    __slots__ = ("proto", "cycle", "flow", "transport", "cork")

    def __init__(self, proto: HttpToolsProtocol, cycle: RequestResponseCycle, cork: Cork) -> None:
        self.proto, self.cycle, self.flow, self.transport, self.cork = proto, cycle, proto.flow, proto.transport, cork

    def ready(self) -> bool:
        cycle = self.cycle
        return (
            not self.flow.write_paused
            and cycle.chunked_encoding is True
            and not cycle.response_complete
            and not cycle.disconnected
            and cycle.response_started
            and self.proto.cycle is cycle
            and self.cork.held is None  # (the head has left)
            and not self.transport.is_closing()
        )  # (a write then could raise in the backend's callback)

    def write(self, data: bytes) -> None:
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def client_socket(self) -> socket.socket | None:
        """The client's socket, for the compiled pump to write the body's chunks to itself:
        None when nothing may be written around the transport — it speaks TLS (the socket
        carries ciphertext) or holds bytes not yet sent (they go first)."""
        t = self.transport
        if t.get_write_buffer_size() or t.get_extra_info("ssl_object") is not None:
            return None
        sock: socket.socket | None = t.get_extra_info("socket")
        return sock

    def write_framed(self, data: bytes) -> None:
        """Bytes already framed as the body's chunks (what the pump wrote, the socket not yet took)."""
        self.transport.write(data)

    def abort(self) -> None:
        """Close the client's connection now (the request is then cancelled)."""
        self.transport.abort()

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """`headers`: lower-case names (ours), content-type and content-length among them."""
        cycle = self.cycle
        if (
            cycle.response_started
            or cycle.disconnected
            or self.flow.write_paused
            or cycle.access_log
            or self.proto.cycle is not cycle
            or cycle.scope["method"] == "HEAD"
            or self.transport.is_closing()
        ):
            return False
        all_headers = cycle.default_headers + headers if cycle.default_headers else headers
        if HEADER_VALUE_RE.search(b"\t".join(map(_VALUE, all_headers))):  # (uvicorn would raise)
            return False
        # the head's lines joined in C, not a Python loop per header: 1.6 -> 1.4 µs for 8 headers
        # (never empty: content-type and content-length are there)
        head = b"\r\n".join(map(_LINE, all_headers))
        end = b"\r\n\r\n" if cycle.keep_alive else b"\r\nconnection: close\r\n\r\n"
        cycle.response_started = cycle.response_complete = True
        cycle.waiting_for_100_continue = False
        self.cork.flush()  # (a "100 Continue" it may hold leaves first)
        self.transport.write(b"".join((STATUS_LINE[status], head, end, body)))
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()
        return True
