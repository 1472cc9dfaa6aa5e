"""The live dashboard: `GET /dashboard` (one self-contained HTML file, no CDN) polls
`GET /dashboard/data` once a second.

The data are what a Prometheus scrape of this router would see (every worker's counters,
`metrics.py`), the `/health` view of endpoints and queue, the stored usage totals, and the
last hour of samples of those counters (`history.py`), so a page opened now draws the past
at once; `?since=T` returns only the samples newer than T (unix seconds), so a page that
polls gets each sample once. The page turns counter deltas into rates and histogram-bucket
deltas into percentiles (TTFT, queue wait, per model and per endpoint), so the numbers are
right whatever the worker count. The page itself holds nothing secret and is open; its
data need the admin or metrics key when keys are configured (the page asks for one).
"""

from __future__ import annotations

import json
import os
import time
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from ..api import listing
from ..api.asgi import Receive, Scope, Send, send_response
from .history import History
from .metrics import LATENCY_BUCKETS
from .usage_api import summary

_PAGE: bytes | None = None


def page() -> bytes:
    global _PAGE
    if _PAGE is None:
        _PAGE = resources.files(__package__).joinpath("dashboard.html").read_bytes()
    return _PAGE


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


def counters(registry: Any) -> dict[str, Any]:
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


def history_for(metrics: Any) -> History:
    """The router's history, sampled from what a scrape of any worker sees."""
    return History(lambda: counters(metrics.scrape_registry()))


def _since(scope: Scope) -> float | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("since")
    try:
        return float(values[0]) if values else None
    except ValueError:
        return None


async def data(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    router = app.current()
    _, health = await listing.health(router.endpoints, router.store, router.health)
    body: dict[str, Any] = {
        "t": round(time.time(), 3),
        "pid": os.getpid(),
        "health": json.loads(health),
        "counters": counters(router.metrics.scrape_registry()),
        "le": list(LATENCY_BUCKETS),
        "history": router.history.describe(),
    }
    if router.usage is not None:
        body["usage"] = summary(await router.usage.rows())["totals"]
    if router.rate_limits.by_client:  # each limited key's use against its limits, read now
        await router.rate_limits.refresh()
        body["limits"] = router.rate_limits.describe()
    samples = router.history.encoded(_since(scope))  # encoded once, when sampled
    raw = json.dumps(body).encode()[:-1] + b',"samples":[' + b",".join(samples) + b"]}"
    await send_response(send, 200, raw, headers=[(b"cache-control", b"no-store")])


async def dashboard(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    await send_response(send, 200, page(), b"text/html; charset=utf-8", headers=[(b"cache-control", b"no-cache")])


ROUTES = {("GET", "/dashboard"): dashboard, ("GET", "/dashboard/data"): data}
