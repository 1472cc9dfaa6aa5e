"""The one interface every way out implements: a `Relay` delivers one answer to the client
through the request's `Exchange` (relay/exchange.py), which is the only one that calls it
(`Exchange.relay`) and the only way bytes reach the client.

What a relay is given is one object, not a list of parameters: a `BackendAnswer` (a backend's
response to one attempt, its first chunk or all of it read) for the relays of backends'
answers — whole, large, assembled, passthrough (and the pump), resumed, translated — or a
`ReadyAnswer` (bytes already made) for the response cache's answer and errors.

A Protocol, not a base class: mypyc (setup.py's HOT_PATH) forbids an interpreted class to
subclass a compiled one, and only some relays are compiled."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from .. import h1
    from ..api.requests import GenRequest
    from ..domain import Endpoint
    from ..routing.policies import RouteContext
    from ..server.asgi import Headers
    from .token_counts import Strip

A = TypeVar("A", contravariant=True)
X = TypeVar("X", contravariant=True)  # the exchange it writes through (exchange.Exchange)


class Relay(Protocol[X, A]):
    """A way an answer reaches the client. `name`: what the request's record says of it
    (`RequestRecord.relay`, the access line's `relay`)."""

    @property
    def name(self) -> str: ...

    def deliver(self, ex: X, answer: A) -> Awaitable[None]:
        """Write `answer` to the client through `ex` (its `start`, `body`, `end`, `whole` and
        its `writer`), noting there what the client got (`cut`, `tokens`)."""
        ...


class BackendAnswer:
    """A backend's response to one attempt: `first` its stream's first chunk (read; b"" for
    a whole answer), or `data` all of a whole answer (None: larger than the router holds,
    unread). `translating`: an Ollama request answered by an OpenAI backend. `strip`: take
    out the usage event the router asked for on the client's behalf."""

    __slots__ = ("req", "ctx", "ep", "resp", "first", "data", "headers", "translating", "strip")

    def __init__(
        self,
        req: GenRequest,
        ctx: RouteContext,
        ep: Endpoint,
        resp: h1.Response,
        headers: Headers,
        first: bytes,
        data: bytes | None,
        translating: bool,
        strip: Strip | None = None,
    ) -> None:
        self.req, self.ctx, self.ep, self.resp, self.headers = req, ctx, ep, resp, headers
        self.first, self.data, self.translating, self.strip = first, data, translating, strip


class ReadyAnswer:
    """An answer whose bytes are made: `stream` sends it as a chunked stream's one piece."""

    __slots__ = ("status", "body", "headers", "content_type", "stream")

    def __init__(
        self, status: int, body: bytes, headers: Headers, content_type: bytes | None, stream: bool = False
    ) -> None:
        self.status, self.body, self.headers, self.content_type, self.stream = (
            status,
            body,
            headers,
            content_type,
            stream,
        )
