"""What happened, told once to whoever listens: metrics, usage storage, the access log.

The request path fills one `RequestRecord` per request and hands it to `Events.request_done`
when the response is over, at one place: `Exchange.finish` (relay/exchange.py), called in a
`finally`, so failures and disconnects are told too, and once.
A record's `status` is the status of the response head the client was sent, set where the
head goes out; when none was, `request_done` settles it first (`settle`): 499 (nginx's
"client closed request") when the client left before any head, 500 when an exception is
on its way out (the server answers 500 then).
Endpoint state changes (ejected, half-open, healthy) and discrete happenings (a retry, a
resumed stream) are told as they happen. Subscribers must be cheap and must not raise:
they run on the event loop, on the hot path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("nomyo_router.events")


class Traced(Protocol):
    """A request's trace (ops/trace_data.py's Trace), as the request path sees it."""

    def answered(self, tail: bytes) -> None:
        """The last bytes of the answer relayed (the whole of an answer sent in one piece)."""


@dataclass(slots=True)
class RequestRecord:
    """One request, as the router saw it. Times are seconds; None means not measured."""

    request_id: str
    api: str  # the client's API: "ollama" | "openai" (| "anthropic")
    route: str  # the path the client called
    model: str
    stream: bool
    client: str | None = None  # the client key's name, when keys are configured
    endpoint: str | None = None  # the endpoint that answered (the last one tried)
    status: int = 0  # the status of the response head sent to the client; 0: none (yet), see `settle`
    queue_s: float = 0.0
    overhead_s: float = 0.0  # router time before the upstream call, queue excluded
    ttft_s: float | None = None  # to the first content byte sent to the client
    total_s: float = 0.0
    prompt_tokens: int | None = None  # the backend's own counts
    completion_tokens: int | None = None
    # where the counts come from: "backend" (its own usage) | "relayed" (counted by the router)
    tokens_from: str | None = None
    reserved: tuple[int, int] | None = None  # a token budget's reservation (number, tokens), settled at the end
    affinity: str | None = None  # hit | miss | spill | repin
    retries: int = 0  # attempts after the first
    resumed: int = 0  # mid-stream continuations on another endpoint
    error: str | None = None  # a short code when the request failed (e.g. "queue_full")
    upstream_first_s: float | None = None  # the backend's time to its first stream chunk
    prefix_tokens: int | None = None  # prompt tokens the endpoint was believed to have cached
    cache: str | None = None  # the response cache, for a request that opted in: hit | miss | bypass
    # the relay that wrote the answer (set by it): passthrough | pump | resumed | translated | whole |
    # large | assembled | cached | error; None: no answer was written (the client left first)
    relay: str | None = None
    trace: Traced | None = None  # the request's trace (ops/tracing.py's Trace), only with tracing on
    batch: str | None = None  # the batch this request is a line of (the Batch API), else None


CLIENT_CLOSED = 499  # nginx's code: the client left before any response head was sent


def settle(rec: RequestRecord, failed: bool) -> None:
    """Say what the client got when the request path sent no response head.

    `failed`: the request path is ending with an exception (an `ApiError` has set its status
    already, so a bug or a cancellation): the server answers 500 if it still can. Without one,
    the path returned without answering, which it does only when the client left (a disconnect
    cancels the work and is swallowed, app.py, server/asgi.py): 499. The path says which itself
    (`Exchange.finish`): `sys.exc_info()` in its `finally` would tell the same in Python, but
    not in the compiled build, where it can still show an exception handled earlier."""
    if failed:
        rec.status, rec.error = 500, rec.error or "internal_error"
    else:
        rec.status, rec.error = CLIENT_CLOSED, rec.error or "client_gone"


RequestHook = Callable[[RequestRecord], None]
EndpointHook = Callable[[str, str, str], None]  # (endpoint, state, reason)
CountHook = Callable[[str, str, str], None]  # (what, endpoint, model)


class Events:
    """A tiny synchronous hub. One per process, built with the `Router`."""

    def __init__(self) -> None:
        self._request: list[RequestHook] = []
        self._start: list[RequestHook] = []  # (empty unless someone watches: ops/usage/stream.py)
        self._endpoint: list[EndpointHook] = []
        self._count: list[CountHook] = []

    def on_request_done(self, hook: RequestHook) -> None:
        self._request.append(hook)

    def off_request_done(self, hook: RequestHook | None) -> None:
        if hook in self._request:
            self._request.remove(hook)

    def on_request_start(self, hook: RequestHook) -> None:
        self._start.append(hook)

    def off_request_start(self, hook: RequestHook | None) -> None:
        if hook in self._start:
            self._start.remove(hook)

    def on_endpoint_state(self, hook: EndpointHook) -> None:
        self._endpoint.append(hook)

    def on_count(self, hook: CountHook) -> None:
        self._count.append(hook)

    def request_done(self, rec: RequestRecord, failed: bool = False) -> None:
        """`rec` is over (`failed`: with an exception on its way out, see `settle`)."""
        if not rec.status:
            settle(rec, failed)
        for hook in self._request:
            _safe(hook, rec)

    def request_started(self, rec: RequestRecord) -> None:
        """A generation request arrived (its record has its id, API, route, model, client)."""
        for hook in self._start:
            _safe(hook, rec)

    def endpoint_state(self, endpoint: str, state: str, reason: str = "") -> None:
        for hook in self._endpoint:
            _safe(hook, endpoint, state, reason)

    def count(self, what: str, endpoint: str = "", model: str = "") -> None:
        """A discrete happening: "retry", "resumed", "ejection", "overloaded", ..."""
        for hook in self._count:
            _safe(hook, what, endpoint, model)


def _safe(hook: Callable[..., None], *args: object) -> None:
    try:
        hook(*args)
    except Exception:  # a broken listener must never break a request
        log.exception("event listener %r failed", hook)
