"""`GET /api/cache/stats` and `POST /api/cache/clear`, and the cache's making at start.

Both need the admin key when any key is configured: the stats tell how much every client
asks alike, and clearing changes what every client gets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..api.errors import ApiError
from ..config import RouterConfig
from ..events import Events
from ..server.asgi import Receive, Scope, Send, read_body, send_response
from .service import ResponseCache
from .stores import AnswerStore, MemoryAnswerStore, SqliteAnswerStore

if TYPE_CHECKING:
    from .semantic import Owner


def make_cache(config: RouterConfig, events: Events, owner: Owner) -> ResponseCache | None:
    """The response cache `config` asks for, or None when it is off. `owner`: the Router, whose
    proxy semantic mode asks for embeddings (semantic.py)."""
    cfg = config.cache
    if not cfg.enabled:
        return None
    store = make_store(config)
    semantic = None
    if cfg.similarity < 1.0:
        from .semantic import Semantic

        semantic = Semantic(cfg, owner, store)
    return ResponseCache(cfg, store, events, semantic)


def make_store(config: RouterConfig) -> AnswerStore:
    cfg = config.cache
    if cfg.backend == "sqlite":
        return SqliteAnswerStore(cfg)
    if cfg.backend == "redis":
        from .redis_store import RedisAnswerStore

        return RedisAnswerStore(cfg, cfg.url or config.state, config.redis_timeout)
    return MemoryAnswerStore(cfg)


class CacheRoutes:
    """The operator's routes over the process's response cache (None: the cache is off);
    `require_admin(scope, what)` refuses anyone but the admin when keys are configured."""

    def __init__(self, cache: ResponseCache | None, require_admin: Callable[[Scope, str], None]) -> None:
        self.cache = cache
        self.require_admin = require_admin

    def _cache(self, scope: Scope, what: str) -> ResponseCache:
        self.require_admin(scope, what)
        if self.cache is None:
            raise ApiError(404, "the response cache is off; set cache.enabled: true in the config to turn it on")
        return self.cache

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        cache = self._cache(scope, "GET /api/cache/stats")
        await send_response(send, 200, json.dumps(await cache.stats()).encode())

    async def clear(self, scope: Scope, receive: Receive, send: Send) -> None:
        cache = self._cache(scope, "POST /api/cache/clear")
        await read_body(scope, receive, 1024)
        await send_response(send, 200, json.dumps({"cleared": await cache.clear()}).encode())
