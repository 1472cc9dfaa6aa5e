"""Prometheus metrics, with the official `prometheus-client`.

Counters and histograms are fed from the events hub (`events.py`): one `RequestRecord` per
request, plus discrete happenings (retries, ejections, resumed streams, overload
rejections). A request only adds to plain dicts (bucket found by bisection); the sums are
handed to prometheus-client once a second, and by every scrape before it reads, so many
requests share one locked update — and a scrape still sees every finished request (of the
worker it asks; under several workers the others hand theirs on every 20 ms). Handing on
once per loop iteration instead cost a request that finishes alone (c=1) a flush of its own,
~9 µs (`bench/metrics_cost.py`: 15.0 → 5.5 µs per request).
Gauges that describe state (in-flight, queue, health, loop lag) are read when scraped, by
a collector, so they cost nothing per request.

Workers: under `nomyo-router --workers N` the CLI points PROMETHEUS_MULTIPROC_DIR at a
private directory before the workers start, so every worker writes its counters there
(prometheus-client's multiprocess mode: memory-mapped files) and one scrape of any worker
sums them all — exact, and monotonic across a worker's death (its files stay). With plain
`uvicorn --workers N`, set PROMETHEUS_MULTIPROC_DIR yourself. With Redis, each instance
exposes its own metrics (scrape them all; Prometheus sums).
"""

from __future__ import annotations

import asyncio
import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..events import Events, RequestRecord
from .reasons import reason_of

if TYPE_CHECKING:
    from ..backends.health import LagSource
    from ..domain import Endpoint
    from ..state import StateStore

Labels = tuple[str, ...]  # a metric's label values, in its labels' order
_M = TypeVar("_M", Counter, Histogram)

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
MULTIPROCESS_FLUSH_S = 0.02
IN_PROCESS_FLUSH_S = 1.0  # (a scrape hands on first: this only bounds how long sums wait)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)
# output tokens per second of a stream after its first byte (a backend's decode speed as clients see it)
RATE_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)
# The model label of a request for a model no endpoint serves: labels come from what the
# backends serve and the config, never from what a client wrote (each new label is a
# series kept forever; a client could otherwise grow /metrics without bound).
UNKNOWN_MODEL = "(unknown)"


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# The histograms a request feeds, by their attribute on `Metrics`: (name, help, labels, buckets).
_HISTOGRAMS: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    "latency": ("nomyo_router_request_duration_seconds", "End-to-end latency", ("model", "api"), LATENCY_BUCKETS),
    "ttft": (
        "nomyo_router_time_to_first_byte_seconds",
        "Time to the first byte sent to the client (streams: first token)",
        ("model",),
        LATENCY_BUCKETS,
    ),
    "queue": ("nomyo_router_queue_wait_seconds", "Time waiting for a slot", ("model",), LATENCY_BUCKETS),
    "overhead": ("nomyo_router_overhead_seconds", "Router time before the upstream call", (), OVERHEAD_BUCKETS),
    # per endpoint, for the dashboard's breakdowns
    "endpoint_ttft": (
        "nomyo_router_endpoint_time_to_first_byte_seconds",
        "Time to the first byte sent to the client, by endpoint",
        ("endpoint",),
        LATENCY_BUCKETS,
    ),
    "endpoint_queue": (
        "nomyo_router_endpoint_queue_wait_seconds",
        "Time waiting for a slot, by the endpoint that then took the request",
        ("endpoint",),
        LATENCY_BUCKETS,
    ),
    # per endpoint and model, per client: what a backend gives (first byte, decode speed) and
    # what a key waits (its queue wait while others flood, with fair queuing)
    "served_ttft": (
        "nomyo_router_endpoint_model_time_to_first_byte_seconds",
        "Time to the first byte sent to the client, by endpoint and model",
        ("endpoint", "model"),
        LATENCY_BUCKETS,
    ),
    "output_rate": (
        "nomyo_router_output_tokens_per_second",
        "A stream's completion tokens per second after its first byte, by endpoint and model",
        ("endpoint", "model"),
        RATE_BUCKETS,
    ),
    "client_queue": (
        "nomyo_router_client_queue_wait_seconds",
        'Time waiting for a slot, by client key ("": no key)',
        ("client",),
        LATENCY_BUCKETS,
    ),
}
# What a row added and has not handed on yet: a counter's [increment]; a histogram's [count
# per bucket..., count above the last bucket, sum] (bucket i: value <= buckets[i]).
_Values = list[float]
_Series = tuple[str, Labels]  # a series: its metric (an attribute of Metrics) and its label values


