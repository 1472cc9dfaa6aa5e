"""`GET /api/cache/stats` and `POST /api/cache/clear`, and the cache's making at start.

Both need the admin key when any key is configured: the stats tell how much every client
asks alike, and clearing changes what every client gets.
"""

from __future__ import annotations

import json
from typing import Any

from ..api.access import require_admin
from ..api.asgi import Receive, Scope, Send, read_body, send_response
from ..api.errors import ApiError
from ..config import RouterConfig
from ..events import Events
from .redis_store import RedisStore
from .service import ResponseCache
from .stores import MemoryStore, SqliteStore, Store


def make_cache(config: RouterConfig, events: Events, owner: Any = None) -> ResponseCache | None:
    """The response cache `config` asks for, or None when it is off. `owner`: the Router, whose
    proxy semantic mode asks for embeddings (semantic.py)."""
    cfg = config.cache
    if not cfg.enabled:
        return None
    semantic = None
    if cfg.similarity < 1.0:
        from .semantic import Semantic

        semantic = Semantic(cfg, owner)
    store = make_store(config)
    if semantic is not None:
        semantic.store = store
    return ResponseCache(cfg, store, events, semantic)


def make_store(config: RouterConfig) -> Store:
    cfg = config.cache
    if cfg.backend == "sqlite":
        return SqliteStore(cfg)
    if cfg.backend == "redis":
        return RedisStore(cfg, cfg.url or config.state, config.redis_timeout)
    return MemoryStore(cfg)


def _cache(app: Any, scope: Scope, what: str) -> ResponseCache:
    router = app.current()
    require_admin(router, scope, what)
    if router.cache is None:
        raise ApiError(404, "the response cache is off; set cache.enabled: true in the config to turn it on")
    cache: ResponseCache = router.cache
    return cache


async def stats(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    cache = _cache(app, scope, "GET /api/cache/stats")
    await send_response(send, 200, json.dumps(await cache.stats()).encode())


async def clear(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    cache = _cache(app, scope, "POST /api/cache/clear")
    await read_body(scope, receive, 1024)
    await send_response(send, 200, json.dumps({"cleared": await cache.clear()}).encode())


ROUTES = {("GET", "/api/cache/stats"): stats, ("POST", "/api/cache/clear"): clear}
