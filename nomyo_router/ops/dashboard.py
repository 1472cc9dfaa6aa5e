"""The live dashboard: `GET /dashboard` (one self-contained HTML file, no CDN) polls
`GET /dashboard/data` once a second.

The data are what a Prometheus scrape of this router would see (every worker's counters,
`metrics.py`), the `/health` view of endpoints and queue, and the stored usage totals; the
page turns counter deltas into rates and histogram-bucket deltas into TTFT percentiles, so
the numbers are right whatever the worker count. The page itself holds nothing secret and is
open; its data need a key when keys are configured (the page asks for one).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from ..api import listing
from ..api.asgi import Receive, Scope, Send, send_response
from .usage_api import summary

_PAGE: bytes | None = None


def page() -> bytes:
    global _PAGE
    if _PAGE is None:
        _PAGE = resources.files(__package__).joinpath("dashboard.html").read_bytes()
    return _PAGE


def _add(into: dict[str, Any], key: str, value: float) -> None:
    into[key] = into.get(key, 0) + value


def counters(registry: Any) -> dict[str, Any]:
    """The counters the page needs, summed over label sets it does not show."""
    out: dict[str, Any] = {"requests": {}, "errors": {}, "prompt_tokens": {}, "completion_tokens": {},
                           "ttft_buckets": {}, "affinity": {}, "events": {}, "endpoint_requests": {}}
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
            elif name == "nomyo_router_time_to_first_byte_seconds_bucket":
                _add(out["ttft_buckets"].setdefault(labels["model"], {}), labels["le"], value)
            elif name == "nomyo_router_affinity_total":
                _add(out["affinity"], labels["outcome"], value)
            elif name == "nomyo_router_events_total":
                _add(out["events"], labels["what"], value)
    return out


async def data(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    router = app.current()
    _, health = await listing.health(router.endpoints, router.store, router.health)
    body: dict[str, Any] = {"health": json.loads(health), "counters": counters(router.metrics.scrape_registry())}
    if router.usage is not None:
        body["usage"] = summary(await router.usage.rows())["totals"]
    await send_response(send, 200, json.dumps(body).encode(), headers=[(b"cache-control", b"no-store")])


async def dashboard(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    await send_response(send, 200, page(), b"text/html; charset=utf-8", headers=[(b"cache-control", b"no-cache")])


ROUTES = {("GET", "/dashboard"): dashboard, ("GET", "/dashboard/data"): data}
