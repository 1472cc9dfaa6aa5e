"""Where a generation request meets the response cache (app.py calls `handler` for a request
whose body has a top-level `nomyo` field, and for every request while the cache is on).

The cost for a request that did not opt in: with the cache off, one lookup in the parsed
body's dict (`"nomyo" in req.body`, in app.py: constant, whatever the body's size; a
substring search of the raw body cost 7 µs on 22 KB); with it on, that lookup and one scan of
the headers (bench/cache.py).

The request's answer leaves through its exchange (forward/exchange.py); the cache reads it on
its way out through a `send` of its own (`Exchange.via`), and answers a hit through the
client's `send`. The exchange is seen here only as the `ExchangeView` below (the cache does not import
the request path, which imports the cache).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

from ..api.requests import GenRequest
from ..events import RequestRecord
from ..server.asgi import Scope, Send, header
from . import keys

if TYPE_CHECKING:  # (made, and imported, only when the cache is on: runtime)
    from .service import ResponseCache


class ExchangeView(Protocol):
    """What the cache uses of a request's exchange."""

    @property
    def send(self) -> Send: ...
    @property
    def rec(self) -> RequestRecord: ...
    def via(self, send: Send) -> Self: ...


W = TypeVar("W", bound=ExchangeView)


def handler(
    cache: ResponseCache | None, scope: Scope, req: GenRequest, handle: Callable[[GenRequest, W], Awaitable[None]]
) -> Callable[[GenRequest, W], Awaitable[None]]:
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


async def _serve(
    cache: ResponseCache, handle: Callable[[GenRequest, W], Awaitable[None]], req: GenRequest, ex: W
) -> None:
    async def through(req: GenRequest, send: Send, rec: RequestRecord) -> None:
        await handle(req, ex.via(send))

    await cache.serve(req, ex.send, ex.rec, through)
