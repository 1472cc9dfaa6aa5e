"""Closing the usage store ends its flusher even when a write swallowed the cancel.

redis-py, on Python 3.11, writes through `asyncio.wait_for`, which returns the result and
drops the cancel when the reply and the cancel arrive together. A flusher cancelled in that
moment went on flushing every second, and a worker's shutdown waited for it until its
supervisor's caller killed it (a router under `--workers N` with `state: redis://…` that
sometimes took the whole kill grace to stop)."""

from __future__ import annotations

import asyncio

import pytest

from nomyo_router.events import Events
from nomyo_router.ops.usage import store
from nomyo_router.ops.usage.store import Counts, Row, Usage


class SwallowingUsage(Usage):
    """A store whose write, cancelled while in flight, ends normally the first time (as
    redis-py's can when the reply comes with the cancel)."""

    def __init__(self) -> None:
        super().__init__(Events())
        self.writing = asyncio.Event()
        self.writes = 0
        self.swallowed = 0

    async def _write(self, batch: dict[Row, Counts]) -> None:
        self.writes += 1
        self._batch[("2026-01-01", "m", "e", "c")] = [1, 0, 0, 0]  # always something to write next time
        self.writing.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if self.swallowed:  # (a coincidence: only the first cancel is dropped)
                raise
            self.swallowed += 1  # the cancel is dropped, the write "succeeded"


async def test_close_ends_a_flusher_whose_write_swallowed_the_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "FLUSH_S", 0.01)
    usage = SwallowingUsage()
    usage._batch[("2026-01-01", "m", "e", "c")] = [1, 0, 0, 0]
    await usage.start()
    await asyncio.wait_for(usage.writing.wait(), 2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(usage.close(), 2)  # before: the flusher went on, close waited for ever
    assert loop.time() - start < 1.0  # (within a few writes, not the bound)
    assert usage.swallowed == 1
    writes = usage.writes
    await asyncio.sleep(0.1)
    assert usage.writes == writes  # nothing flushes after close


async def test_close_flushes_what_is_left() -> None:
    usage = SwallowingUsage()
    await usage.start()
    usage._batch[("2026-01-01", "m", "e", "c")] = [1, 0, 0, 0]
    await asyncio.wait_for(usage.close(), 2)
    assert usage.writes == 1 and usage.swallowed == 0
