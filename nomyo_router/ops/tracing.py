"""OpenTelemetry traces, the request path's part: plain numbers per request, nothing more.

With `tracing` off none of this is built: the request path pays one `if` (app.py). With it
on, a request pays what a few attribute writes cost: `begin` picks the trace and span ids
(continuing a client's W3C `traceparent`) and decides sampling; `TracedUpstream.post` notes
each upstream attempt (its span id, start, answer) and sends the backend a `traceparent`
naming that attempt; `done` hands the finished `RequestRecord` to the exporter's queue. The
spans are built and encoded as OTLP protobuf later, in batches, on the exporter's thread
(`otlp.py`): the stock SDK's span objects, context managers and per-span processors cost
about as much CPU per request as the whole router.

Ids are random integers until they are encoded; times are `perf_counter` readings, turned
into Unix nanoseconds in the batch (one offset, taken at start).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import re
from random import getrandbits
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..config import ConfigError, RouterConfig
from ..domain import Endpoint
from ..events import Events, RequestRecord
from ..h1 import Response, TimeoutLike, Upstream
from ..server.asgi import Scope, header
from .trace_data import Attempt, Settings, Trace, pending_bytes, request_params

if TYPE_CHECKING:
    from .otlp import Exporter

log = logging.getLogger("nomyo_router.tracing")

CLOSE_S = 1.0  # at shutdown, the longest the exporter may take to send what is left
_ALL = 1 << 64  # a trace is sampled when its id's low 64 bits are below ratio x 2^64 (OTel's TraceIdRatioBased)
# gen_ai.operation.name by the request's kind (the GenAI conventions' names where they have one)
OPERATIONS = {
    "chat": "chat",
    "generate": "text_completion",
    "embed": "embeddings",
    "embeddings": "embeddings",
    "responses": "chat",
    "rerank": "rerank",
    "images": "image_generation",
    "transcription": "transcription",
}
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?")

# The request being served, for `TracedUpstream.post` (set by `begin` in the request's task; the
# proxy's tasks inherit it).
CURRENT: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("nomyo_trace", default=None)


def parse_traceparent(value: bytes) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) from a W3C traceparent, or None when it is not one
    (then the request starts a trace of its own, as the W3C spec says)."""
    m = _TRACEPARENT.fullmatch(value.strip().lower())
    if m is None or m[1] == b"ff" or (m[1] == b"00" and len(m[0]) != 55):
        return None
    trace_id, parent = int(m[2], 16), int(m[3], 16)
    if not trace_id or not parent:
        return None
    return trace_id, parent, bool(int(m[4], 16) & 1)


class Tracer:
    """Built only when `tracing` is set. `exporter` takes finished records (`otlp.Exporter`)."""

    def __init__(self, settings: Settings, events: Events, exporter: Exporter) -> None:
        self.settings = settings
        self.exporter = exporter
        self.bound = int(settings.sample_ratio * _ALL)
        self.budget = settings.max_pending_bytes
        self._events = events
        events.on_request_done(self.done)

    def start(self) -> None:
        """Start the exporter (in each worker, on its event loop): the requests whose traces it
        drops, from either thread, are counted on this loop."""
        loop = asyncio.get_running_loop()
        events = self._events

        def count(n: int) -> None:
            for _ in range(n):
                events.count("traces_dropped", "", "")

        def told(n: int) -> None:
            try:
                loop.call_soon_threadsafe(count, n)
            except RuntimeError:  # the loop is closed (shutting down): nothing scrapes it any more
                pass

        self.exporter.start(told)

    def begin(
        self, rec: RequestRecord, scope: Scope, kind: str, key: str, t0: float, body: dict[str, Any] | None = None
    ) -> None:
        """The request's trace, continuing the client's when it sent a valid traceparent;
        `body`: the request's, for the GenAI request parameters of a sampled one."""
        given = header(scope, b"traceparent")
        ctx = parse_traceparent(given) if given is not None else None
        if ctx is None:
            trace_id = getrandbits(128) or 1
            parent, sampled = 0, (trace_id & (_ALL - 1)) < self.bound
        else:
            trace_id, parent, sampled = ctx
        trace = Trace(trace_id, getrandbits(64) or 1, parent, sampled, OPERATIONS.get(kind, kind), key, t0)
        if sampled and body is not None:
            trace.params = request_params(body)
        rec.trace = trace
        CURRENT.set(trace)

    def parsed(self, rec: RequestRecord, kind: str, key: str, body: dict[str, Any]) -> None:
        """The request's body is read (its trace began at the door): the operation and model it
        asks for, and for a sampled one the GenAI request parameters."""
        trace = rec.trace
        if isinstance(trace, Trace):
            trace.operation, trace.key = OPERATIONS.get(kind, kind), key
            if trace.sampled:
                trace.params = request_params(body)

    def done(self, rec: RequestRecord) -> None:
        """The request is over: queue it for the exporter (sampled ones only)."""
        trace = rec.trace
        if not isinstance(trace, Trace) or not trace.sampled:
            return
        cost = pending_bytes(rec, trace)
        exporter = self.exporter
        if exporter.pending_bytes() + cost > self.budget:  # (the collector is slow or away)
            exporter.drop_unqueued()
            return
        exporter.submit(rec, cost)

    def close(self) -> None:
        self.exporter.close(CLOSE_S)


class TracedUpstream(Upstream):
    """The upstream client with tracing on: each POST of a traced request is an attempt span,
    and the backend is sent a `traceparent` naming it (so its own spans hang below it)."""

    async def post(
        self,
        ep: Endpoint,
        path: str,
        body: bytes,
        timeout: TimeoutLike,
        ctype: str | None = None,
        within: float | None = None,
    ) -> Response:
        trace = CURRENT.get()
        pool = self._pools.get(ep) or self.pool(ep)
        if trace is None:
            return await pool.request(b"POST", path, body, timeout.sock_connect, timeout.sock_read, ctype, within)
        span_id = getrandbits(64) or 1
        attempt = Attempt(span_id, ep, perf_counter())
        trace.attempts.append(attempt)
        extra = b"traceparent: 00-%032x-%016x-%s\r\n" % (trace.trace_id, span_id, b"01" if trace.sampled else b"00")
        try:
            resp = await pool.request(
                b"POST", path, body, timeout.sock_connect, timeout.sock_read, ctype, within, extra
            )
        except BaseException as e:
            attempt.end, attempt.error = perf_counter(), type(e).__name__
            raise
        attempt.status = resp.status
        return resp


def make(config: RouterConfig, events: Events) -> tuple[Tracer | None, Upstream]:
    """The tracer and the upstream client for `config`: no tracer and the plain client when
    `tracing` is off."""
    if config.tracing is None or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None, Upstream()
    try:
        from .genai_spans import GenAIExporter  # (protobuf and the OTLP messages: loaded only with tracing on)
    except ImportError as e:
        raise ConfigError(
            f"tracing: needs the opentelemetry-proto package ({e}); install it with "
            f"pip install 'nomyo-router[tracing]', or remove tracing"
        ) from None
    settings = Settings(config.tracing)
    return Tracer(settings, events, GenAIExporter(settings)), TracedUpstream()
