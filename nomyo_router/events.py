"""What happened, told once to whoever listens: metrics, usage storage, the access log.

The request path fills one `RequestRecord` per request and hands it to `Events.request_done`
when the response is over (in a `finally`, so failures and disconnects are told too).
Endpoint state changes (ejected, half-open, healthy) and discrete happenings (a retry, a
resumed stream) are told as they happen. Subscribers must be cheap and must not raise:
they run on the event loop, on the hot path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("nomyo_router.events")


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
    status: int = 0  # HTTP status sent to the client; 0: the client left before one was sent
    queue_s: float = 0.0
    overhead_s: float = 0.0  # router time before the upstream call, queue excluded
    ttft_s: float | None = None  # to the first content byte sent to the client
    total_s: float = 0.0
    prompt_tokens: int | None = None  # the backend's own counts
    completion_tokens: int | None = None
    affinity: str | None = None  # hit | miss | spill | repin
    retries: int = 0  # attempts after the first
    resumed: int = 0  # mid-stream continuations on another endpoint
    error: str | None = None  # a short code when the request failed (e.g. "queue_full")
    upstream_first_s: float | None = None  # the backend's time to its first stream chunk
    prefix_tokens: int | None = None  # prompt tokens the endpoint was believed to have cached


RequestHook = Callable[[RequestRecord], None]
EndpointHook = Callable[[str, str, str], None]  # (endpoint, state, reason)
CountHook = Callable[[str, str, str], None]  # (what, endpoint, model)


class Events:
    """A tiny synchronous hub. One per process, built with the `Router`."""

    def __init__(self) -> None:
        self._request: list[RequestHook] = []
        self._endpoint: list[EndpointHook] = []
        self._count: list[CountHook] = []

    def on_request_done(self, hook: RequestHook) -> None:
        self._request.append(hook)

    def off_request_done(self, hook: RequestHook | None) -> None:
        if hook in self._request:
            self._request.remove(hook)

    def on_endpoint_state(self, hook: EndpointHook) -> None:
        self._endpoint.append(hook)

    def on_count(self, hook: CountHook) -> None:
        self._count.append(hook)

    def request_done(self, rec: RequestRecord) -> None:
        for hook in self._request:
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
