"""`GET /api/usage-stream`: what the router is doing, live, as Server-Sent Events.

Three kinds of event, each one JSON object in `data:`:

- `usage`, on connecting and then every second: requests holding a slot on each endpoint
  (`in_flight`, from the state store: the whole router's, every worker and instance sharing
  it), requests waiting for a slot (`queued`), and the tokens the backends reported so far,
  by model and by client key (`tokens`, from the metrics the events hub feeds: every worker's
  under `--workers N`, since each process started);
- `start`, when a generation request arrives (its id, model, client, API, route);
- `done`, when it has been answered (its endpoint, status, tokens and whose count they are,
  `tokens_from`: "backend" or "relayed" (counted by the router), time, cache outcome);
- `end`, the last one, when the router stops: the stream then ends at once instead of holding
  the graceful shutdown for all of `shutdown_grace` (nomyo_router.server.protocol tells it).

`start` and `done` come from the events hub, and only while someone listens: the hub calls
this module's hooks, which are registered with the first subscriber and removed with the last,
so nobody watching costs the request path nothing but an empty loop. They are the answering
process's own requests (with `--workers N`, the worker this stream is connected to).

A subscriber holds at most `MAX_PENDING` bytes of events not yet written (and one event
whatever its size, so a reader is only dropped for its own slowness). A reader slower
than the router drops past that, or when one write waits longer than `SEND_TIMEOUT`: it gets
a last `dropped` event if it still can, and its connection is closed. Nothing is buffered
without bound. Needs the admin key when any key is configured.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...events import Events, RequestRecord
from ...server.asgi import SHUTDOWN_HOOK, ClientGone, Receive, Scope, Send, cancel_on_disconnect

if TYPE_CHECKING:
    from ...domain import Endpoint
    from ...state import StateStore
    from ..metrics import Metrics

TICK_S = 1.0
FLUSH_S = 0.05  # events written at most this often (many requests, one write)
MAX_PENDING = 1 << 20  # bytes of events a subscriber may have waiting
SEND_TIMEOUT = 10.0
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), json.dumps(data, separators=(",", ":")).encode())


class Subscriber:
    __slots__ = ("items", "size", "wake", "dropped", "ending")

    def __init__(self) -> None:
        self.items: deque[bytes] = deque()
        self.size = 0
        self.wake = asyncio.Event()
        self.dropped = False
        self.ending = False  # the server is stopping: the stream ends

    def end(self) -> None:
        self.ending = True
        self.wake.set()

    def put(self, event: bytes) -> None:
        if self.dropped:
            return
        self.size += len(event)
        # A reader this slow is let go, not waited for; one with nothing pending is never
        # dropped, whatever the size of the event (it is written whole at the next flush).
        if self.size > MAX_PENDING and len(self.items):
            self.dropped, self.size = True, 0
            self.items.clear()
        else:
            self.items.append(event)
        self.wake.set()

    def take(self) -> bytes:
        out = b"".join(self.items)
        self.items.clear()
        self.size = 0
        return out


class UsageStream:
    """One per router process. `snapshot()` is what a `usage` event says; `require_admin(scope,
    what)` refuses a reader who may not watch every client's traffic."""

    def __init__(
        self,
        events: Events,
        snapshot: Callable[[], dict[str, Any]],
        require_admin: Callable[[Scope, str], None],
        label: Callable[[str], str] = lambda model: model,
    ) -> None:
        """`label(model)`: what a `start` event shows of a model (a name no endpoint serves is a
        placeholder, as everywhere; `done` events show the record's, already labelled)."""
        self.events = events
        self.label = label
        self.snapshot = snapshot
        self.require_admin = require_admin
        self.subs: set[Subscriber] = set()
        self._last: tuple[float, bytes] = (0.0, b"")

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        if not self.subs:
            self.events.on_request_start(self._started)
            self.events.on_request_done(self._done)
        self.subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subs.discard(sub)
        if not self.subs:
            self.events.off_request_start(self._started)
            self.events.off_request_done(self._done)

    def _publish(self, event: bytes) -> None:
        for sub in self.subs:
            sub.put(event)

    def _started(self, rec: RequestRecord) -> None:
        self._publish(
            sse(
                "start",
                {
                    "t": round(time.time(), 3),
                    "request_id": rec.request_id,
                    "model": self.label(rec.model),
                    "client": rec.client,
                    "api": rec.api,
                    "route": rec.route,
                    "stream": rec.stream,
                },
            )
        )

    def _done(self, rec: RequestRecord) -> None:
        self._publish(
            sse(
                "done",
                {
                    "t": round(time.time(), 3),
                    "request_id": rec.request_id,
                    "model": rec.model,
                    "client": rec.client,
                    "endpoint": rec.endpoint,
                    "status": rec.status,
                    "prompt_tokens": rec.prompt_tokens,
                    "completion_tokens": rec.completion_tokens,
                    "tokens_from": tokens_from(rec),
                    "total_ms": round(rec.total_s * 1000, 2),
                    "cache": rec.cache,
                    "error": rec.error,
                    "batch": rec.batch,
                },
            )
        )

    def usage(self) -> bytes:
        """The `usage` event, made at most once per half tick whatever the number of readers."""
        now = time.monotonic()
        if now - self._last[0] >= TICK_S / 2:
            self._last = (now, sse("usage", {"t": round(time.time(), 3), **self.snapshot()}))
        return self._last[1]

    async def route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`GET /api/usage-stream`."""
        self.require_admin(scope, "GET /api/usage-stream")
        await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        sub = self.subscribe()
        try:
            scope[SHUTDOWN_HOOK] = sub.end  # (our protocol calls it when the server stops)
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            await cancel_on_disconnect(self._pump(sub, send), receive, scope)
        finally:
            self.unsubscribe(sub)

    async def _pump(self, sub: Subscriber, send: Send) -> None:
        loop = asyncio.get_running_loop()
        await _write(send, self.usage())
        tick = loop.time() + TICK_S
        while True:
            wait = tick - loop.time()
            if wait > 0 and not sub.items and not sub.dropped and not sub.ending:
                sub.wake.clear()
                try:
                    await asyncio.wait_for(sub.wake.wait(), wait)
                except TimeoutError:
                    pass
            if sub.dropped:  # a last event and the end, if the reader takes them in time; else closed
                await _write(
                    send, sse("dropped", {"reason": f"this reader fell more than {MAX_PENDING} bytes of events behind"})
                )
                await _write(send, b"", False)
                return
            out = sub.take()
            if sub.ending:  # the server is stopping: what is pending, and the end
                await _write(send, out + sse("end", {"reason": "the router is stopping"}), False)
                return
            if loop.time() >= tick:
                out += self.usage()
                tick = max(tick + TICK_S, loop.time())
            if out:
                await _write(send, out)
                await asyncio.sleep(FLUSH_S)


async def _write(send: Send, data: bytes, more: bool = True) -> None:
    try:
        await asyncio.wait_for(send({"type": "http.response.body", "body": data, "more_body": more}), SEND_TIMEOUT)
    except TimeoutError:  # it stopped reading: its connection is closed (the answer never completes)
        raise ClientGone from None


def tokens_from(rec: RequestRecord) -> str | None:
    """Whose counts the record's tokens are ("backend" unless a relay says it counted them)."""
    if rec.tokens_from is not None or (rec.prompt_tokens is None and rec.completion_tokens is None):
        return rec.tokens_from
    return "backend"


def snapshot_of(store: StateStore, endpoints: Sequence[Endpoint], metrics: Metrics) -> dict[str, Any]:
    """In-flight and queue from the state store, token totals from the metrics registry."""
    in_flight = {ep.name: store.in_flight(ep) for ep in endpoints}
    by_model: dict[str, dict[str, int]] = {}
    by_client: dict[str, dict[str, int]] = {}
    for family in metrics.scrape_registry().collect():
        if family.name != "nomyo_router_tokens":
            continue
        for s in family.samples:
            if not s.name.endswith("_total"):
                continue
            kind, n = s.labels.get("kind", ""), int(s.value)
            for into, key in ((by_model, s.labels.get("model", "")), (by_client, s.labels.get("client", ""))):
                row = into.setdefault(key, {"prompt": 0, "completion": 0})
                row[kind] = row.get(kind, 0) + n
    return {
        "in_flight": in_flight,
        "queued": store.queue_length(),
        "tokens": {"by_model": by_model, "by_client": by_client},
    }
