"""Where a generation request meets the response cache (app.py calls `handler` for a request
whose body has a top-level `nomyo` field, and for every request while the cache is on).

The cost for a request that did not opt in: with the cache off, one lookup in the parsed
body's dict (`"nomyo" in req.body`, in app.py: constant, whatever the body's size; a
substring search of the raw body cost 7 µs on 22 KB); with it on, that lookup and one scan of
the headers (bench/cache.py).

The request's answer leaves through its exchange (relay/exchange.py); the cache reads it on
its way out through a `send` of its own (`Exchange.via`), and answers a hit through the same
exchange, as the way out `relay.cached.Cached`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ..api.requests import GenRequest
from ..events import RequestRecord
from ..relay.exchange import Exchange, Handle
from ..server.asgi import Scope, Send, header
from . import keys

if TYPE_CHECKING:  # (made, and imported, only when the cache is on: runtime)
    from .service import ResponseCache


def handler(cache: ResponseCache | None, scope: Scope, req: GenRequest, handle: Handle) -> Handle:
    """`handle` itself, or the cache's flow around it when the request opted in. NOMYO's `nomyo`
    body field is taken out here in any case: it is for the router, never for a backend."""
    asked = keys.FIELD in req.body and keys.take_field(req)
    if cache is None:
        return handle
    if not asked:
        value = header(scope, keys.HEADER)
        if value is None or value.strip().lower() != b"use":
            return handle
    return functools.partial(_serve, cache, handle)


async def _serve(cache: ResponseCache, handle: Handle, req: GenRequest, ex: Exchange) -> None:
    async def through(req: GenRequest, send: Send, rec: RequestRecord) -> None:
        await handle(req, ex.via(send))

    await cache.serve(req, ex, through)
