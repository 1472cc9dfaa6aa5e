"""OpenTelemetry traces, the batch's part: spans built, encoded and sent off the event loop.

A thread wakes every second (sooner when a batch is full), turns the finished requests'
records (`tracing.py`) into spans with `opentelemetry-proto`'s messages and POSTs them as
OTLP/HTTP protobuf to the collector. Per request: one SERVER span named
`{operation} {model}` with the GenAI semantic conventions' attributes and the router's own
(`nomyo.*`), a `queue` span when it waited for a slot, and one CLIENT span per upstream
attempt (failed ones included), whose id is the `traceparent` the backend was sent.
Never prompt text: only names, counts and times.

A collector that is down or slow costs the batch, never a request: a batch that cannot be
sent is dropped; so are new requests' traces while those waiting would pass
`tracing.max_pending_bytes`. Both are counted exactly, in requests, in
`nomyo_router_events_total{what="traces_dropped"}` and in a warning at most once a minute.
"""

from __future__ import annotations

import collections
import http.client
import logging
import threading
import time
from collections.abc import Callable
from random import getrandbits
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from .. import __version__
from ..events import RequestRecord

if TYPE_CHECKING:
    from .trace_data import Settings, Trace

log = logging.getLogger("nomyo_router.tracing")

BATCH = 512  # records per export request
INTERVAL_S = 1.0  # the longest a finished request waits to be exported
YIELD_EVERY = 32  # records encoded between two yields of the GIL to the event loop
TIMEOUT_S = 10.0  # one export request, connect included (OTLP's default)
MAX_TEMPLATES = 4096  # span templates kept; past this, or past MAX_TEMPLATE_BYTES, they are made afresh
MAX_TEMPLATE_BYTES = 4 << 20
SERVER, CLIENT, INTERNAL = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL
ERROR = Status.STATUS_CODE_ERROR
# Span.flags: the W3C flags (sampled) and whether the parent's context came from another process
_LOCAL_PARENT, _REMOTE_PARENT = 0x101, 0x301


