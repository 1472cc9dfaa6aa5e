"""Background discovery: each endpoint's type, models and loaded models, and its health.

Selection never does I/O; these loops push what they learn into the endpoints, the
scheduler's model index and the state store. Model lists are shared with the router's other
worker processes (model_sync.py): a change made through one is known to all before the
management call answers, and one process does the periodic poll for all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .. import h1
from ..config import RouterConfig
from ..domain import Endpoint, model_key
from ..h1.errors import OutOfDescriptors
from ..state import StateStore
from .health import Health
from .model_sync import ModelSync, Snapshot

log = logging.getLogger("nomyo_router.discovery")


class StatusError(h1.ClientError):
    """The backend answered, but not 200."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class Discovery:
    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        upstream: h1.Upstream,
        store: StateStore,
        reindex: Callable[[], None],
        config: RouterConfig,
        health: Health,
        learned: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`learned`: what else is learned from the model lists (context windows, which may
        ask each new model's details), awaited after every discovery round."""
        self.endpoints = list(endpoints)
        self.learned = learned
        self._learning: set[asyncio.Task[None]] = set()
        self.health = health
        self.upstream = upstream
        self.store = store
        self.reindex = reindex  # rebuild the routing index (the scheduler's) after lists change
        self.config = config
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: set[Endpoint] = set()
        self._round: asyncio.Future[None] | None = None  # the on-demand re-discovery in progress or last done
        self._round_at = 0.0
        self._ps_round: asyncio.Future[list[None]] | None = None
        self._ps_at = 0.0
        self._timeout = config.health_timeout
        self.sync = ModelSync(store, lambda: self.endpoints, self._reindexed, self._refresh)

    async def start(self) -> None:
        """One round before serving, so the first requests find their models; then loops.
        (Known to the other workers first, so no change made meanwhile passes us by.)"""
        self.sync.start()
        await asyncio.gather(*(self._refresh(ep) for ep in self.endpoints))
        await self._learn()
        self._tasks = [
            asyncio.create_task(self._every(self.config.health_interval, self._probe_all)),
            asyncio.create_task(self._every(self.config.probe_interval_down, self._probe_down)),
            asyncio.create_task(self._periodic(self.config.model_refresh_interval)),
        ]

    async def stop(self) -> None:
        self.sync.stop()
        for t in [*self._tasks, *self._learning]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._learning, return_exceptions=True)

    async def _learn(self) -> None:
        if self.learned is not None:
            try:
                await self.learned()
            except Exception:  # (a backend that fails is the probes' to report)
                log.debug("learning from the model lists failed", exc_info=True)

    def _reindexed(self) -> None:
        """Another worker's lists were applied: routable at once, and learned from now."""
        self.reindex()
        if self.learned is not None:
            task = asyncio.get_running_loop().create_task(self._learn())
            self._learning.add(task)
            task.add_done_callback(self._learning.discard)

    async def _every(self, interval: float, job: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except Exception:  # a background loop must never die
                log.exception("background job failed")

    async def _periodic(self, interval: float) -> None:
        """Poll every endpoint's models when it is this process's turn: one process polls
        and shares, the others apply what it shares (they poll only when it goes quiet)."""
        while True:
            wait = self.sync.next_refresh(interval) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # (then look again: a peer's round may have come)
                continue
            try:
                await self._refresh_all()
            except Exception:  # a background loop must never die
                log.exception("background job failed")

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(ep) for ep in self.endpoints))

    async def _probe_down(self) -> None:
        """Ejected and unreachable endpoints are probed often, so one that comes back is in
        traffic again within a fraction of a second; ejections whose backoff is over end."""
        self.health.tick()
        down = [ep for ep in self.endpoints if self.health.is_down(ep)]
        if down:
            await asyncio.gather(*(self._probe(ep) for ep in down))

    async def refresh_now(self) -> None:
        """Re-discover every endpoint's models now (a request named a model nobody serves):
        concurrent callers share one round, and rounds are at least 1 s apart."""
        if self._round is None or (self._round.done() and time.monotonic() - self._round_at >= 1.0):
            self._round_at = time.monotonic()
            self._round = asyncio.ensure_future(self._refresh_all())
        await asyncio.shield(self._round)

    async def refresh(self, endpoints: Sequence[Endpoint]) -> None:
        """Re-discover these endpoints now (model management just changed them), and return
        once every other worker has applied the new lists too."""
        snaps = await asyncio.gather(*(self._refresh(ep) for ep in endpoints))
        await self._learn()
        await self.sync.share(
            {ep: s for ep, s in zip(endpoints, snaps, strict=True) if s is not None}, wait=True, full=False
        )

    async def fresh_ps(self, max_age: float = 1.0) -> None:
        """Make every Ollama endpoint's /api/ps at most `max_age` s old (for GET /api/ps and
        unloading); concurrent callers share one round."""
        if self._ps_round is None or (self._ps_round.done() and time.monotonic() - self._ps_at > max_age):
            self._ps_at = time.monotonic()
            self._ps_round = asyncio.ensure_future(
                asyncio.gather(*(self._ps(ep) for ep in self.endpoints if ep.type == "ollama"))
            )
        await asyncio.shield(self._ps_round)

    async def _ps(self, ep: Endpoint) -> None:
        try:
            ps = await self._get(ep, "/api/ps")
        except Exception:  # keep what we had; health is the probes' business
            return
        ep.ps = [m for m in ps.get("models", []) if isinstance(m, dict)]
        ep.loaded = frozenset(model_key(m.get("model") or m.get("name", "")) for m in ep.ps)

    async def _refresh_all(self) -> None:
        """Every endpoint, shared with the other workers (they need not poll for a while)."""
        self.sync.last_full = time.monotonic()
        eps = list(self.endpoints)
        snaps = await asyncio.gather(*(self._refresh(ep) for ep in eps))
        await self._learn()
        await self.sync.share({ep: s for ep, s in zip(eps, snaps, strict=True) if s is not None}, wait=False, full=True)

    async def _get(self, ep: Endpoint, path: str) -> Any:
        status, _, body = await self.upstream.fetch(ep, path, total=self._timeout)
        if status != 200:
            raise StatusError(status)
        return json.loads(body) if body.strip() else None  # (as aiohttp's `json()` did)

    async def _probe(self, ep: Endpoint) -> None:
        if ep in self._probing:
            return  # the slow and the fast loop never probe one endpoint twice at once
        self._probing.add(ep)
        started = time.monotonic()
        try:
            if ep.type is None:
                await self._detect(ep)
            else:
                await self._get(ep, "/api/version" if ep.type == "ollama" else "/v1/models")
        except OutOfDescriptors:  # (the router's own shortage says nothing of the backend)
            return
        except Exception as e:
            self.health.probe(ep, False, _describe(e), timed_out=isinstance(e, TimeoutError), started=started)
            return
        finally:
            self._probing.discard(ep)
        if not ep.models:
            await self._refresh(ep)
            await self._learn()
        self.health.probe(ep, True)

    async def _detect(self, ep: Endpoint) -> None:
        try:
            data = await self._get(ep, "/api/version")
            if isinstance(data, dict) and "version" in data:
                ep.type, ep.version = "ollama", str(data["version"])
                return
        except StatusError:
            pass
        await self._get(ep, "/v1/models")
        ep.type = "openai"

    async def refresh_endpoint(self, ep: Endpoint) -> None:
        """Type, models and health of one endpoint now (config reload adds one)."""
        await self._refresh(ep)

    async def _refresh(self, ep: Endpoint) -> Snapshot | None:
        """Refresh models; on failure keep the last list (stale beats empty). Returns what
        was found (to share), None on failure. A list another worker fetched after this
        fetch started wins over it (model_sync.py)."""
        started = time.time()
        try:
            if ep.type is None:
                await self._detect(ep)
            snap: Snapshot = {"at": started, "type": ep.type, "version": ep.version}
            if ep.type == "ollama":
                tags, ps = await asyncio.gather(self._get(ep, "/api/tags"), self._get(ep, "/api/ps"))
                snap["tags"] = [m for m in tags.get("models", []) if isinstance(m, dict)]
                snap["ps"] = [m for m in ps.get("models", []) if isinstance(m, dict)]
                if ep.version is None:
                    snap["version"] = str((await self._get(ep, "/api/version")).get("version"))
            elif ep.static_models is None:
                data = await self._get(ep, "/v1/models")
                snap["openai"] = [m for m in data.get("data", []) if isinstance(m, dict) and "id" in m]
        except OutOfDescriptors:
            return None
        except Exception as e:
            log.warning(
                "endpoint %s: model refresh failed (%s); keeping %d known models", ep.name, _describe(e), len(ep.models)
            )
            self.health.probe(ep, False, _describe(e), timed_out=isinstance(e, TimeoutError))
            self.reindex()
            return None
        self.sync.take(ep, snap)
        self.reindex()
        self.health.probe(ep, True)
        return snap


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
