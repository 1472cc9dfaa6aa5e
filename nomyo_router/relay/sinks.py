"""A relayed stream's pieces, from the backend's connection straight to the client's.

Per chunk, the ASGI path costs a future woken in the upstream client, a task switch, an
`http.response.body` message and uvicorn's `send` coroutine: at 2,000 streams × 25 tok/s
(50,000 chunks a second on one worker) that was most of the worker's core.
When the server is our protocol (`nomyo_router.server.body_writer.BodyWriter` in the scope), the relay
installs a sink on the upstream response (`h1.Response.sink`): what one read of the backend's
connection brought (however many chunks) is processed and written to the client in one
piece from the connection's data callback, and the request's task only wakes at the end, on
an error, or for a piece the sink refused. So a slow stream costs one callback per chunk,
and a fast one still one write per read (writing each chunk as it was parsed cost a send
per chunk, 20–30% more CPU per chunk at 32 zero-delay streams, so that was undone).

The sink refuses while the client's transport is paused or gone, or while the task itself
has a piece in flight (so the order of the bytes never changes); refused pieces take the
ASGI path as before, which waits (back-pressure) or fails as uvicorn decides.

`PlainSink` is the sink of a stream relayed as it comes (relay/passthrough.py);
`Records` and `relay_records`, the record-wise relay: whole records only, rewritten when a
resumption's seam or a stripped usage event needs it (resumable.py). Either
hands a plain stream to the compiled pump (pump.py) when it can.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .. import h1
from ..h1.errors import ErrorRecord, TooLarge, record_too_large
from ..server.direct_writer import DirectWriter
from . import pump
from .error_record import CHECKS, find, marked

if TYPE_CHECKING:
    from . import token_counts
    from .continuation import Continuation, Sent


class Records:
    """Whole records only (NDJSON lines, SSE events), mended by a `Continuation` after a resumption,
    stripped of the usage event the router asked for (`strip`), kept in `sent`.

    A record's beginning waits for its end in `head` (one piece) or `parts` (more: the pieces
    as they came, joined once when the end comes). Only each new piece is searched for the
    separator, so every byte is looked at once however long the record (`pending + chunk` and
    an `rfind` over all of it per read was quadratic: a hostile 200 MiB line blocked the event
    loop for 84 s). A record that grows beyond `limit` bytes (max_record_bytes) raises
    `TooLarge`, so a stream holds at most about `limit` plus one read. A record that begins and
    ends within one read is not measured: it costs no more than the read.

    An error record (error_record.py) ends the stream: the records before it go out, it is
    kept in `error` (not sent, not in `sent`), what follows it is dropped."""

    __slots__ = ("sep", "seam", "sent", "strip", "head", "parts", "held", "limit", "busy", "writer", "plain", "error")

    def __init__(
        self,
        sep: bytes,
        seam: Continuation | None,
        sent: Sent,
        strip: token_counts.Strip | None,
        writer: DirectWriter | None = None,
        limit: int = 0,
    ) -> None:
        self.sep, self.seam, self.sent, self.strip, self.writer = sep, seam, sent, strip, writer
        self.head = b""  # a record's beginning, in one piece, waiting for its end
        self.parts: list[bytes] = []  # ... or in several (then `head` is empty)
        self.held = 0  # the length of `parts`
        self.limit = limit or sys.maxsize  # (0: none)
        self.busy = False  # the task is sending a piece: the sink must not overtake it
        self.plain = seam is None and strip is None  # whole records go out as they came
        self.error: bytes | None = None  # the backend's error record that ended the stream

    @property
    def pending(self) -> bytes:
        """A record's beginning (pump.py takes it over, and gives back what is left)."""
        return self.head or b"".join(self.parts)

    @pending.setter
    def pending(self, data: bytes) -> None:
        self.head, self.parts, self.held = data, [], 0

    def feed(self, chunk: bytes) -> bytes:
        """What to send of `chunk` now (maybe nothing: no record ended in it). Raises
        `TooLarge`, changing nothing, when a record grows beyond `limit`."""
        sep = self.sep
        end = chunk.rfind(sep)
        if end >= 0 and not self.parts:  # the common case: records end in `chunk`, one piece waited at most
            end += len(sep)
            head = self.head
            if len(head) + len(chunk) > self.limit:
                self._measure(chunk, end)
            out, self.head = head + chunk[:end], chunk[end:]
        elif self.head or self.parts:
            out = self._join(chunk, end)
            if not out:
                return b""
        else:  # a record begins, and waits
            if len(chunk) > self.limit:
                raise self._too_large()
            self.head = chunk
            return b""
        if marked(out):  # rare: maybe the backend's error record (a crashed model runner)
            start, end = find(out, sep)
            if start >= 0:
                self.error, out = out[start:end], out[:start]
                if not out:
                    return b""
        if self.seam is not None:
            out = b"".join(self.seam.record(r + sep) for r in out[: -len(sep)].split(sep))
        if self.strip is not None:
            out = self.strip.records(out, sep)
        if out:
            self.sent.add(out)
        return out

    def _join(self, chunk: bytes, end: int) -> bytes:
        """`feed` when no separator is in `chunk` or a record's beginning waits in pieces:
        the records that end now, whole (b"": none); the rest waits."""
        parts, sep = self.parts, self.sep
        if self.head:
            parts.append(self.head)
            self.held, self.head = len(self.head), b""
        held = self.held + len(chunk)
        if end >= 0:
            stop = end + len(sep)  # just past the last separator
        elif parts and len(sep) == 2 and parts[-1][-1:] == sep[:1] and chunk[:1] == sep[1:]:
            stop = 1  # the separator began in the last piece
        else:
            if held > self.limit:
                raise self._too_large()
            parts.append(chunk)
            self.held = held
            return b""
        if held > self.limit:
            self._measure(chunk, stop)
        parts.append(chunk[:stop])
        out = b"".join(parts)
        parts.clear()
        self.held, self.head = 0, chunk[stop:]
        return out

    def _measure(self, chunk: bytes, stop: int) -> None:
        """Raise `TooLarge` if the waiting record, which ends in `chunk`, or what follows the
        last separator (`chunk[stop:]`) is longer than the limit (asked only when all of it
        together is)."""
        sep, parts = self.sep, self.parts
        waiting, last = (self.held, parts[-1]) if parts else (len(self.head), self.head)
        if waiting:
            edge = len(sep) == 2 and last[-1:] == sep[:1] and chunk[:1] == sep[1:]
            if waiting + (1 if edge else chunk.find(sep) + len(sep)) > self.limit:
                raise self._too_large()
        if len(chunk) - stop > self.limit:
            raise self._too_large()

    def ended(self) -> bool:
        """An error record ended the stream (kept in `error`)."""
        return self.error is not None

    def _too_large(self) -> TooLarge:
        return record_too_large(self.limit)

    def take(self, chunk: bytes) -> bool:
        """The sink: process and write `chunk` now, or refuse it (False)."""
        w = self.writer
        if self.busy or w is None or not w.ready():
            return False
        if self.plain and not self.head and not self.parts and chunk.endswith(self.sep) and not marked(chunk):
            self.sent.add(chunk)  # whole records, none an error: as they are
            w.write(chunk)
            return True
        try:
            out = self.feed(chunk)
        except TooLarge:
            return False  # the task's own read feeds it again, where the stream can end
        if out:
            w.write(out)
        if self.error is None:
            return True
        self.busy = True  # an error record: nothing more is fed here; the refusal wakes the task to end the stream
        return False


