"""Waiting for what a test waits for, instead of sleeping past it: a condition polled until it
holds (the test fails when it does not in time), and the next call of a component's background
job (a store's sweep, a usage flush) counted to its end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def until(check: Callable[[], bool], within: float) -> float:
    """Seconds until `check()` holds; fails the test after `within`."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < within, "condition not met in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


class Calls:
    """Counts the calls of `obj`'s coroutine method `name` begun and ended, so that a test
    waits for the store's next sweep (or usage flush) instead of sleeping past it."""

    def __init__(self, obj: object, name: str) -> None:
        inner = getattr(obj, name)  # (fails loudly if the method is renamed)
        self.begun = self.ended = 0

        async def counted(*args: Any) -> Any:
            self.begun += 1
            try:
                return await inner(*args)
            finally:
                self.ended += 1

        setattr(obj, name, counted)

    async def next(self, within: float = 3.0) -> None:
        """Until a call begun after this one has ended (the job's calls run one after another)."""
        target = self.begun + 1
        await until(lambda: self.ended >= target, within)
