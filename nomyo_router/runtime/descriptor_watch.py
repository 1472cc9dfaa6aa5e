"""Whether this worker sits at its file-descriptor limit, sampled once a second.

A connection the event loop cannot accept for want of a descriptor is never reported to the
application: libuv accepts and closes it (its EMFILE trick), and the client sees a reset. So
each second the open descriptors are counted (a listing of /proc/self/fd) against the soft
limit; a second found at the limit is counted in
`nomyo_router_events_total{what="descriptors_exhausted",endpoint=""}` and said in the
rate-limited line of `h1/descriptors.py`, which names the limit.
"""

from __future__ import annotations

import asyncio

from .. import task_stop as background
from ..events import Events
from ..h1 import descriptors

INTERVAL_S = 1.0


class DescriptorWatch:
    def __init__(self, events: Events, interval: float = INTERVAL_S) -> None:
        self.events = events
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and descriptors.open_count() >= 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await background.end(task)

    def check(self) -> bool:
        """One sample: True (and counted, and said) when the worker is at its limit."""
        soft, _ = descriptors.limits()
        n = descriptors.open_count()
        if n < soft - 1:  # (libuv keeps one descriptor in reserve for its EMFILE trick)
            return False
        self.events.count("descriptors_exhausted", "", "")
        descriptors.exhausted("accept", "new client connections are refused by the OS")
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()
