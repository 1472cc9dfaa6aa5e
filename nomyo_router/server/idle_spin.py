"""Keep the event loop polling for a moment after a request arrives or an answer ends.

When the loop has nothing to do it sleeps in `epoll_wait`, and the core it runs on goes
idle. The next event (the backend's answer, the client's next request) then first has to
wake that core: on this project's machines, a virtual one, that costs ~50 µs, paid twice
per request at low load, where it is most of what the router adds to a request's latency.
Go's runtime, and so Olla, avoids most of it by spinning briefly before parking a thread.

`IdleSpin` does the same with the loop's own tools: while armed, a callback re-schedules
itself with `call_soon`, so the loop polls with a zero timeout instead of sleeping; the
events are handled as soon as they arrive, on a core that never went idle. It is armed
when a request has been read and when an answer is complete (the protocol calls `arm`),
and it spins at most `window` seconds after the last of these.

It spins only while that pays: a spin that the next event ends is useful, one that runs
out is CPU for nothing. So it keeps an average of the gaps between arms, and spins only
while that average is under the window: at low but steady load on a fast backend (the
only case where ~50 µs matters), it spins; with LLM answers of milliseconds or more, or
between bursts, it never does. Nor with more than `FEW` requests in progress: then the
loop seldom sleeps, and polling without sleeping would only split the events it takes in
one go into smaller batches. The price: up to `window` of CPU per arm, and the core is
busy rather than idle while it spins (a worker sharing its core with other work takes that
from them). `idle_spin_us: 0` turns it off.
"""

from __future__ import annotations

import asyncio
import time

# Weight of the newest gap in the average; gaps longer than CAP windows count as CAP, so a
# quiet minute does not take hundreds of requests to forget.
WEIGHT, CAP = 0.125, 4.0
FEW = 4  # at most this many requests in progress in the worker, or no spin


class IdleSpin:
    __slots__ = ("window", "gap", "last", "deadline", "started", "spinning", "spun_s", "_loop")

    def __init__(self, window_s: float) -> None:
        self.window = window_s
        self.gap = CAP * window_s  # average time between arms; starts as "too far apart"
        self.last = 0.0  # perf_counter of the last arm
        self.deadline = 0.0  # the current spin ends here (perf_counter)
        self.started = 0.0  # the current spin began here
        self.spinning = False
        self.spun_s = 0.0  # time spent spinning, all spins ended so far (the CPU it may have cost)
        self._loop: asyncio.AbstractEventLoop | None = None

    def arm(self, in_progress: int) -> None:
        """An event the next one may follow closely: spin until `window` from now, if the
        recent gaps say the next one is likely to come within it and `in_progress` (the
        worker's requests being answered) is few."""
        window = self.window
        if not window or in_progress > FEW:
            return
        now = time.perf_counter()
        gap = min(now - self.last, CAP * window)
        self.last = now
        self.gap += (gap - self.gap) * WEIGHT
        if self.gap >= window:
            return
        self.deadline = now + window
        if not self.spinning:
            loop = self._loop = asyncio.get_running_loop()  # (asked per spin: a router may outlive a loop in tests)
            self.spinning = True
            self.started = now
            loop.call_soon(self._spin)

    def _spin(self) -> None:
        now = time.perf_counter()
        if now < self.deadline:
            loop = self._loop
            assert loop is not None
            loop.call_soon(self._spin)  # the loop polls again without sleeping
        else:
            self.spinning = False
            self.spun_s += now - self.started
