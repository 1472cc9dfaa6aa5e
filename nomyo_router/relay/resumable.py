"""A stream relayed record by record, and continued on another endpoint when the backend cuts
it (resume_streams on, a stream `continuation.resumable` says can be continued).

Whole records only go to the client (`sinks.relay_records`), the bytes sent are kept
(`continuation.Sent`); on a cut, or the backend's error record, the text so far is recovered and the
request is sent again elsewhere as its continuation, relayed with its seam mended
(continuation.py explains the mechanics). The broken endpoint's slot goes back at once
(`Exchange.let_go`) and the continuation's is held in its place (`Exchange.hold`), so the
request never holds two. When no endpoint continues it, the stream ends with an error record
in its own format, or the backend's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .. import h1
from ..api.requests import GenRequest
from ..backends.health import Health
from ..domain import Endpoint
from ..events import Events
from ..h1.errors import ErrorRecord
from ..routing.policies import RouteContext
from ..routing.scheduler import Scheduler
from ..state import Lease, NoEndpoint, QueueFull, QueueTimeout
from .base import BackendAnswer
from .continuation import Continuation, Sent, continuation, produced, record_end
from .error_record import blame
from .exchange import Exchange
from .sinks import relay_records, stream_error

# Sends one continuation request and returns (response, first chunk), raising on anything but
# a good start (the proxy's own call, with its deadline).
Call = Callable[[Endpoint, str, bytes], Awaitable[tuple[h1.Response, bytes]]]


class Resumer:
    """The way out "resumed": relays a resumable stream and continues it elsewhere when the
    backend cuts it."""

    name = "resumed"

    def __init__(
        self,
        scheduler: Scheduler,
        health: Health,
        events: Events,
        call: Call,
        max_attempts: int,
        upstream: h1.Upstream | None = None,
        record_limit: int = 0,
    ) -> None:
        self.record_limit = record_limit  # max_record_bytes (0: none)
        self.scheduler = scheduler
        self.upstream = upstream  # for the compiled pump (None: the relay stays in Python)
        self.health = health
        self.events = events
        self.call = call
        self.max_attempts = max_attempts

    async def deliver(self, ex: Exchange, answer: BackendAnswer) -> None:
        """Relay a 200 stream whose first chunk was read to the client, head to end.
        `answer.strip`: take out the usage event the router asked for on the client's behalf."""
        await ex.start(200, answer.headers)
        req = answer.req
        # With no other endpoint for the model there is nowhere to resume: keep only the tail.
        sent = Sent(self.scheduler.serving(req.key) > 1, record_end(req.api == "openai"))
        resp = answer.resp
        try:
            cut = await self._relay(ex, answer, sent)
        finally:
            resp.close()  # no-op when released; the client left: closing stops the backend
            ex.relayed(sent.records)  # (the backend's own counts, when it sent them, stand)
        if cut:
            ex.cut(cut)
            await ex.body(stream_error(resp, cut))
        await ex.end()

    async def _relay(
        self, ex: Exchange, answer: BackendAnswer, sent: Sent
    ) -> bool | h1.TooLarge | ErrorRecord | TimeoutError:
        """False when the stream ended well; True when it ended broken, or what ended it: the
        `TooLarge` (a record beyond max_record_bytes: not resumed), the backend's `ErrorRecord`
        or its silence (`TimeoutError`) when no other endpoint continued the stream (the
        caller sends it)."""
        req, ctx, ep, resp, first, strip = answer.req, answer.ctx, answer.ep, answer.resp, answer.first, answer.strip
        sep = sent.sep
        seam: Continuation | None = None
        tried = [ep.name]
        writer, upstream, limit = ex.writer, self.upstream, self.record_limit
        try:
            while True:
                broke = await relay_records(resp, first, sep, seam, sent, ex.body, strip, writer, upstream, limit)
                if broke is None:
                    resp.release()
                    if seam is not None:
                        self.health.success(ep)
                    ex.tokens(sent.last() + (strip.removed if strip is not None else b""))
                    return False
                resp.close()
                ex.let_go()  # the dead endpoint's slot, now: not when the continuation ends
                if isinstance(broke, h1.TooLarge):  # not resumed: another backend would likely send the same
                    self.health.failure(ep, str(broke))
                    return broke
                blame(self.health, self.events, ep, req.key, broke)
                # (the error record: relayed; a silence: said so)
                last = broke if isinstance(broke, (ErrorRecord, TimeoutError)) else True
                if not sent.whole:
                    return last
                text, tokens = produced(req.api, req.kind, sent.all())
                nxt = await self._next(req, ctx, tried, text, tokens)
                if nxt is None:
                    return last
                lease, resp, first = nxt
                ex.hold(lease)
                ep = lease.endpoint
                seam = Continuation(req.api, tokens)
                ex.resumed_on(ep.name)
                self.events.count("resumed", ep.name, req.key)
        except BaseException:
            resp.close()  # the client left: closing the connection stops the backend
            raise

    async def _next(
        self, req: GenRequest, ctx: RouteContext, tried: list[str], text: str, tokens: int
    ) -> tuple[Lease, h1.Response, bytes] | None:
        for _ in range(self.max_attempts):
            try:
                lease = await self.scheduler.acquire(ctx, tried)
            except (NoEndpoint, QueueFull, QueueTimeout):
                return None
            ep = lease.endpoint
            tried.append(ep.name)
            if ep.type == "openai" and req.api == "ollama":
                lease.release()  # a translated stream is not resumed on another API
                continue
            body = dict(req.body)
            if ep.type == "openai":
                body["model"] = ep.models[req.key]
            try:
                resp, first = await self.call(ep, req.path, continuation(req.api, req.kind, body, text, tokens))
            except Exception as e:  # any failure to start: try the next endpoint
                lease.release()
                self.health.failure(ep, f"resumption failed to start: {type(e).__name__}")
                continue
            return lease, resp, first
        return None
