"""A stream relayed as its bytes come: no record rewritten, none held back (resume_streams
off, or a stream that cannot be resumed: `resume.resumable`).

The pieces go from the backend's connection to the client's through relay/sinks.py's sink, or the
compiled pump (relay/pump.py) once the head and first chunk went out. What breaks the stream
ends it with a last record in its own format: a cut or a stalled backend gets the router's
error record; the backend's own error record (error_record.py) is relayed as it came, and
nothing after it. An error record is looked for with one substring search per read (the
sink refuses a read holding `"error"`, so the task looks); one split across two reads is not
seen then, but at the end, in the stream's tail (which the final counts are read from).
"""

from __future__ import annotations

from ... import h1
from ...h1.errors import ErrorRecord
from ...relay import pump as native
from ...relay.error_record import CHECKS, find, marked
from ...relay.sinks import Passthrough, stream_error
from ...server.asgi import Headers
from ..exchange import Exchange


async def relay(
    ex: Exchange, resp: h1.Response, first: bytes, headers: Headers, upstream: h1.Upstream | None = None
) -> BaseException | None:
    """Relay `resp` (a 200 stream whose `first` chunk was read) to the client; None when it
    ended well, else what broke it (the client was told). `upstream`: for the compiled pump
    (None: the relay stays in Python)."""
    sep = b"\n\n" if dict.get(resp.headers, "content-type", "").startswith("text/event-stream") else b"\n"
    writer = ex.writer
    await ex.start(200, headers)
    cut: BaseException | None = None
    flow = Passthrough(b"", writer, sep)  # the counts sit in the last record, which may span two chunks
    chunk = first
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
                if (
                    upstream is not None
                    and await native.relay(upstream, resp, writer, b"", b"", flow.keep, 0, CHECKS[sep]) is not None
                ):
                    break
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