class PlainSink:
    """Bytes as they come; the last two pieces are kept (the final counts may span them), the
    records ended in them counted (the count when the backend's is missing)."""

    __slots__ = ("before", "last", "busy", "writer", "sep", "lines")

    def __init__(self, first: bytes, writer: DirectWriter | None = None, sep: bytes = b"\n") -> None:
        self.before, self.last = b"", first
        self.busy = False
        self.writer = writer
        self.sep = sep
        self.lines = 0

    def take(self, chunk: bytes) -> bool:
        w = self.writer
        if self.busy or w is None or not w.ready() or marked(chunk):  # (maybe an error record: the task looks)
            return False
        self.keep(chunk)
        w.write(chunk)
        return True

    def keep(self, chunk: bytes) -> None:
        self.before, self.last = self.last, chunk
        self.lines += chunk.count(b"\n")  # (a byte counted: twice as fast as a two-byte separator)

    @property
    def records(self) -> int:
        """Records relayed so far (NDJSON lines; SSE events: a `data:` line and a blank one)."""
        return self.lines // len(self.sep)

    def tail(self) -> bytes:
        return self.before + self.last


def _why(e: BaseException | bool | None) -> str:
    """`e`: what broke the stream; True or None: a cut no other endpoint could continue."""
    if isinstance(e, TooLarge):
        return "backend stream failed: " + str(e)
    if isinstance(e, TimeoutError):
        return "backend stream failed: the backend went silent mid-answer for longer than stream_idle_timeout (wedged?)"
    return "backend stream failed: " + (
        type(e).__name__ if isinstance(e, BaseException) else "cut, and no other endpoint could continue it"
    )


