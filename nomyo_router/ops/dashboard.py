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
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from ..api import listing
from ..server.asgi import Receive, Scope, Send, send_response
from .history import History, counters
from .metrics import LATENCY_BUCKETS
from .usage.routes import summary

if TYPE_CHECKING:
    from ..api.key_admission import RateLimits
    from ..backends.health import Health
    from ..domain import Endpoint
    from ..state import StateStore
    from .metrics import Metrics
    from .usage.store import Usage

_PAGE: bytes | None = None


def page() -> bytes:
    global _PAGE
    if _PAGE is None:
        _PAGE = resources.files(__package__).joinpath("dashboard.html").read_bytes()
    return _PAGE


async def dashboard(scope: Scope, receive: Receive, send: Send) -> None:
    """The page: static, open (it asks for a key when its data need one), served while the
    router is still starting too."""
    await send_response(send, 200, page(), b"text/html; charset=utf-8", headers=[(b"cache-control", b"no-cache")])


def _since(scope: Scope) -> float | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("since")
    try:
        return float(values[0]) if values else None
    except ValueError:
        return None


class Dashboard:
    """`GET /dashboard/data`: one poll's worth of what the page draws."""

    def __init__(
        self,
        endpoints: Callable[[], Sequence[Endpoint]],
        store: StateStore,
        health: Health,
        metrics: Metrics,
        history: History,
        usage: Usage | None,
        rate_limits: RateLimits,
        batches: Callable[[], Awaitable[list[dict[str, object]]]] | None = None,
    ) -> None:
        """`batches`: the batches running now (the Batch API; None: off)."""
        self.endpoints = endpoints  # (a reload replaces the list: read it at each poll)
        self.batches = batches
        self.store, self.health, self.metrics, self.history = store, health, metrics, history
        self.usage, self.rate_limits = usage, rate_limits

    async def data(self, scope: Scope, receive: Receive, send: Send) -> None:
        _, health = await listing.health(self.endpoints(), self.store, self.health)
        body: dict[str, object] = {
            "t": round(time.time(), 3),
            "pid": os.getpid(),
            "health": json.loads(health),
            "counters": counters(self.metrics.scrape_registry()),
            "le": list(LATENCY_BUCKETS),
            "history": self.history.describe(),
        }
        if self.usage is not None:
            body["usage"] = summary(await self.usage.rows())["totals"]
        if self.rate_limits.by_client:  # each limited key's use against its limits, read now
            await self.rate_limits.refresh()
            body["limits"] = self.rate_limits.describe()
        if self.batches is not None:
            body["batches"] = await self.batches()
        samples = self.history.encoded(_since(scope))  # encoded once, when sampled
        raw = json.dumps(body).encode()[:-1] + b',"samples":[' + b",".join(samples) + b"]}"
        await send_response(send, 200, raw, headers=[(b"cache-control", b"no-store")])
