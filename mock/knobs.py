"""The mock's own control routes, for tests and load runs: `/mock/stats` (its counters),
`/mock/config` (read or change its knobs while it serves), `/mock/reset` (counters and KV
cache) and `/mock/stall` (freeze the whole server, as a GC pause would)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

from . import http as web
from .generation import BadRequest, read_json
from .route_group import Backend, Routes


class Knobs:
    def __init__(self, backend: Backend) -> None:
        self.b = backend
        self.routes: Routes = {
            ("GET", "/mock/stats"): self.stats,
            ("POST", "/mock/config"): self.config,
            ("GET", "/mock/config"): self.config,
            ("POST", "/mock/reset"): self.reset,
            ("POST", "/mock/stall"): self.stall,
        }

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.b.stats())

    async def config(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            changes = await read_json(request)
            try:
                self.b.update(**changes)
            except (ValueError, TypeError) as e:
                raise BadRequest(400, str(e)) from e
        return web.json_response(asdict(self.b.config))

    async def reset(self, request: web.Request) -> web.Response:
        self.b.reset_stats()
        self.b.kv.clear()
        return web.json_response({"ok": True})

    async def stall(self, request: web.Request) -> web.Response:
        """Freeze the whole server for `ms` (a GC pause, a swapped-out process): every request
        in flight and every new one waits. The answer comes after the stall."""
        body = await read_json(request)
        ms = body.get("ms", 500)
        if not isinstance(ms, (int, float)) or isinstance(ms, bool) or not 0 <= ms <= 60_000:
            raise BadRequest(400, "ms must be a number between 0 and 60000")
        self.b.errors_injected["stall"] += 1
        asyncio.get_running_loop().call_soon(time.sleep, ms / 1000)
        return web.json_response({"stalled_ms": ms})
