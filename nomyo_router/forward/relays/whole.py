"""Whole (non-stream) answers, and error answers of streams.

The router reads a whole answer before it sends a byte of it: a failure until then is retried
on another endpoint, and the answer goes out in one write (`send`, through `Exchange.whole`).
That holds all of it in memory — a hostile backend's 200 MiB answer cost the router +387 MB — so an
answer is held only up to a bound (`bound`). Beyond it (`finish`):

- an answer the router must read whole (translated to the Ollama API) is refused: 502
  `response_too_large` in the client's API shape, counted as the backend's failure;
- an answer passed through unchanged is relayed as it comes: what was read, then each read
  of the backend (with the backend's content-length, else chunked), so it costs a read or
  two of memory; the token counts come from its last KiB as before. A failure after the head
  went out cannot be retried: the client's connection is closed before the answer's end
  (uvicorn does that when the app returns mid-answer), so the part is never taken for the whole.
"""

from __future__ import annotations

from ... import h1
from ...api.errors import ApiError
from ...api.requests import GenRequest
from ...backends.health import Health
from ...config import RouterConfig
from ...domain import Endpoint
from ...server.asgi import Headers
from ..exchange import Exchange

HOLD = 1024 * 1024  # a pass-through answer up to this is held: one write, retried when cut


def bound(config: RouterConfig, translating: bool) -> tuple[int, bool]:
    """(the most bytes of a whole answer held, whether a larger one is relayed as it comes)."""
    if translating:
        return config.max_response_bytes, False
    return min(HOLD, config.max_response_bytes), True


async def send(
    ex: Exchange, req: GenRequest, resp: h1.Response, data: bytes, headers: Headers, translating: bool
) -> None:
    """Answer the client with a whole answer the router holds (`data`: all of `resp`'s body)."""
    resp.release()
    status = resp.status
    try:
        if translating:
            from .translated import whole  # (only Ollama requests to OpenAI backends: loaded when first needed)

            await whole(ex, req, status, data, headers)
        elif not ex.written(status, data, headers):  # (the common case: one direct write, no await)
            await ex.whole_asgi(status, data, headers)
    finally:  # (accounting once the answer left, or the client did: the backend did the work)
        if status == 200:
            ex.tokens(data)


async def relay_large(
    ex: Exchange,
    resp: h1.Response,
    translating: bool,
    config: RouterConfig,
    headers: Headers,
    health: Health,
    ep: Endpoint,
) -> None:
    """Answer the client for a whole answer `Response.hold` found larger than `bound`: refuse
    it (translated) or relay the rest of it, `resp`'s unread bytes first."""
    if translating:
        resp.close()
        limit = config.max_response_bytes
        health.failure(ep, f"an answer larger than max_response_bytes ({limit} bytes)")
        raise ApiError(
            502, f"the backend's answer is larger than max_response_bytes ({limit} bytes)", code="response_too_large"
        )
    h = list(headers)  # (its content-type and content-encoding are among them: proxy._FORWARDED)
    length = resp.headers.get("content-length")
    if length is not None:
        h.append((b"content-length", length.encode("latin-1")))
    before = last = b""  # the final counts may span the last two pieces
    try:
        await ex.start(resp.status, h)
        while piece := await resp.readany():
            before, last = last, piece
            await ex.body(piece)
    except (TimeoutError, h1.ClientError) as e:
        resp.close()
        ex.note_error("answer_cut")
        health.failure(ep, f"whole answer cut after its head went out: {type(e).__name__}")
        return  # without the answer's end: its connection is closed
    except BaseException:
        resp.close()  # the client left: closing the connection stops the backend
        raise
    resp.release()
    await ex.end()
    if resp.status == 200:
        ex.tokens(before + last)