class _Row:
    """What one kind of request — by model, endpoint, API, route, status and client — added
    since the last flush, found with one dict lookup. Each value lives once in the row, and
    `Metrics.flush` hands it to every series it belongs to (a queue wait to the queue
    histograms by model, by endpoint and by client): per request, one addition per
    measurement instead of one per series and a key and lookup for each
    (`Metrics.request_done`: 3.3 -> 1.1 µs per request)."""

    __slots__ = ("gen", "requests", "prompt", "completion", "latency", "ttft", "queue", "overhead", "rate", "targets")

    def __init__(
        self, model: str, endpoint: str | None, api: str, route: str, status: int, client: str, reason: str
    ) -> None:
        ep = endpoint or ""
        self.gen = -1  # the flush generation it was last added to in (Metrics._touched)
        self.targets: list[tuple[_Values, tuple[_Series, ...]]] = []  # each value and its series
        self.requests = self._values(0, ("requests", (model, ep, api, route, str(status), reason)))
        self.prompt = self._values(0, ("tokens", (model, ep, client, "prompt")))
        self.completion = self._values(0, ("tokens", (model, ep, client, "completion")))
        self.latency = self._values(len(LATENCY_BUCKETS), ("latency", (model, api)))
        # (None when no endpoint took it: no queue wait, no overhead, no decode rate)
        self.queue: _Values | None = None
        self.overhead: _Values | None = None
        self.rate: _Values | None = None
        if endpoint is None:  # (nor an endpoint's first byte)
            self.ttft = self._values(len(LATENCY_BUCKETS), ("ttft", (model,)))
        else:
            self.ttft = self._values(
                len(LATENCY_BUCKETS),
                ("ttft", (model,)),
                ("endpoint_ttft", (endpoint,)),
                ("served_ttft", (endpoint, model)),
            )
            self.queue = self._values(
                len(LATENCY_BUCKETS),
                ("queue", (model,)),
                ("endpoint_queue", (endpoint,)),
                ("client_queue", (client,)),
            )
            self.overhead = self._values(len(OVERHEAD_BUCKETS), ("overhead", ()))
            self.rate = self._values(len(RATE_BUCKETS), ("output_rate", (endpoint, model)))

    def _values(self, buckets: int, *series: _Series) -> _Values:
        """A value kept for `series`: a counter's when `buckets` is 0, else a histogram's."""
        vals = [0.0] * (buckets + 2 if buckets else 1)
        self.targets.append((vals, series))
        return vals


