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
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..events import Events, RequestRecord

if TYPE_CHECKING:
    from ..domain import Endpoint
    from ..state import StateStore
    from ..upstream.looplag import LoopLag

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


class Metrics:
    def __init__(
        self, events: Events, state: Callable[[], Iterable[Any]], served: Callable[[str], bool] = lambda model: True
    ) -> None:
        """`state()` yields GaugeMetricFamily objects describing the router now; `served(model)`
        tells whether some endpoint serves a model (else its requests are labelled UNKNOWN_MODEL)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "nomyo_router_requests",
            "Requests by model, endpoint, API, route and status",
            ["model", "endpoint", "api", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "nomyo_router_request_duration_seconds",
            "End-to-end latency",
            ["model", "api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "nomyo_router_time_to_first_byte_seconds",
            "Time to the first byte sent to the client (streams: first token)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "nomyo_router_queue_wait_seconds", "Time waiting for a slot", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.overhead = Histogram(
            "nomyo_router_overhead_seconds",
            "Router time before the upstream call",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
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
        self.endpoint_ttft = Histogram(
            "nomyo_router_endpoint_time_to_first_byte_seconds",
            "Time to the first byte sent to the client, by endpoint",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.endpoint_queue = Histogram(
            "nomyo_router_endpoint_queue_wait_seconds",
            "Time waiting for a slot, by the endpoint that then took the request",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # per endpoint and model, per client: what a backend gives (first byte, decode speed) and
        # what a key waits (its queue wait while others flood, with fair queuing)
        self.served_ttft = Histogram(
            "nomyo_router_endpoint_model_time_to_first_byte_seconds",
            "Time to the first byte sent to the client, by endpoint and model",
            ["endpoint", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.output_rate = Histogram(
            "nomyo_router_output_tokens_per_second",
            "A stream's completion tokens per second after its first byte, by endpoint and model",
            ["endpoint", "model"],
            buckets=RATE_BUCKETS,
            registry=r,
        )
        self.client_queue = Histogram(
            "nomyo_router_client_queue_wait_seconds",
            'Time waiting for a slot, by client key ("": no key)',
            ["client"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # (id(metric), labels) -> that metric's child: skips labels() on the hot path
        self._children: dict[tuple[int, Labels], Any] = {}
        self._counts: dict[tuple[Counter, Labels], float] = {}  # (metric, labels) -> increment not yet handed on
        self._hists: dict[tuple[Histogram, Labels], list[float]] = {}  # (metric, labels) -> [bucket counts..., sum]
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

    def _child(self, metric: _M, labels: Labels) -> _M:
        key = (id(metric), labels)
        child: _M | None = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _inc(self, metric: Counter, labels: Labels, by: float = 1.0) -> None:
        key = (metric, labels)
        self._counts[key] = self._counts.get(key, 0.0) + by

    def _observe(self, metric: Histogram, labels: Labels, value: float, buckets: tuple[float, ...]) -> None:
        key = (metric, labels)
        h = self._hists.get(key)
        if h is None:
            h = self._hists[key] = [0.0] * (len(buckets) + 2)
        h[bisect_left(buckets, value)] += 1  # bucket i: value <= buckets[i]; the last-but-one: +Inf
        h[-1] += value

    def request_done(self, rec: RequestRecord) -> None:
        model = rec.model  # (a request an endpoint took is for a model it serves)
        if rec.endpoint is None and not self._served(model):
            model = UNKNOWN_MODEL
        self._inc(self.requests, (model, rec.endpoint or "", rec.api, rec.route, str(rec.status)))
        self._observe(self.latency, (model, rec.api), rec.total_s, LATENCY_BUCKETS)
        if rec.ttft_s is not None:
            self._observe(self.ttft, (model,), rec.ttft_s, LATENCY_BUCKETS)
        if rec.endpoint is not None:
            self._observe(self.queue, (model,), rec.queue_s, LATENCY_BUCKETS)
            self._observe(self.overhead, (), rec.overhead_s, OVERHEAD_BUCKETS)
            self._observe(self.endpoint_queue, (rec.endpoint,), rec.queue_s, LATENCY_BUCKETS)
            self._observe(self.client_queue, (rec.client or "",), rec.queue_s, LATENCY_BUCKETS)
            if rec.ttft_s is not None:
                self._observe(self.endpoint_ttft, (rec.endpoint,), rec.ttft_s, LATENCY_BUCKETS)
                self._observe(self.served_ttft, (rec.endpoint, model), rec.ttft_s, LATENCY_BUCKETS)
                decode = rec.total_s - rec.ttft_s
                if rec.stream and rec.completion_tokens and rec.completion_tokens > 1 and decode > 0:
                    self._observe(
                        self.output_rate, (rec.endpoint, model), (rec.completion_tokens - 1) / decode, RATE_BUCKETS
                    )
        if rec.error is not None or rec.status >= 400:  # (an ApiError without a code says "error")
            cls = rec.error if rec.error not in (None, "error") else f"http_{rec.status}"
            self._inc(self.errors, (rec.endpoint or "", str(rec.status), cls))
        if rec.affinity is not None:
            self._inc(self.affinity, (rec.affinity,))
        if rec.prompt_tokens or rec.completion_tokens:
            client, endpoint = rec.client or "", rec.endpoint or ""
            if rec.prompt_tokens:
                self._inc(self.tokens, (model, endpoint, client, "prompt"), rec.prompt_tokens)
            if rec.completion_tokens:
                self._inc(self.tokens, (model, endpoint, client, "completion"), rec.completion_tokens)
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
        hists, self._hists = self._hists, {}
        for (metric, labels), by in counts.items():
            (self._child(metric, labels) if labels else metric).inc(by)
        for (hist, labels), h in hists.items():
            child = self._child(hist, labels) if labels else hist
            cumulative = child._buckets  # prometheus-client keeps one value per bucket (non-cumulative)
            for i, n in enumerate(h[:-1]):
                if n:
                    cumulative[i].inc(n)
            child._sum.inc(h[-1])

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
    def __init__(self, state: Callable[[], Iterable[Any]]) -> None:
        self.state = state

    def collect(self) -> Iterable[Any]:
        return self.state()


def state_gauges(endpoints: Sequence[Endpoint], store: StateStore, lag: LoopLag) -> list[GaugeMetricFamily]:
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
