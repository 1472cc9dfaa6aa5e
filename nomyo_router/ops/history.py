"""The dashboard's memory: the router's own series over the last hour, so a dashboard
opened now draws the past at once instead of starting empty.

What is kept: time-stamped samples (unix seconds) of the cumulative counters and
histogram buckets the dashboard shows (`counters`), every `SAMPLE_S` seconds for
the last `FINE_S`, and one every `COARSE_S` for the rest of `KEEP_S`. Counters are
cumulative, so dropping samples only makes the older rates coarser: the difference of any
two kept samples is still exact. Memory is bounded by the two ring buffers (at most
FINE_S / SAMPLE_S + KEEP_S / COARSE_S samples), each sample held as its encoded JSON (the
form it is served in, so a poll does not re-encode an hour).

Across workers: every worker samples on its own timer, and what it samples is the
merged view of all workers (`Metrics.scrape_registry`: the multiprocess files under
`nomyo-router --workers N`), so whichever worker answers `/dashboard/data` has the whole
router's history since it started; workers hold nearly the same samples, a few seconds
apart. The alternative, one writer keeping the history in the shared metrics directory,
would need electing that writer and handing the role on when it dies; N readers of a few
small files every 5 s cost less than that machinery (measured with four workers, two
endpoints and two models on a busy 2-core machine: about 2 ms per sample, under 1 KB
encoded). A worker that restarts starts its history again; the page asks for samples newer
than the ones it has, so it keeps what it already drew.

Sampling runs on a timer on the event loop, never on the request path: a sample is one
registry read, the same as one /metrics scrape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .metrics import Metrics

log = logging.getLogger("nomyo_router.dashboard")

SAMPLE_S = 5.0  # resolution of the last FINE_S
FINE_S = 600.0
COARSE_S = 30.0  # resolution of the rest of the hour
KEEP_S = 3600.0
# An internal knob for tests (a short interval so a test sees sampling happen in a
# second, also in a `--workers` router it starts); not a setting.
INTERVAL_ENV = "NOMYO_ROUTER_DASHBOARD_SAMPLE_S"


def sample_interval() -> float:
    try:
        value = float(os.environ.get(INTERVAL_ENV, SAMPLE_S))
    except ValueError:
        return SAMPLE_S
    return value if 0.05 <= value <= SAMPLE_S else SAMPLE_S


class History:
    def __init__(
        self, read: Callable[[], dict[str, Any]], interval: float | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        """`read()` returns one sample (a JSON-able dict, without its time)."""
        self.read, self.clock = read, clock
        self.interval = interval or sample_interval()
        self.fine: deque[tuple[float, bytes]] = deque(maxlen=math.ceil(FINE_S / self.interval) + 2)
        self.coarse: deque[tuple[float, bytes]] = deque(maxlen=math.ceil(KEEP_S / COARSE_S) + 2)
        self._task: asyncio.Task[None] | None = None

    def sample(self, at: float | None = None) -> None:
        """Take one sample now (or stamped `at`, for a test feeding real samples); time only
        moves forward."""
        t = round(self.clock() if at is None else at, 3)
        if self.fine and t <= self.fine[-1][0]:
            return
        item = (t, json.dumps({"t": t, **self.read()}, separators=(",", ":")).encode())
        self.fine.append(item)
        if not self.coarse or t - self.coarse[-1][0] >= COARSE_S - self.interval / 2:
            self.coarse.append(item)
        while self.fine and self.fine[0][0] < t - FINE_S:
            self.fine.popleft()
        while self.coarse and self.coarse[0][0] < t - KEEP_S:
            self.coarse.popleft()

    def encoded(self, since: float | None = None) -> list[bytes]:
        """The samples in time order, coarse ones before the fine window, newer than `since`."""
        first_fine = self.fine[0][0] if self.fine else math.inf
        items = [c for c in self.coarse if c[0] < first_fine] + list(self.fine)
        return [b for t, b in items if since is None or t > since]

    def describe(self) -> dict[str, float]:
        return {"interval_s": self.interval, "fine_s": FINE_S, "coarse_s": COARSE_S, "keep_s": KEEP_S}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            try:
                self.sample()
            except Exception:  # a failed read must not end the history
                log.exception("dashboard history: sampling failed")
            due = max(due + self.interval, loop.time())
            await asyncio.sleep(due - loop.time())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def _add(into: dict[str, Any], key: str, value: float) -> None:
    into[key] = into.get(key, 0) + value


_LE = {b: i for i, b in enumerate(LATENCY_BUCKETS)}
_HISTOGRAMS = {
    "nomyo_router_time_to_first_byte_seconds_bucket": ("ttft", "model"),
    "nomyo_router_endpoint_time_to_first_byte_seconds_bucket": ("endpoint_ttft", "endpoint"),
    "nomyo_router_endpoint_queue_wait_seconds_bucket": ("endpoint_queue", "endpoint"),
}


def _bucket(into: dict[str, list[float]], key: str, le: str, value: float) -> None:
    """Cumulative counts per bucket, in LATENCY_BUCKETS order, +Inf last."""
    counts = into.setdefault(key, [0.0] * (len(LATENCY_BUCKETS) + 1))
    counts[_LE.get(float(le), len(LATENCY_BUCKETS))] += value


def counters(registry: CollectorRegistry) -> dict[str, Any]:
    """The counters the page needs, summed over label sets it does not show: one sample."""
    out: dict[str, Any] = {
        "requests": {},
        "errors": {},
        "prompt_tokens": {},
        "completion_tokens": {},
        "affinity": {},
        "events": {},
        "endpoint_requests": {},
        "endpoint_tokens": {},
        "error_classes": {},
        "ttft": {},
        "endpoint_ttft": {},
        "endpoint_queue": {},
    }
    for family in registry.collect():
        for s in family.samples:
            name, labels, value = s.name, s.labels, s.value
            if name == "nomyo_router_requests_total":
                _add(out["requests"], labels["model"], value)
                if labels["endpoint"]:
                    _add(out["endpoint_requests"], labels["endpoint"], value)
                if not labels["status"].startswith(("2", "3")):
                    _add(out["errors"], labels["model"], value)
            elif name == "nomyo_router_tokens_total":
                _add(out[f"{labels['kind']}_tokens"], labels["model"], value)
                if labels["kind"] == "completion" and labels["endpoint"]:
                    _add(out["endpoint_tokens"], labels["endpoint"], value)
            elif name in _HISTOGRAMS:
                key, label = _HISTOGRAMS[name]
                _bucket(out[key], labels[label], labels["le"], value)
            elif name == "nomyo_router_errors_total":
                by_status = out["error_classes"].setdefault(labels["endpoint"], {})
                _add(by_status.setdefault(labels["status"], {}), labels["class"], value)
            elif name == "nomyo_router_affinity_total":
                _add(out["affinity"], labels["outcome"], value)
            elif name == "nomyo_router_events_total":
                _add(out["events"], labels["what"], value)
    return out


def history_for(metrics: Metrics) -> History:
    """The router's history, sampled from what a scrape of any worker sees."""
    return History(lambda: counters(metrics.scrape_registry()))