def ndjson_error(e: BaseException | bool | None) -> bytes:
    return json.dumps({"error": _why(e)}).encode() + b"\n"


def stream_error(resp: h1.Response, e: BaseException | bool | None) -> bytes:
    """A last chunk telling the client the stream broke, in the stream's own format: the
    backend's own error record when that is what broke it."""
    if isinstance(e, ErrorRecord):
        return e.record
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        msg = {"error": {"message": _why(e), "type": "server_error", "param": None, "code": "upstream_error"}}
        return b"data: " + json.dumps(msg).encode() + b"\n\n"
    return ndjson_error(e)


async def relay_records(
    resp: h1.Response,
    first: bytes,
    sep: bytes,
    seam: Continuation | None,
    sent: Sent,
    body: Callable[[bytes], Awaitable[None]],
    strip: token_counts.Strip | None = None,
    writer: DirectWriter | None = None,
    upstream: h1.Upstream | None = None,
    limit: int = 0,
) -> BaseException | None:
    """The record-wise relay: send whole records of `resp` on through `body` (keeping what was
    sent in `sent`); None when the stream ended, else what broke it. With a `writer`, pieces
    go from the connection's callback straight to the client (`Records.take`); with
    `upstream` too, the rest of a plain stream goes through the compiled pump (pump.py).
    `limit`: max_record_bytes (h1.TooLarge beyond it)."""
    whole = Records(sep, seam, sent, strip, writer, limit)
    chunk = first
    try:
        # (`ended()`, not `whole.error is None`: a narrowed attribute stays narrowed across
        # `feed`, which sets it, and the compiled build checks the narrowed type)
        while chunk and not whole.ended():  # (an error record the sink met: `chunk` was fed there)
            out = whole.feed(chunk)
            if out:
                whole.busy = True
                await body(out)
                whole.busy = False
            if whole.ended():
                break
            if writer is not None:
                if upstream is not None and whole.plain:
                    rest = await pump.relay(upstream, resp, writer, sep, whole.pending, sent.add, limit, CHECKS[sep])
                    if rest is not None:
                        whole.pending = rest
                        break
                resp.sink(whole.take)
            chunk = await resp.content.readany()
    except (TimeoutError, h1.ClientError) as e:
        return e
    finally:
        resp.sink(None)
    if whole.error is not None:
        return ErrorRecord(whole.error)
    rest = whole.pending
    if rest:  # a last record without its terminator
        await body(rest)
    return None
