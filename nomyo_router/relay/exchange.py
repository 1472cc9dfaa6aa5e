"""The one way an answer leaves the router: an `Exchange`.

One is made for every request the moment it is read, at the door (`RouterApp.http`), and
one per step of an ensemble. It carries the request's `RequestRecord`, the client's `send`
(with the protocol's `BodyWriter`, which writes a whole answer, or a relayed piece, without
the ASGI round trip) and the slot (`Lease`) the request holds. Every path out writes through
it: a way out (`base.Relay`: whole, large, assembled, passthrough and the pump, resumed,
translated, cached, error) is handed its answer by `relay`, which names it in the record, and
writes with `start`, `body` and `end` for a stream or an answer relayed as it comes, `whole`
for an answer in one piece, and the client's writer (`writer`: the protocol's direct writer,
which the sinks and the compiled pump write through); it notes here what the client got
(`cut`, `tokens`). `fail` is the error way, in the caller's API shape.

It has one completion point, `finish` (idempotent), and one place that calls it: `run`, which
awaits the request's handling and answers whatever ends it (a refusal at the door, a failure,
a client that left). The slot goes back, the record is settled (its total time;
`events.settle` says 499 or 500 when no head went out) and `Events.request_done` is told once,
so metrics, usage, the access line and the trace are written in one place whatever the path —
a request refused at the door (401, 403, 429, 400, 413, 503 ...) as much as a proxied one, as
Envoy gives a locally answered request the same access record. Routes off the generation path
(listings, operators' pages) are `quiet`: recorded only when refused.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ..api.errors import ApiError, render
from ..api.requests import GenRequest
from ..events import Events, RequestRecord
from ..server.asgi import BodyTooLarge, ClientGone, Headers, Send
from . import error_record, token_counts
from .base import ReadyAnswer, Relay

if TYPE_CHECKING:
    from ..server.body_budget import BodyBudget
    from ..server.direct_writer import DirectWriter
    from ..state import Lease

JSON = b"application/json"
_END = {"type": "http.response.body", "body": b""}
A = TypeVar("A")

# What answers a generation request through its exchange: the proxy's `forward`, the
# ensemble's `handle`, and the wrappers around them (trim-and-retry, the response cache).
Handle = Callable[[GenRequest, "Exchange"], Awaitable[None]]


class Exchange:
    """One request's way out: its record, its client's `send`, its slot, one `finish`."""

    __slots__ = (
        "send",
        "writer",
        "rec",
        "t0",
        "lease",
        "queued",
        "quiet",
        "prompt_bytes",
        "_client",
        "_events",
        "_done",
    )

    def __init__(
        self, send: Send, rec: RequestRecord, t0: float, events: Events | None, writer: DirectWriter | None = None
    ) -> None:
        """`events`: told at `finish` (None: the caller tells them itself); `writer`: the
        protocol's direct writer, when the server offers one."""
        self.send = send
        self.writer = writer
        self.rec = rec
        self.t0 = t0
        self.lease: Lease | None = None
        # its body's charge on the bytes held while queued (server/body_budget.py): given back
        # when it first holds a slot, or at `finish`
        self.queued: tuple[BodyBudget, int] | None = None
        self.quiet = False  # told at `finish` only when refused (`fail`): a listing, an operator's page
        self.prompt_bytes = 0  # the request body's size (the prompt's estimate when no count comes)
        self._client = send  # errors go here, not through a wrapper's `send` (see `via`)
        self._events = events
        self._done = False

    # ---- the slot --------------------------------------------------------------------------
    def hold(self, lease: Lease) -> None:
        """The slot this request now holds; one it held before (an earlier try's, a broken
        stream's endpoint's) goes back now."""
        old, self.lease = self.lease, lease
        if old is not None:
            old.release()
        queued = self.queued
        if queued is not None:
            self.queued = None
            queued[0].give(queued[1])

    def let_go(self) -> None:
        """Give the slot back now (a failed attempt, a stream cut there): not at `finish`."""
        lease = self.lease
        if lease is not None:
            self.lease = None
            lease.release()

    def again(self) -> None:
        """The answer so far was held back and the request is asked again (trim-and-retry):
        the slot goes back before the next one is taken, the record counts a retry."""
        self.let_go()
        rec = self.rec
        rec.status, rec.error = 0, None
        rec.retries += 1

    # ---- the answer ------------------------------------------------------------------------
    def relay(self, way: Relay[Exchange, A], answer: A) -> Awaitable[None]:
        """Hand `answer` to `way`, the one that writes it (awaited by the caller: no frame of
        its own). The record names the last way handed an answer."""
        self.rec.relay = way.name
        return way.deliver(self, answer)

    def through(self, send: Send) -> None:
        """The client's `send` as the door wrapped it (CORS, x-ratelimit-* headers): every byte
        takes it, errors too, never the direct writer (it writes around `send`)."""
        self.send = self._client = send
        self.writer = None

    def via(self, send: Send) -> Exchange:
        """This exchange with its answer passing `send`, a wrapper that reads or adds to it (an
        ensemble's header, trim-and-retry, the response cache): then every byte takes `send`,
        never the direct writer. An error (`fail`) still goes to the client's own `send`."""
        self.send, self.writer = send, None
        return self

    async def start(self, status: int, headers: Headers) -> None:
        """A relayed answer's head; `body` and `end` follow."""
        self.rec.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        await self.send({"type": "http.response.body", "body": data} if data else _END)

    def written(self, status: int, body: bytes, headers: Headers, content_type: bytes | None = None) -> bool:
        """`whole`'s first try, without a coroutine: the answer written directly (True), or
        nothing done (False: `await whole_asgi(...)` then). `headers` is added to."""
        if content_type is not None:
            headers.append((b"content-type", content_type))
        headers.append((b"content-length", b"%d" % len(body)))
        self.rec.status = status
        w = self.writer
        return w is not None and w.whole(status, headers, body)

    async def whole(self, status: int, body: bytes, headers: Headers, content_type: bytes | None = None) -> None:
        """An answer in one piece (`headers` is added to: the caller's own list)."""
        if not self.written(status, body, headers, content_type):
            await self.whole_asgi(status, body, headers)

    async def whole_asgi(self, status: int, body: bytes, headers: Headers) -> None:
        """`whole` when `written` could not: through ASGI, `headers` complete."""
        self.rec.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def fail(self, e: ApiError) -> None:
        """The request failed before its answer: the error in the caller's API shape."""
        rec = self.rec
        rec.status, rec.error = e.status, e.code or "error"
        self.quiet = False
        status, body, headers = render(rec.api, e)
        self.send, self.writer = self._client, None  # (not a wrapper's `send`: see `via`)
        await self.relay(FAILED, ReadyAnswer(status, body, headers, JSON))

    # ---- what the client got ---------------------------------------------------------------
    def cut(self, why: BaseException | bool) -> None:
        """The answer broke after its head went out (`error_record.ended` says how it counts)."""
        error_record.ended(self.rec, why)

    def client_left(self) -> None:
        """The client left before its answer's end: a record whose head went out says so (its
        status stands: the one the client got); one without a head is settled as a 499."""
        rec = self.rec
        if rec.status and rec.error is None:
            rec.error = "client_gone"

    def note_error(self, code: str) -> None:
        """The answer failed after its head went out, as `code` says (its status stands)."""
        self.rec.error = code

    def tokens(self, tail: bytes) -> None:
        """The backend's token counts, from the last bytes of its answer."""
        rec = self.rec
        rec.prompt_tokens, rec.completion_tokens = token_counts.counts(tail[-token_counts.TAIL :])
        if rec.completion_tokens is not None:
            rec.tokens_from = "backend"
        if rec.trace is not None:  # (tracing on: its span reads the answer's id and finish reasons)
            rec.trace.answered(tail)

    def counted(self, prompt: object, completion: object) -> None:
        """The backend's token counts, read from its answer's usage object."""
        rec = self.rec
        rec.prompt_tokens = prompt if isinstance(prompt, int) else None
        rec.completion_tokens = completion if isinstance(completion, int) else None
        if rec.completion_tokens is not None:
            rec.tokens_from = "backend"

    def relayed(self, records: int) -> None:
        """A stream is over (ended, cut, or its client gone) having relayed `records` records:
        the counts, unless the backend's own were read (`tokens_from` says which)."""
        rec = self.rec
        if rec.completion_tokens is None:
            rec.completion_tokens = records
            if rec.prompt_tokens is None:
                rec.prompt_tokens = token_counts.estimate(self.prompt_bytes)
            rec.tokens_from = "relayed"

    def resumed_on(self, endpoint: str) -> None:
        """A cut stream goes on at `endpoint` (the record names the last endpoint that answered)."""
        self.rec.resumed += 1
        self.rec.endpoint = endpoint

    # ---- the one completion point ----------------------------------------------------------
    async def run(self, work: Awaitable[None]) -> None:
        """Await `work`, the request's handling, and finish this exchange once however it
        ends: an ApiError is answered in the caller's API shape, a body over its limit as 413,
        a client that left is a 499, anything else (a bug, the server cancelling the task) a
        500 if no head went out, and goes on up."""
        try:
            await work
        except ApiError as e:
            await self.fail(e)
        except BodyTooLarge as too_large:  # (one exception type per name: the compiled build's rule)
            await self.fail(ApiError(413, str(too_large), code="request_too_large"))
        except ClientGone:
            pass
        except BaseException:
            self.finish(failed=True)
            raise
        finally:
            self.finish()

    def finish(self, failed: bool = False) -> None:
        """The request is over: the slot goes back, the record is settled and told, once.
        `failed`: it ends with an exception on its way out (its callers' `except
        BaseException`), which makes a record without a response head a 500, not a 499."""
        if self._done:
            return
        self._done = True
        queued = self.queued
        if queued is not None:
            self.queued = None
            queued[0].give(queued[1])
        lease = self.lease
        if lease is not None:
            self.lease = None
            lease.release()
        events = self._events
        if events is not None and not self.quiet:
            self.rec.total_s = time.perf_counter() - self.t0
            events.request_done(self.rec, failed)


class Failed:
    """Errors, in the caller's API shape, as one way out: the router's own refusal or failure
    (`Exchange.fail`: to the client's own `send`) and a backend's error answer passed on when no
    endpoint answered (the proxy's last resort: through the exchange's `send`, which a wrapper
    such as trim-and-retry reads). A stream that breaks after its head ends with a last record in
    its own format instead, written by the stream's relay (`sinks.stream_error`)."""

    name = "error"

    async def deliver(self, ex: Exchange, answer: ReadyAnswer) -> None:
        await ex.whole(answer.status, answer.body, answer.headers, answer.content_type)


FAILED = Failed()
