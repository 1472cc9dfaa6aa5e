"""A stream relayed as its bytes come: no record rewritten, none held back (resume_streams
off, or a stream that cannot be resumed: `continuation.resumable`). The way out `Passthrough`,
named "pump" in the record once the compiled pump carried the stream.

The pieces go from the backend's connection to the client's through sinks.py's sink, or the
compiled pump (pump.py) once the head and first chunk went out; both write through the
exchange's client writer (`Exchange.writer`), the pump to the socket that writer gives it.
What breaks the stream ends it with a last record in its own format: a cut or a stalled
backend gets the router's error record; the backend's own error record (error_record.py) is
relayed as it came, and nothing after it. An error record is looked for with one substring
search per read (the sink refuses a read holding `"error"`, so the task looks); one split
across two reads is not seen then, but at the end, in the stream's tail (which the final
counts are read from).
"""

from __future__ import annotations

from collections.abc import Awaitable

from .. import h1
from ..backends.health import Health
from ..events import Events
from ..h1.errors import ErrorRecord
from . import pump
from .base import BackendAnswer
from .error_record import CHECKS, blame, find, marked
from .exchange import Exchange
from .sinks import PlainSink, stream_error


async def to_its_end(
    ex: Exchange,
    answer: BackendAnswer,
    relaying: Awaitable[BaseException | bool | None],
    health: Health,
    events: Events,
) -> None:
    """Await `relaying`, `answer`'s stream relayed to the client (what broke it, or None or
    False), and settle it: what broke it is the backend's; its connection goes back to the
    pool, or is closed when the client left (that stops the backend)."""
    resp = answer.resp
    finished = False
    try:
        broke = await relaying
        if broke:
            ex.cut(broke)
            blame(health, events, answer.ep, answer.req.key, broke)
        finished = True
    finally:
        if finished:
            resp.release()  # back to the keep-alive pool
        else:
            resp.close()


class Passthrough:
    """`upstream`: where the compiled pump is kept (None: the relay stays in Python)."""

    name = "passthrough"

    def __init__(self, health: Health, events: Events, upstream: h1.Upstream | None) -> None:
        self.health, self.events, self.upstream = health, events, upstream

    def deliver(self, ex: Exchange, answer: BackendAnswer) -> Awaitable[None]:
        return to_its_end(ex, answer, self._relay(ex, answer), self.health, self.events)

    async def _relay(self, ex: Exchange, answer: BackendAnswer) -> BaseException | None:
        """Relay a 200 stream whose first chunk was read to the client; None when it ended
        well, else what broke it (the client was told)."""
        resp, upstream = answer.resp, self.upstream
        sep = b"\n\n" if dict.get(resp.headers, "content-type", "").startswith("text/event-stream") else b"\n"
        writer = ex.writer
        await ex.start(200, answer.headers)
        cut: BaseException | None = None
        flow = PlainSink(b"", writer, sep)  # the counts sit in the last record, which may span two chunks
        chunk = answer.first
        try:
            while True:
                error = None
                if marked(chunk):
                    start, end = find(chunk, sep)
                    if start >= 0:  # the backend's error record: relayed below, the stream ends there
                        error, chunk = ErrorRecord(chunk[start:end]), chunk[:start]
                if chunk:
                    flow.keep(chunk)
                    flow.busy = True
                    await ex.body(chunk)
                    flow.busy = False
                if error is not None:
                    raise error
                if writer is not None:
                    if upstream is not None:
                        ex.rec.relay = "pump"  # (the pump has it, or had it when it raises)
                        if await pump.relay(upstream, resp, writer, b"", b"", flow.keep, 0, CHECKS[sep]) is not None:
                            break
                        ex.rec.relay = self.name  # (not taken: the relay goes on in Python)
                    resp.sink(flow.take)
                chunk = await resp.content.readany()
                if not chunk:
                    break
        except (TimeoutError, h1.ClientError) as e:
            cut = e
            await ex.body(stream_error(resp, e))
        else:
            tail = flow.tail()
            if marked(tail):  # an error record split across two reads, sent already: still the backend's failure
                start, end = find(tail, sep)
                if start >= 0:
                    cut = ErrorRecord(tail[start:end])
            if cut is None:
                ex.tokens(tail)
        finally:
            resp.sink(None)
            ex.relayed(flow.records)  # (the backend's own counts, when it sent them, stand)
        await ex.end()
        return cut
