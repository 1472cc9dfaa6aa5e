"""Where a generation request meets the response cache (app.py calls `handler` for a request
whose body has a top-level `nomyo` field, and for every request while the cache is on).

The cost for a request that did not opt in: with the cache off, one lookup in the parsed
body's dict (`"nomyo" in req.body`, in app.py: constant, whatever the body's size; a
substring search of the raw body cost 7 µs on 22 KB); with it on, that lookup and one scan of
the headers (bench/cache.py).
"""

from __future__ import annotations

import functools

from ..api.asgi import Scope, Send, header
from ..api.requests import GenRequest
from ..events import RequestRecord
from . import keys
from .service import Handle, ResponseCache


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


async def _serve(cache: ResponseCache, handle: Handle, req: GenRequest, send: Send, rec: RequestRecord) -> None:
    await cache.serve(req, send, rec, handle)
