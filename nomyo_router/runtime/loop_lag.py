"""How late this process's event loop runs: the router's own load, measured.

A timer asks to wake every `interval` seconds and records how late it woke. A saturated
loop delays everything it runs, health probes included: a probe that times out while
the loop lags says nothing about the backend. The same figure decides when
the router itself is overloaded and should turn work away explicitly.
"""

from __future__ import annotations

import asyncio
import time


class LoopLag:
    def __init__(self, interval: float = 0.1, window: float = 2.0) -> None:
        self.interval = interval
        self.window = window
        self.lag = 0.0  # seconds late, last tick
        self._peaks: list[tuple[float, float]] = []  # (when, lag) of recent ticks, newest last
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        interval = self.interval
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(interval)
            now = time.monotonic()
            self.record(now, max(0.0, now - t0 - interval))

    def record(self, now: float, lag: float) -> None:
        self.lag = lag
        peaks = self._peaks
        peaks.append((now, lag))
        cutoff = now - self.window
        while peaks and peaks[0][0] < cutoff:
            peaks.pop(0)

    def recent_max(self, since: float | None = None) -> float:
        """The worst lag seen in the window (or since `since`, a monotonic time), including
        the tick that is overdue right now."""
        now = time.monotonic()
        worst = max((lag for when, lag in self._peaks if since is None or when >= since), default=0.0)
        if self._peaks:  # a tick that has not come yet is late too (the loop is blocked now)
            overdue = now - self._peaks[-1][0] - self.interval
            worst = max(worst, overdue)
        return worst
