"""A relayed stream's pieces, from the backend's connection straight to the client's.

Per chunk, the ASGI path costs a future woken in the upstream client, a task switch, an
`http.response.body` message and uvicorn's `send` coroutine: at 2,000 streams × 25 tok/s
(50,000 chunks a second on one worker, issue 15) that was most of the worker's core.
When the server is our protocol (`nomyo_router.protocol.BodyWriter` in the scope), the relay
installs a sink on the upstream response (`h1.Response.sink`): what one read of the backend's
connection brought (however many chunks) is processed and written to the client in one
piece from the connection's data callback, and the request's task only wakes at the end, on
an error, or for a piece the sink refused. So a slow stream costs one callback per chunk,
and a fast one still one write per read (writing each chunk as it was parsed cost a send
per chunk, 20–30% more CPU per chunk at 32 zero-delay streams: reverted in 0c5711c).

The sink refuses while the client's transport is paused or gone, or while the task itself
has a piece in flight (so the order of the bytes never changes); refused pieces take the
ASGI path as before, which waits (back-pressure) or fails as uvicorn decides.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import usage
    from .resume import Seam, Sent


class Records:
    """Whole records only (NDJSON lines, SSE events), mended by a `Seam` after a resumption,
    stripped of the usage event the router asked for (`strip`), kept in `sent`."""

    __slots__ = ("sep", "seam", "sent", "strip", "pending", "busy", "writer", "plain")

    def __init__(self, sep: bytes, seam: Seam | None, sent: Sent, strip: usage.Strip | None,
                 writer: Any = None) -> None:
        self.sep, self.seam, self.sent, self.strip, self.writer = sep, seam, sent, strip, writer
        self.pending = b""  # a record's beginning, waiting for its end
        self.busy = False  # the task is sending a piece: the sink must not overtake it
        self.plain = seam is None and strip is None  # whole records go out as they came

    def feed(self, chunk: bytes) -> bytes:
        """What to send of `chunk` now (maybe nothing: no record ended in it)."""
        data = self.pending + chunk if self.pending else chunk
        sep = self.sep
        end = data.rfind(sep)
        if end < 0:
            self.pending = data
            return b""
        end += len(sep)
        out, self.pending = data[:end], data[end:]
        if self.seam is not None:
            out = b"".join(self.seam.record(r + sep) for r in out[:-len(sep)].split(sep))
        if self.strip is not None:
            out = self.strip.records(out, sep)
        if out:
            self.sent.add(out)
        return out

    def take(self, chunk: bytes) -> bool:
        """The sink: process and write `chunk` now, or refuse it (False)."""
        w = self.writer
        if self.busy or not w.ready():
            return False
        if self.plain and not self.pending and chunk.endswith(self.sep):  # whole records: as they are
            self.sent.add(chunk)
            w.write(chunk)
            return True
        out = self.feed(chunk)
        if out:
            w.write(out)
        return True


class Passthrough:
    """Bytes as they come; the last two pieces are kept (the final counts may span them)."""

    __slots__ = ("before", "last", "busy", "writer")

    def __init__(self, first: bytes, writer: Any = None) -> None:
        self.before, self.last = b"", first
        self.busy = False
        self.writer = writer

    def take(self, chunk: bytes) -> bool:
        w = self.writer
        if self.busy or not w.ready():
            return False
        self.keep(chunk)
        w.write(chunk)
        return True

    def keep(self, chunk: bytes) -> None:
        self.before, self.last = self.last, chunk

    def tail(self) -> bytes:
        return self.before + self.last


def _why(e: BaseException | None) -> str:
    return "backend stream failed: " + (type(e).__name__ if e is not None else
                                        "cut, and no other endpoint could continue it")


def ndjson_error(e: BaseException | None) -> bytes:
    return json.dumps({"error": _why(e)}).encode() + b"\n"


def stream_error(resp: Any, e: BaseException | None) -> bytes:
    """A last chunk telling the client the stream broke, in the stream's own format."""
    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
        msg = {"error": {"message": _why(e), "type": "server_error", "param": None, "code": "upstream_error"}}
        return b"data: " + json.dumps(msg).encode() + b"\n\n"
    return ndjson_error(e)