class Metrics:
    def __init__(
        self,
        events: Events,
        state: Callable[[], Iterable[Metric]],
        served: Callable[[str], bool] = lambda model: True,
    ) -> None:
        """`state()` yields GaugeMetricFamily objects describing the router now; `served(model)`
        tells whether some endpoint serves a model (else its requests are labelled UNKNOWN_MODEL)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "nomyo_router_requests",
            "Requests by model, endpoint, API, route, status and reason (why one was not served)",
            ["model", "endpoint", "api", "route", "status", "reason"],
            registry=r,
        )
        self.latency = self._histogram("latency")
        self.ttft = self._histogram("ttft")
        self.queue = self._histogram("queue")
        self.overhead = self._histogram("overhead")
        self.tokens = Counter(
            "nomyo_router_tokens", "Tokens the backends reported", ["model", "endpoint", "client", "kind"], registry=r
        )
        self.affinity = Counter("nomyo_router_affinity", "Affinity outcomes", ["outcome"], registry=r)
        self.happenings = Counter(
            "nomyo_router_events",
            "Retries, ejections, resumed streams, overload rejections",
            ["what", "endpoint"],
            registry=r,
        )
        # per endpoint, for the dashboard's breakdowns ("" when no endpoint took the request);
        # `class`: the router's short error code (queue_full, upstream_status, ...), else http_<status>
        self.errors = Counter(
            "nomyo_router_errors",
            "Failed requests by endpoint, status and error class",
            ["endpoint", "status", "class"],
            registry=r,
        )
        self.endpoint_ttft = self._histogram("endpoint_ttft")
        self.endpoint_queue = self._histogram("endpoint_queue")
        self.served_ttft = self._histogram("served_ttft")
        self.output_rate = self._histogram("output_rate")
        self.client_queue = self._histogram("client_queue")
        # (id(metric), labels) -> that metric's child: skips labels() on the hot path
        self._children: dict[tuple[int, Labels], Counter | Histogram] = {}
        self._counts: dict[tuple[Counter, Labels], float] = {}  # (metric, labels) -> increment not yet handed on
        self._rows: dict[tuple[str, str | None, str, str, int, str | None, str | None], _Row] = {}
        self._touched: list[_Row] = []  # the rows added to since the last flush ...
        self._gen = 0  # ... which is this generation
        self._scheduled = False
        # multiprocess mode writes each value to a memory-mapped file (~2 µs, ~12 per flush) that
        # other workers' scrapes read: there, hand on every MULTIPROCESS_FLUSH_S
        self._every = MULTIPROCESS_FLUSH_S if multiprocess_dir() else IN_PROCESS_FLUSH_S
        self._state = state
        self._served = served
        events.on_request_done(self.request_done)
        events.on_count(self.count)
        if multiprocess_dir() is None:
            r.register(_StateCollector(state))

    def _histogram(self, attr: str) -> Histogram:
        name, doc, labels, buckets = _HISTOGRAMS[attr]
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def _child(self, metric: _M, labels: Labels) -> _M:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return cast(_M, child)

    def _inc(self, metric: Counter, labels: Labels, by: float = 1.0) -> None:
        key = (metric, labels)
        self._counts[key] = self._counts.get(key, 0.0) + by

    def _row(
        self, model: str, endpoint: str | None, api: str, route: str, status: int, client: str | None, error: str | None
    ) -> _Row:
        row = self._rows[(model, endpoint, api, route, status, client, error)] = _Row(
            model, endpoint, api, route, status, client or "", reason_of(status, error)
        )
        return row

    def request_done(self, rec: RequestRecord) -> None:
        model, endpoint = rec.model, rec.endpoint  # (a request an endpoint took is for a model it serves)
        if endpoint is None and not self._served(model):
            model = UNKNOWN_MODEL
        row = self._rows.get((model, endpoint, rec.api, rec.route, rec.status, rec.client, rec.error))
        if row is None:
            row = self._row(model, endpoint, rec.api, rec.route, rec.status, rec.client, rec.error)
        if row.gen != self._gen:
            row.gen = self._gen
            self._touched.append(row)
        row.requests[0] += 1.0
        value = rec.total_s
        h = row.latency
        h[bisect_left(LATENCY_BUCKETS, value)] += 1
        h[-1] += value
        ttft = rec.ttft_s
        if ttft is not None:
            h = row.ttft
            h[bisect_left(LATENCY_BUCKETS, ttft)] += 1
            h[-1] += ttft
        if row.queue is not None and row.overhead is not None and row.rate is not None:  # (an endpoint took it)
            value = rec.queue_s
            h = row.queue
            h[bisect_left(LATENCY_BUCKETS, value)] += 1
            h[-1] += value
            value = rec.overhead_s
            h = row.overhead
            h[bisect_left(OVERHEAD_BUCKETS, value)] += 1
            h[-1] += value
            if ttft is not None and rec.stream and rec.completion_tokens and rec.completion_tokens > 1:
                decode = rec.total_s - ttft
                if decode > 0:
                    value = (rec.completion_tokens - 1) / decode
                    h = row.rate
                    h[bisect_left(RATE_BUCKETS, value)] += 1
                    h[-1] += value
        if rec.error is not None or rec.status >= 400:  # (an ApiError without a code says "error")
            cls = rec.error if rec.error not in (None, "error") else f"http_{rec.status}"
            self._inc(self.errors, (endpoint or "", str(rec.status), cls))
        if rec.affinity is not None:
            self._inc(self.affinity, (rec.affinity,))
        if rec.prompt_tokens:
            row.prompt[0] += rec.prompt_tokens
        if rec.completion_tokens:
            row.completion[0] += rec.completion_tokens
        if not self._scheduled:
            self._schedule()

    def count(self, what: str, endpoint: str, model: str) -> None:
        self._inc(self.happenings, (what, endpoint))
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a script): hand on at once
                self.flush()
                return
            loop.call_later(self._every, self.flush)

    def flush(self) -> None:
        """Hand what requests added to prometheus-client (every `_every` s, and before a scrape)."""
        self._scheduled = False
        counts, self._counts = self._counts, {}
        rows, self._touched = self._touched, []
        self._gen += 1
        for (metric, labels), by in counts.items():
            (self._child(metric, labels) if labels else metric).inc(by)
        for row in rows:
            for vals, targets in row.targets:
                if len(vals) == 1:  # a counter's increment
                    if vals[0]:
                        for attr, labels in targets:
                            self._child(getattr(self, attr), labels).inc(vals[0])
                        vals[0] = 0.0
                elif any(vals):
                    for attr, labels in targets:
                        self._hand_histogram(getattr(self, attr), labels, vals)
                    vals[:] = [0.0] * len(vals)

    def _hand_histogram(self, metric: Histogram, labels: Labels, vals: _Values) -> None:
        child = self._child(metric, labels) if labels else metric
        for i in range(len(vals) - 1):
            if vals[i]:
                child._buckets[i].inc(vals[i])  # prometheus-client keeps one value per bucket (non-cumulative)
        child._sum.inc(vals[-1])

    def render(self) -> bytes:
        return generate_latest(self.scrape_registry())

    def scrape_registry(self) -> CollectorRegistry:
        """What one scrape sees: every worker's counters (multiprocess mode) and this worker's
        view of the shared state. The dashboard reads the same."""
        self.flush()
        mp = multiprocess_dir()
        if mp is None:
            return self.registry
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        # (prometheus-client's MultiProcessCollector has no annotations)
        multiprocess.MultiProcessCollector(registry, path=mp)  # type: ignore[no-untyped-call]
        registry.register(_StateCollector(self._state))
        return registry


class _StateCollector:
    def __init__(self, state: Callable[[], Iterable[Metric]]) -> None:
        self.state = state

    def collect(self) -> Iterable[Metric]:
        return self.state()


def state_gauges(endpoints: Sequence[Endpoint], store: StateStore, lag: LagSource) -> list[GaugeMetricFamily]:
    in_flight = GaugeMetricFamily("nomyo_router_in_flight", "Requests holding a slot", labels=["endpoint"])
    slots = GaugeMetricFamily("nomyo_router_slots", "Slots per endpoint", labels=["endpoint"])
    healthy = GaugeMetricFamily(
        "nomyo_router_endpoint_healthy", "1 when the endpoint takes traffic", labels=["endpoint"]
    )
    for ep in endpoints:
        in_flight.add_metric([ep.name], store.in_flight(ep))
        slots.add_metric([ep.name], ep.slots)
        healthy.add_metric([ep.name], 1 if store.is_healthy(ep) else 0)
    queued = GaugeMetricFamily("nomyo_router_queued", "Requests waiting for a slot", value=store.queue_length())
    loop_lag = GaugeMetricFamily(
        "nomyo_router_loop_lag_seconds", "Event-loop lag of the scraped worker", value=lag.recent_max()
    )
    return [in_flight, slots, healthy, queued, loop_lag]


def spin_counter(spun_s: float) -> CounterMetricFamily:
    return CounterMetricFamily(
        "nomyo_router_idle_spin_seconds",
        "Time the scraped worker's loop polled instead of sleeping, for a request or an answer expected soon",
        value=spun_s,
    )
