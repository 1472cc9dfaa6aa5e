"""Whole (non-stream) answers, and error answers of streams: two ways out, `Whole` and `Large`.

The router reads a whole answer before it sends a byte of it: a failure until then is retried
on another endpoint, and the answer goes out in one write (`Whole`, through `Exchange.whole`).
That holds all of it in memory — a hostile backend's 200 MiB answer cost the router +387 MB — so an
answer is held only up to a bound (`bound`). Beyond it (`Large`):

- an answer the router must read whole (translated to the Ollama API) is refused: 502
  `response_too_large` in the client's API shape, counted as the backend's failure;
- an answer passed through unchanged is relayed as it comes: what was read, then each read
  of the backend (with the backend's content-length, else chunked), so it costs a read or
  two of memory; the token counts come from its last KiB as before. A failure after the head
  went out cannot be retried: the client's connection is closed before the answer's end
  (uvicorn does that when the app returns mid-answer), so the part is never taken for the whole.
"""

from __future__ import annotations

from .. import h1
from ..api.errors import ApiError
from ..backends.health import Health
from ..config import RouterConfig
from .base import BackendAnswer
from .exchange import Exchange

HOLD = 1024 * 1024  # a pass-through answer up to this is held: one write, retried when cut


def bound(config: RouterConfig, translating: bool) -> tuple[int, bool]:
    """(the most bytes of a whole answer held, whether a larger one is relayed as it comes)."""
    if translating:
        return config.max_response_bytes, False
    return min(HOLD, config.max_response_bytes), True


class Whole:
    """A whole answer the router holds (`answer.data`: all of its body), in one write."""

    name = "whole"

    async def deliver(self, ex: Exchange, answer: BackendAnswer) -> None:
        resp, data = answer.resp, answer.data or b""
        resp.release()
        status = resp.status
        try:
            if not ex.written(status, data, answer.headers):  # (the common case: one direct write, no await)
                await ex.whole_asgi(status, data, answer.headers)
        finally:  # (accounting once the answer left, or the client did: the backend did the work)
            if status == 200:
                ex.tokens(data)


class Large:
    """A whole answer `Response.hold` found larger than `bound`: refused (translated) or the
    rest of it relayed as it comes, `resp`'s unread bytes first."""

    name = "large"

    def __init__(self, config: RouterConfig, health: Health) -> None:
        self.limit = config.max_response_bytes
        self.health = health

    async def deliver(self, ex: Exchange, answer: BackendAnswer) -> None:
        resp, ep = answer.resp, answer.ep
        if answer.translating:
            resp.close()
            limit = self.limit
            self.health.failure(ep, f"an answer larger than max_response_bytes ({limit} bytes)")
            raise ApiError(
                502,
                f"the backend's answer is larger than max_response_bytes ({limit} bytes)",
                code="response_too_large",
            )
        h = list(answer.headers)  # (its content-type and content-encoding are among them: proxy._FORWARDED)
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
            self.health.failure(ep, f"whole answer cut after its head went out: {type(e).__name__}")
            return  # without the answer's end: its connection is closed
        except BaseException:
            resp.close()  # the client left: closing the connection stops the backend
            raise
        resp.release()
        await ex.end()
        if resp.status == 200:
            ex.tokens(before + last)
