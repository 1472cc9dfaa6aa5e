"""Background loops end at shutdown even when one cancel is dropped.

redis-py, on Python 3.11, sends commands through `asyncio.wait_for`, which drops a cancel
that arrives with the reply. The response cache's counter flusher and the rate limits'
refresher talk to Redis in a loop like the usage store's flusher did, and a shutdown that
cancelled them once could wait for ever (nomyo_router/task_stop.py)."""

from __future__ import annotations

import asyncio

import pytest

from nomyo_router import task_stop as background
from nomyo_router.cache import service
from nomyo_router.cache.service import ResponseCache
from nomyo_router.cache.stores import MemoryAnswerStore
from nomyo_router.config import CacheConfig
from nomyo_router.events import Events


async def _swallows_one_cancel(state: dict[str, int]) -> None:
    """A loop whose awaited call ends normally the first time it is cancelled."""
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if state["swallowed"]:
                raise
            state["swallowed"] += 1


async def test_end_ends_a_task_that_dropped_a_cancel() -> None:
    state = {"swallowed": 0}
    task = asyncio.get_running_loop().create_task(_swallows_one_cancel(state))
    await asyncio.sleep(0.01)
    await asyncio.wait_for(background.end(task), 2)
    assert task.done() and state["swallowed"] == 1


async def test_end_retrieves_what_the_task_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.get_running_loop().create_task(fails())
    await asyncio.sleep(0)
    await background.end(task)  # (no "exception was never retrieved" later)
    assert task.done() and isinstance(task.exception(), RuntimeError)


class SwallowingStore(MemoryAnswerStore):
    """Adding the counters, cancelled while in flight, ends normally the first time."""

    def __init__(self) -> None:
        super().__init__(CacheConfig(enabled=True))
        self.adding = asyncio.Event()
        self.adds = 0
        self.swallowed = 0

    async def add_counts(self, hits: int, misses: int) -> None:
        self.adds += 1
        self.adding.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1


async def test_the_cache_closes_while_its_flusher_dropped_a_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "FLUSH_S", 0.01)
    store = SwallowingStore()
    cache = ResponseCache(CacheConfig(enabled=True), store, Events())
    await cache.start()

    async def keep_counting() -> None:  # always something for the flusher to add
        while True:
            cache.hits += 1
            await asyncio.sleep(0.005)

    counting = asyncio.get_running_loop().create_task(keep_counting())
    try:
        await asyncio.wait_for(store.adding.wait(), 2)
        store.adding.clear()
        await asyncio.wait_for(store.adding.wait(), 2)  # cancel lands while a write is in flight
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.wait_for(cache.close(), 2)  # before: the flusher went on, close waited for ever
        assert loop.time() - start < 1.0  # (wait_for's own cancel would free it only at 2 s)
    finally:
        counting.cancel()
    assert store.swallowed == 1
    adds = store.adds
    await asyncio.sleep(0.1)
    assert store.adds == adds  # nothing is added after close