class Exporter:
    """Finished requests in, OTLP out. `submit` runs on the event loop (a deque append); the
    rest on the exporter's own thread, started with the router.

    The bytes waiting are two running totals, each written by one thread only (`_in` by the
    loop's `submit`, `_out` by the thread as it takes a batch), so no lock is needed."""

    def __init__(self, settings: Settings) -> None:
        parts = urlsplit(settings.url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "localhost", parts.port or (443 if self.https else 80)
        self.path = (parts.path or "/v1/traces") + (f"?{parts.query}" if parts.query else "")
        self.headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"nomyo-router/{__version__}",
            **settings.headers,
        }
        self.service_name = settings.service_name
        self.budget = settings.max_pending_bytes
        self.exported = 0  # spans sent
        self.failed = 0  # requests whose spans the collector did not take (down, slow or refusing)
        self.over = 0  # requests not queued: those waiting held the budget
        self._queue: collections.deque[tuple[RequestRecord, int]] = collections.deque()
        self._in = self._out = 0  # bytes queued, bytes taken off the queue
        self._on_drop: Callable[[int], None] = _nobody
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._warned = 0.0
        self._servers: dict[str, tuple[str, int]] = {}  # endpoint URL -> (server.address, server.port)
        # Each span's name, kind and the attributes it shares with every span like it (same
        # operation, model, endpoint), encoded once and merged in: half the cost of setting them.
        # Bounded in entries and in bytes: a template's key and encoding carry a model name
        # (bounded at the door, requests.MAX_MODEL_BYTES) and a route.
        self._templates: dict[tuple[Any, ...], bytes] = {}
        self._template_bytes = 0
        self._offset_ns = 0

    # ---- on the event loop -----------------------------------------------------------------
    def pending(self) -> int:
        return len(self._queue)

    def pending_bytes(self) -> int:
        return self._in - self._out

    def submit(self, rec: RequestRecord, cost: int) -> None:
        """Queue `rec`, which holds `cost` bytes (`trace_data.pending_bytes`)."""
        self._in += cost
        self._queue.append((rec, cost))
        if len(self._queue) == BATCH:
            self._wake.set()

    def drop_unqueued(self) -> None:
        """A finished request's trace is dropped: those waiting hold the budget."""
        self.over += 1
        self._on_drop(1)
        self._warn("those waiting hold tracing.max_pending_bytes")

    def start(self, on_drop: Callable[[int], None] = lambda n: None) -> None:
        """Start the thread (in each worker, after the fork), and fix the clock's offset.
        `on_drop(n)`: told, from either thread, when `n` requests' traces are dropped."""
        self._on_drop = on_drop
        self._offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)
        self._thread = threading.Thread(target=self._run, name="nomyo-otlp", daemon=True)
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Send what is left within `timeout`, then stop (what is still unsent then is lost
        with the process: a dead collector never holds a shutdown longer)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- on the exporter's thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(INTERVAL_S)
            self._wake.clear()
            stopping = self._stop
            try:
                while self._queue:
                    n = min(BATCH, len(self._queue))
                    batch = [self._queue.popleft() for _ in range(n)]
                    self._out += sum(cost for _, cost in batch)
                    self._send([rec for rec, _ in batch])
            except Exception:  # never let the thread die: the next batch may go through
                log.exception("trace export failed")
            if stopping:
                if self._conn is not None:
                    self._conn.close()
                return

    def _send(self, recs: list[RequestRecord]) -> None:
        body, spans = self.encode(recs)
        n = len(recs)
        for attempt in range(2):  # (once more on a fresh connection: a kept-alive one may be stale)
            try:
                if self._conn is None:
                    cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
                    self._conn = cls(self.host, self.port, timeout=TIMEOUT_S)
                self._conn.request("POST", self.path, body, self.headers)
                resp = self._conn.getresponse()
                resp.read()
                if 200 <= resp.status < 300:
                    self.exported += spans
                    return
                self._fail(n, f"the collector answered HTTP {resp.status}")
                return
            except (OSError, http.client.HTTPException) as e:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                if attempt:
                    self._fail(n, f"{type(e).__name__}: {e}")

    def _fail(self, n: int, why: str) -> None:
        """`n` requests' spans were not taken by the collector."""
        self.failed += n
        self._on_drop(n)
        self._warn(why)

    def _warn(self, why: str) -> None:
        now = time.monotonic()
        if now - self._warned > 60:
            self._warned = now
            log.warning(
                "traces not exported to %s:%d%s (%s); traces of %d requests dropped so far "
                "(%d the collector did not take, %d not queued: over %d bytes waiting)",
                self.host,
                self.port,
                self.path,
                why,
                self.failed + self.over,
                self.failed,
                self.over,
                self.budget,
            )

    def encode(self, recs: list[RequestRecord]) -> tuple[bytes, int]:
        """One ExportTraceServiceRequest with the spans of `recs`, serialized; and the span count."""
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", self.service_name
        ss = rs.scope_spans.add()
        ss.scope.name, ss.scope.version = "nomyo_router", __version__
        spans = ss.spans
        for i, rec in enumerate(recs, 1):
            self._spans(rec, spans)
            if not i % YIELD_EVERY:
                time.sleep(0)  # let the event loop have the GIL now, not after the 5 ms switch interval
        return req.SerializeToString(), len(spans)

    def _ns(self, t: float) -> int:
        return self._offset_ns + int(t * 1e9)

    def _server(self, url: str) -> tuple[str, int]:
        where = self._servers.get(url)
        if where is None:
            parts = urlsplit(url)
            where = self._servers[url] = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        return where

    def _template(
        self,
        key: tuple[Any, ...],
        kind: Span.SpanKind.ValueType,
        operation: str,
        model: str,
        ep: Any,
        served: str | None = None,
        route: str | None = None,
    ) -> bytes:
        """The encoded name, kind and shared attributes of a span for `key`."""
        data = self._templates.get(key)
        if data is None:
            if len(self._templates) >= MAX_TEMPLATES or self._template_bytes >= MAX_TEMPLATE_BYTES:
                self._templates.clear()  # (models and endpoints come and go with reloads)
                self._template_bytes = 0
            t = Span(name=f"{operation} {model}", kind=kind)
            a = t.attributes
            _s(a, "gen_ai.operation.name", operation)
            _s(a, "gen_ai.request.model", model)
            if served:
                _s(a, "gen_ai.response.model", served)
            if ep is not None:
                host, port = self._server(ep.url)
                _s(a, "server.address", host)
                _i(a, "server.port", port)
                _s(a, "nomyo.endpoint", ep.name)
            _s(a, "http.request.method", "POST")
            if route is not None:
                _s(a, "url.path", route)
            data = self._templates[key] = t.SerializeToString()
            self._template_bytes += 2 * len(data)  # (the key holds the same strings)
        return data

    def _spans(self, rec: RequestRecord, spans: Any) -> None:
        trace = cast("Trace", rec.trace)  # (only traced records are submitted: tracing.Tracer.done)
        tid, sid = trace.trace_id.to_bytes(16, "big"), trace.span_id.to_bytes(8, "big")
        start, end = trace.t0, trace.t0 + rec.total_s
        attempts = trace.attempts
        ep = attempts[-1].endpoint if attempts else None
        served = ep.models.get(trace.key) if ep is not None else None  # the backend's name of the model
        s = spans.add(trace_id=tid, span_id=sid, start_time_unix_nano=self._ns(start), end_time_unix_nano=self._ns(end))
        s.MergeFromString(
            self._template(
                (SERVER, trace.operation, rec.model, served, ep, rec.route),
                SERVER,
                trace.operation,
                rec.model,
                ep,
                served,
                rec.route,
            )
        )
        if trace.parent_id:
            s.parent_span_id, s.flags = trace.parent_id.to_bytes(8, "big"), _REMOTE_PARENT
        else:
            s.flags = _LOCAL_PARENT
        a = s.attributes
        _tokens(a, rec)
        if rec.status:
            _i(a, "http.response.status_code", rec.status)
        _f(a, "nomyo.queue_ms", rec.queue_s * 1000)
        _i(a, "nomyo.attempts", len(attempts))
        if rec.affinity:
            _s(a, "nomyo.affinity", rec.affinity)
        _i(a, "nomyo.resumed", rec.resumed)
        _s(a, "nomyo.request_id", rec.request_id)
        a.add(key="nomyo.stream").value.bool_value = rec.stream
        if rec.client:
            _s(a, "nomyo.client", rec.client)
        if rec.status >= 500 or (rec.error and rec.status < 400):
            _s(a, "error.type", rec.error or str(rec.status))
            s.status.code, s.status.message = ERROR, rec.error or ""
        elif rec.status >= 400:
            _s(a, "error.type", rec.error or str(rec.status))  # (a client's error: the span's status stays unset)

        first = attempts[0].start if attempts else None
        if rec.queue_s > 0 or (first is None and rec.error == "queue_timeout"):
            q_end = first if first is not None else end
            q_start = q_end - rec.queue_s if first is not None else start
            q = spans.add(
                trace_id=tid,
                span_id=(getrandbits(64) or 1).to_bytes(8, "big"),
                parent_span_id=sid,
                name="queue",
                kind=INTERNAL,
                flags=_LOCAL_PARENT,
                start_time_unix_nano=self._ns(q_start),
                end_time_unix_nano=self._ns(q_end),
            )
            _f(q.attributes, "nomyo.queue_ms", (q_end - q_start) * 1000)
            if first is None:
                q.status.code, q.status.message = ERROR, rec.error or ""

        last = len(attempts) - 1
        for i, at in enumerate(attempts):
            span_id, aep, a_start, a_end, status, err = at.span_id, at.endpoint, at.start, at.end, at.status, at.error
            if not a_end:
                a_end = attempts[i + 1].start if i < last else end
            model = aep.models.get(trace.key) or rec.model
            c = spans.add(
                trace_id=tid,
                span_id=span_id.to_bytes(8, "big"),
                parent_span_id=sid,
                flags=_LOCAL_PARENT,
                start_time_unix_nano=self._ns(a_start),
                end_time_unix_nano=self._ns(a_end),
            )
            c.MergeFromString(
                self._template((CLIENT, trace.operation, model, aep), CLIENT, trace.operation, model, aep)
            )
            a = c.attributes
            _i(a, "nomyo.attempt", i + 1)
            if status:
                _i(a, "http.response.status_code", status)
            failed = (
                err
                or (i < last and "retried")
                or (status >= 500 and str(status))
                or (i == last and rec.error and rec.status < 400 and rec.error)
            )
            if failed:
                _s(a, "error.type", failed)
                c.status.code, c.status.message = ERROR, failed
            elif i == last:
                _tokens(a, rec)


def _s(attrs: Any, key: str, value: str) -> None:
    attrs.add(key=key).value.string_value = value


def _i(attrs: Any, key: str, value: int) -> None:
    attrs.add(key=key).value.int_value = value


def _f(attrs: Any, key: str, value: float) -> None:
    attrs.add(key=key).value.double_value = value


def _tokens(attrs: Any, rec: RequestRecord) -> None:
    """The backend's own counts, when it reported them."""
    if rec.prompt_tokens is not None:
        _i(attrs, "gen_ai.usage.input_tokens", rec.prompt_tokens)
    if rec.completion_tokens is not None:
        _i(attrs, "gen_ai.usage.output_tokens", rec.completion_tokens)


def _nobody(n: int) -> None:
    """`on_drop` before `start`: nobody to tell."""
