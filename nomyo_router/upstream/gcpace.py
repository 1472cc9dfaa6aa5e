"""The cyclic garbage collector, paced for thousands of open streams (issue 15, item 6).

CPython runs a full collection whenever the oldest generation grew by a quarter since the
last one. Every open stream holds a hundred-odd tracked objects (its connections, the
request's coroutine frames, dicts, futures) that live for the stream's length, so under
churn (1,000 streams of 4 s: 250 new ones a second) they reach the oldest generation and a
full collection comes every ~15 s, scanning every open stream's objects each time: up to
75 ms with 1,000 streams, 170 ms with 2,000 (measured with `gc.callbacks`), during which
no stream moves and no request starts. Almost nothing in them is garbage: streams end by
reference counting.

So, while a router runs: what start-up loaded (modules, config) is frozen out of every
collection (`gc.freeze`); the oldest generation is collected by a timer every
`gc_full_interval` seconds (60; 0 leaves CPython's collector as it is) instead of by
growth, and the interval doubles (up to 16×) while those passes find little garbage (under
`LITTLE` objects: a request's path leaves none, test_native.py checks it), back to
`gc_full_interval` after one that finds more. The young generation keeps CPython's
threshold; the middle one is collected every other young pass (threshold 1, not 10), so
what survives two young passes moves on to the timed generation: a middle pass scanned
up to 10 young passes' survivors, 17–46 ms every second at 2,000 streams (`gc.callbacks`),
and with threshold 1 at most 7 ms. When the last router of the process stops, the process
gets its settings back (tests run routers inside one process). Cyclic garbage that
survives the young passes waits until a timed pass; what requests leave behind is freed by
reference counting.

A full pass with 2,000 open streams takes 130–190 ms (`gc.callbacks`, native relay): with
the doubling, one every 16 minutes once the process leaves no garbage.

Measured (`bench/overload.py --streams 1000 --seconds 25`, Go load side, alternated, two
runs each): router TTFT p99 68.9 / 78.0 ms without, 59.7 / 65.3 ms with (max 148 / 141
against 116 / 111 ms; the direct p50 is 51 ms). At 1,400 streams, where the router's core
is 80–90% busy, no difference shows (p99 105.6 / 98.2 against 96.1 / 128.1 ms).
"""

from __future__ import annotations

import asyncio
import gc

FULL_S = 60.0  # a full collection at least this often while garbage is found
LITTLE = 1000  # fewer unreachable objects than this in a full pass: the next comes later
LONGEST = 16  # × FULL_S at most between full passes
_state = {"users": 0, "saved": None}


class GcPace:
    def __init__(self, full_s: float = FULL_S) -> None:
        self.full_s = full_s
        self.next_s = full_s
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self._timer is not None:
            return
        _state["users"] += 1
        if _state["users"] == 1 and gc.isenabled():
            _state["saved"] = g0, g1, g2 = gc.get_threshold()
            gc.freeze()  # (no collection first: it cost the test suite 30 s; start-up leaves little garbage)
            gc.set_threshold(g0, 1, 1 << 30)  # the oldest generation: only on the timer
        self._arm()

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.next_s, self._full)

    def _full(self) -> None:
        found = gc.collect()
        self.next_s = min(self.next_s * 2, self.full_s * LONGEST) if found < LITTLE else self.full_s
        self._arm()

    def stop(self) -> None:
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        _state["users"] -= 1
        saved = _state["saved"]
        if _state["users"] == 0 and saved is not None:
            gc.set_threshold(*saved)
            gc.unfreeze()
            _state["saved"] = None
