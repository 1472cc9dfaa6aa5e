"""The response cache's request flow: look up, answer from the cache, or ask a backend and keep
the answer.

Only requests that opted in come here (app.py checks the header and the body field, the one
cost the others pay). A lookup that fails (the store is down) is a miss: the cache never
fails a request. An answer is kept when it is complete, a 200 and no larger than
`max_entry_bytes`; what the client got is captured on its way out (the protocol's direct
writer is not used for these requests, so every byte passes `send`).

Identical requests that meet in flight in one process are answered once: the later ones
wait for the first's answer and are hits (if it fails, each asks a backend itself). A waiting
stream then gets its whole answer at once, when the first one's stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..api.requests import GenRequest
from ..config import CacheConfig
from ..events import Events, RequestRecord
from ..ops.log_limit import LimitedLog
from ..relay.base import ReadyAnswer
from ..relay.cached import CACHED
from ..relay.exchange import Exchange
from ..server.asgi import Headers, Send
from ..task_stop import end
from . import answer as answers
from . import keys, render
from .stores import AnswerStore

if TYPE_CHECKING:  # (numpy is imported only in semantic mode)
    from .semantic import Semantic

log = logging.getLogger("nomyo_router.cache")

Handle = Callable[[GenRequest, Send, RequestRecord], Awaitable[None]]
FLUSH_S = 1.0
HIT, MISS, BYPASS = b"hit", b"miss", b"bypass"
T = TypeVar("T")


class Capture:
    """`send` for a miss: adds the cache header, and keeps a copy of a 200 answer's body up to
    `limit` bytes (`over` beyond: not kept)."""

    __slots__ = ("_send", "limit", "status", "chunks", "size", "over", "done")

    def __init__(self, send: Send, limit: int) -> None:
        self._send, self.limit = send, limit
        self.status = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.over = self.done = False

    async def send(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            self.status = msg["status"]
            msg = {**msg, "headers": [*msg.get("headers", ()), (keys.HEADER, MISS)]}
        elif msg["type"] == "http.response.body":
            body = msg.get("body", b"")
            if body and self.status == 200 and not self.over:
                self.size += len(body)
                if self.size > self.limit:
                    self.over, self.chunks = True, []
                else:
                    self.chunks.append(body)
            if not msg.get("more_body", False):
                self.done = True
        await self._send(msg)


class ResponseCache:
    def __init__(self, cfg: CacheConfig, store: AnswerStore, events: Events, semantic: Semantic | None = None) -> None:
        self.cfg, self.store, self.events = cfg, store, events
        self.semantic = semantic  # in semantic mode, else None
        self.hits = self.misses = 0  # this process's, not yet added to the store's counters
        self._inflight: dict[str, asyncio.Future[bytes | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._log = LimitedLog(log)  # a failing store: a line per outage or per minute, per operation

    async def start(self) -> None:
        await self.store.start()
        self._task = asyncio.get_running_loop().create_task(self._flusher())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await end(task)  # (one cancel is not always enough: task_stop.py)
        await self.flush()
        await self.store.close()

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        hits, misses = self.hits, self.misses
        if not (hits or misses):
            return
        self.hits = self.misses = 0
        try:
            await self.store.add_counts(hits, misses)
        except Exception as e:  # kept for the next flush
            self.hits, self.misses = self.hits + hits, self.misses + misses
            self._log.failed("count", logging.WARNING, "response cache: could not add the counters (%s)", e)
            return
        if self._log.failing("count"):
            self._log.recovered("count", logging.WARNING, "response cache: counters added again")

    async def stats(self) -> dict[str, Any]:
        await self.flush()
        hits, misses = await self.store.counts()
        entries, size = await self.store.size()
        return {
            "hits": hits,
            "misses": misses,
            "entries": entries,
            "bytes": size,
            "backend": self.cfg.backend,
            "mode": "semantic" if self.semantic else "exact",
            "similarity": self.cfg.similarity,
            "ttl": self.cfg.ttl,
        }

    async def clear(self) -> int:
        n = await self.store.clear()
        if self.semantic is not None:
            self.semantic.clear()
        return n

    # ---- the request flow ------------------------------------------------------------------
    async def serve(self, req: GenRequest, ex: Exchange, handle: Handle) -> None:
        """Answer `req` from the cache through `ex` (the way out "cached"), or by `handle`,
        keeping its answer."""
        send, rec = ex.send, ex.rec
        if not keys.cacheable(req):
            rec.cache = "bypass"
            return await handle(req, _with(send, BYPASS), rec)
        ns = req.client or ""
        key = keys.request_key(req, ns)
        data = await self._guarded(self.store.get(key), "read")
        vector = None
        if data is None and self.semantic is not None and self.semantic.applies(req):  # the nearest question
            ns = self.semantic.namespace(req)
            vector = await self._guarded(self.semantic.vector(req, rec), "embed")
            near = await self._guarded(self.semantic.nearest(ns, vector), "read") if vector is not None else None
            data = await self._guarded(self.store.get(near), "read") if near is not None else None
            if near is not None and data is None:
                self.semantic.index.drop(ns, near)  # expired or evicted meanwhile
        if data is None and key in self._inflight:  # the same question is being answered: wait for it
            data = await asyncio.shield(self._inflight[key])
        found = answers.decode(data) if data is not None else None
        if found is not None and (found.whole is not None or found.choices):
            return await self._hit(req, found, ex)
        self.misses += 1
        rec.cache = "miss"
        mine = key not in self._inflight
        if mine:
            self._inflight[key] = asyncio.get_running_loop().create_future()
        kept: bytes | None = None
        try:
            kept = await self._miss(req, send, rec, handle, key, ns, vector)
        finally:
            if mine:
                self._inflight.pop(key).set_result(kept)

    async def _hit(self, req: GenRequest, found: answers.Answer, ex: Exchange) -> None:
        self.hits += 1
        rec = ex.rec
        rec.cache = "hit"
        headers: Headers = [(b"x-request-id", rec.request_id.encode("latin-1")), (keys.HEADER, HIT)]
        ctype, data = render.body(req, found, int((time.perf_counter() - req.t0) * 1e9))
        await ex.relay(CACHED, ReadyAnswer(200, data, headers, ctype, req.stream))
        rec.ttft_s = time.perf_counter() - req.t0
        self.events.count("cache_hit", "", req.key)

    async def _miss(
        self, req: GenRequest, send: Send, rec: RequestRecord, handle: Handle, key: str, ns: str, vector: bytes | None
    ) -> bytes | None:
        cap = Capture(send, self.cfg.max_entry_bytes)
        await handle(req, cap.send, rec)
        if not (cap.done and cap.status == 200 and not cap.over and rec.error is None):
            return None
        data = b"".join(cap.chunks)
        found = answers.of_stream(req.api, req.kind, data) if req.stream else answers.of_whole(req.api, req.kind, data)
        if found is None:
            return None
        if found.prompt_tokens is None and found.completion_tokens is None:  # (a stream without usage)
            found.prompt_tokens, found.completion_tokens = rec.prompt_tokens, rec.completion_tokens
        kept = answers.encode(found)
        if vector is not None and self.semantic is not None and not self.semantic.keepable(req, found):
            vector = None  # personal: found by its exact question only
        await self._guarded(self.store.put(key, ns, kept, vector), "write")
        return kept

    async def _guarded(self, work: Awaitable[T], what: str) -> T | None:
        """`work`'s result, or None when the store fails. Logged per operation (`what`: read,
        write, embed), once per outage or minute (reads may work while every write fails,
        as on a full disk), and once when it works again."""
        try:
            result = await work
        except Exception as e:  # (OSError, timeouts, redis' and sqlite's own errors)
            self._log.failed(
                what,
                logging.WARNING,
                "response cache: could not %s (the %s store: %s: %s); answering from backends",
                what,
                self.cfg.backend,
                type(e).__name__,
                e,
            )
            return None
        if self._log.failing(what):
            self._log.recovered(what, logging.WARNING, "response cache: %s works again", what)
        return result


def _with(send: Send, value: bytes) -> Send:
    async def wrapped(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [*msg.get("headers", ()), (keys.HEADER, value)]}
        await send(msg)

    return wrapped
