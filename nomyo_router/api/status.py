"""GET /api/status: Ollama's server status (v0.24: `{"cloud": {"disabled", "source"}}`).

Answered by the Ollama endpoints (asked concurrently, the first healthy answer in config
order wins: they are configured alike); with none reachable, the router's own view: cloud
models are not something it can reach, so `{"cloud": {"disabled": true, "source": "none"}}`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence

from ..domain import Endpoint
from ..h1 import ClientError, Upstream
from ..server.asgi import Receive, Scope, Send, send_response
from ..state import StateStore
from .key_admission import count

FALLBACK = json.dumps({"cloud": {"disabled": True, "source": "none"}}).encode()


class Status:
    """`GET /api/status`, asked of the healthy Ollama endpoints (each within `timeout` seconds)."""

    def __init__(
        self, endpoints: Callable[[], Sequence[Endpoint]], store: StateStore, upstream: Upstream, timeout: float
    ) -> None:
        self.endpoints = endpoints  # (a reload replaces the list: read it at each call)
        self.store, self.upstream, self.timeout = store, upstream, timeout

    async def status(self, scope: Scope, receive: Receive, send: Send) -> None:
        await count(scope)  # (a limited key's rpm)

        async def one(ep: Endpoint) -> bytes | None:
            try:
                code, _, data = await self.upstream.fetch(ep, "/api/status", total=self.timeout)
                return data if code == 200 and isinstance(json.loads(data), dict) else None
            except (ClientError, TimeoutError, ValueError):
                return None

        eps = [ep for ep in self.endpoints() if ep.type == "ollama" and self.store.is_healthy(ep)]
        answers = await asyncio.gather(*(one(ep) for ep in eps))
        await send_response(
            send, 200, next((a for a in answers if a is not None), FALLBACK), b"application/json; charset=utf-8"
        )
