"""GET /api/status: Ollama's server status (v0.24: `{"cloud": {"disabled", "source"}}`).

Answered by the Ollama endpoints (asked concurrently, the first healthy answer in config
order wins: they are configured alike); with none reachable, the router's own view: cloud
models are not something it can reach, so `{"cloud": {"disabled": true, "source": "none"}}`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..domain import Endpoint
from ..upstream.h1 import ClientError
from .asgi import Receive, Scope, Send, send_response

FALLBACK = json.dumps({"cloud": {"disabled": True, "source": "none"}}).encode()


async def status(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    router = app.current()
    timeout = router.config.health_timeout

    async def one(ep: Endpoint) -> bytes | None:
        try:
            code, _, data = await router.upstream.fetch(ep, "/api/status", total=timeout)
            return data if code == 200 and isinstance(json.loads(data), dict) else None
        except (ClientError, TimeoutError, ValueError):
            return None

    eps = [ep for ep in router.endpoints if ep.type == "ollama" and router.store.is_healthy(ep)]
    answers = await asyncio.gather(*(one(ep) for ep in eps))
    await send_response(
        send, 200, next((a for a in answers if a is not None), FALLBACK), b"application/json; charset=utf-8"
    )


ROUTES = {("GET", "/api/status"): status}
