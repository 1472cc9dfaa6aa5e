"""The compiled pump: the relay's fast path (one worker, 2,000 streams at 25 tokens a second).

sinks.py's sink already writes each read of the backend to the client from the connection's
callback, but that is still ~6 µs of Python per chunk beside the kernel's ~12 µs here
(bench/overload.py --floor), and at 50,000 chunks a second the two fill a core. `_pump.c`
does the same work — read, decode the chunked framing, write whole records to the client as
one chunk — for every ready stream in one call from the event loop, with no Python per
chunk. Python is told only of a stream's end, a cut, a client that cannot be written to, and,
every few KiB, of the bytes sent (kept for a resumption and the final counts).

A stream moves here from the Python relay between two chunks, once its head and first
chunk went out the usual way (the retry decisions and the response's head stay in Python),
and only when the backend's body is chunked, neither side speaks TLS (the sockets would
carry ciphertext), no record is being rewritten (no resumption seam, no usage event to
strip) and the client's transport has nothing queued. Its end goes back to Python: the
record left unterminated, then the final chunk through ASGI. Without the compiled module
(no C compiler when installed) everything stays in Python.

The backend's error record (error_record.py) is not written by the pump: it ends the stream
with `ErrorRecord`, for Python to resume or relay. A stream that makes no progress for
`sock_read` while the pump waits for the client's socket is the client's stall, not the
backend's: the client's connection is closed (the request is cancelled, nothing is counted
against the backend), where a silent backend is a TimeoutError as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..h1 import errors
from ..h1.errors import ErrorRecord
from .error_record import Check, find

if TYPE_CHECKING:
    from ..h1.pool import Attached
    from ..h1.response import Response
    from ..server.direct_writer import DirectWriter

try:
    from . import _pump
except ImportError:  # built without a C compiler: the relay stays in Python
    _pump = None  # type: ignore[assignment]

AVAILABLE = _pump is not None
SENT_LIMIT = 3072  # bytes written before Python takes them (about continuation.Sent's block)
BATCH = 16  # streams relayed per turn of the event loop, so new requests and first chunks
# are not queued behind a whole 5 ms tick's worth (bench/overload.py at 2,000 streams, added
# TTFT p99: +35 ms with 256, +19 ms with 16)
STALLED = -1  # (not a pump event) no progress for sock_read, waiting for the client's socket


class Pump:
    """One per `h1.Upstream` (so per event loop): the compiled pump, watched as one reader."""

    __slots__ = ("pump", "loop", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pump = _pump.Pump()
        self.loop = loop
        self.waiting: dict[int, tuple[asyncio.Future[int], Callable[[bytes], None]]] = {}
        loop.add_reader(self.pump.fileno(), self._ready)

    def _ready(self) -> None:
        pump = self.pump
        for handle, event in pump.run(BATCH):
            waiting = self.waiting.get(handle)
            if waiting is None:
                continue
            fut, keep = waiting
            if event == _pump.SENT:
                keep(pump.take(handle))
            elif not fut.done():
                fut.set_result(event)

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.remove_reader(self.pump.fileno())
        self.pump.close()


class PumpHolder(Protocol):
    """Where the process's pump is kept: `h1.Upstream`, one per event loop."""

    pump: Attached | None


def _pump_of(upstream: PumpHolder, loop: asyncio.AbstractEventLoop) -> Pump:
    pump = upstream.pump
    if not isinstance(pump, Pump):
        pump = upstream.pump = Pump(loop)
    return pump


async def relay(
    upstream: PumpHolder,
    resp: Response,
    writer: DirectWriter,
    sep: bytes,
    pending: bytes,
    keep: Callable[[bytes], None],
    limit: int = 0,
    check: Check | None = None,
) -> bytes | None:
    """Relay the rest of `resp`'s body to the client through the socket `writer` gives (a
    body_writer.BodyWriter), `pending` (a record's beginning) first. `sep`: records end with it
    and only whole ones are written (b"": bytes as they come). `keep` gets what was written,
    in order, a few KiB at a time. `limit`: max_record_bytes — a longer record raises
    errors.TooLarge (the pump holds no more than about that plus a read; 0: no limit). `check`:
    error_record.CHECKS[the records' separator] (None: error records are not looked for).

    None: not possible now, nothing done (go on in Python). Else the body's unterminated
    remainder (usually b""), once it ended. Raises errors.Cut when the backend cut it or sent a
    malformed body, ErrorRecord at the backend's error record (the records before it written),
    TimeoutError after `sock_read` without the backend's progress; when the client can no
    longer be written to, or took nothing for `sock_read`, its connection is aborted (the
    request is then cancelled)."""
    if not AVAILABLE or not writer.ready():
        return None
    client = writer.client_socket()  # (None under TLS, or with bytes queued: they go first)
    if client is None:
        return None
    detached = resp.detach()
    if detached is None:
        return None
    fd, reusable = detached
    loop = asyncio.get_running_loop()
    p = _pump_of(upstream, loop)
    try:
        handle = p.pump.add(fd, client.fileno(), sep, pending, SENT_LIMIT, limit, check)
    except OSError:
        resp.attach(False, False)
        raise errors.Cut("the backend's connection could not be relayed") from None
    fut: asyncio.Future[int] = loop.create_future()
    p.waiting[handle] = (fut, keep)
    idle = _Idle(p.pump, handle, fut, resp.read_s, loop) if resp.read_s else None
    event = 0
    try:
        event = await fut
    finally:
        del p.waiting[handle]
        if idle is not None:
            idle.stop()
        sent, rest, out = p.pump.remove(handle)
        if sent:
            keep(sent)
        ended = event in (_pump.END, _pump.END_DIRTY)
        if out and event not in (_pump.CLIENT, STALLED):
            writer.write_framed(out)  # what the client's socket had not taken goes first
        resp.attach(ended, reusable and event == _pump.END)
    if ended:
        return rest
    if event == _pump.ERROR and check is not None:
        end = find(rest, check.sep)[1]  # (the record starts `rest`)
        raise ErrorRecord(rest[:end] if end > 0 else rest)
    if event in (_pump.CLIENT, STALLED):
        writer.abort()  # its loss cancels this request (server.asgi.cancel_on_disconnect)
        await asyncio.sleep(5)
        raise asyncio.CancelledError("the client's connection failed")
    if event == _pump.LONG:
        raise errors.record_too_large(limit)
    raise errors.Cut(
        "the backend closed the connection mid-answer" if event == _pump.CUT else "bad chunked body from the backend"
    )


class _Idle:
    """sock_read while the pump has the stream: no read of the backend (nor a write to the
    client) for `read_s` fails the wait — with TimeoutError (the backend's silence), or STALLED
    when the pump is waiting for the client's socket (the client stopped reading). One timer,
    moved lazily (a class, not a closure that re-arms itself: that was a reference cycle per
    stream, left to the cyclic collector)."""

    __slots__ = ("pump", "handle", "fut", "read_s", "loop", "timer")

    def __init__(
        self, pump: _pump.Pump, handle: int, fut: asyncio.Future[int], read_s: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.pump, self.handle, self.fut, self.read_s, self.loop = pump, handle, fut, read_s, loop
        self.timer: asyncio.TimerHandle | None = loop.call_at(loop.time() + read_s, self.check)

    def check(self) -> None:
        due = self.pump.last(self.handle) + self.read_s
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self.check)
        elif self.fut.done():
            pass
        elif self.pump.blocked(self.handle):
            self.fut.set_result(STALLED)
        else:
            self.fut.set_exception(TimeoutError("no data from the backend within sock_read"))

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
