"""The cyclic garbage collector, paced for thousands of open streams.

CPython runs a full collection whenever the oldest generation grew by a quarter since the
last one. Every open stream holds a hundred-odd tracked objects (its connections, the
request's coroutine frames, dicts, futures) that live for the stream's length, so under
churn (1,000 streams of 4 s: 250 new ones a second) they reach the oldest generation and a
full collection comes every ~15 s, scanning every open stream's objects each time: up to
75 ms with 1,000 streams, 170 ms with 2,000 (measured with `gc.callbacks`), during which
no stream moves and no request starts. Almost nothing in them is garbage: streams end by
reference counting.

So, while a router runs, collections come from a timer, not from allocations: what
start-up loaded (modules, config) is frozen out of every collection (`gc.freeze`); the young
generations are collected every `YOUNG_S` (0.1 s), what survives them moves to the oldest,
and the oldest is collected every `gc_full_interval` seconds (60; 0 leaves CPython's
collector as it is), an interval that doubles (up to 16×) while those passes find little
garbage (under `LITTLE` objects: a request's path leaves none, test_gc_pacing.py checks it),
back to `gc_full_interval` after one that finds more. When the last router of the process
stops, the process gets its settings back (tests run routers inside one process).

Why young passes on a timer: CPython counts allocations minus deallocations of any age, so
while old streams end as fast as new ones start the young list grows far past its
threshold of 700, and its passes (every ~1 s) took 17–105 ms at 2,000 streams
(`gc.callbacks`): one every 0.1 s scans only what the last 0.1 s left alive. A full pass
with 2,000 open streams takes 130–190 ms: with the doubling, one every 16 minutes once the
process leaves no garbage.

Measured (`bench/overload.py --streams 1000 --seconds 25`, Go load side, alternated, two
runs each): router TTFT p99 68.9 / 78.0 ms without, 59.7 / 65.3 ms with (max 148 / 141
against 116 / 111 ms; the direct p50 is 51 ms). At 1,400 streams, where the router's core
is 80–90% busy, no difference shows (p99 105.6 / 98.2 against 96.1 / 128.1 ms).
"""

from __future__ import annotations

import asyncio
import gc

FULL_S = 60.0  # a full collection at least this often while garbage is found
YOUNG_S = 0.1  # the young generations are collected this often
LITTLE = 1000  # fewer unreachable objects than this in a full pass: the next comes later
LONGEST = 16  # × FULL_S at most between full passes
_state = {"users": 0, "saved": False}


class GcPace:
    def __init__(self, full_s: float = FULL_S) -> None:
        self.full_s = full_s
        self.wait_s = full_s  # until the next full pass (doubles while they find little)
        self.due = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self._timer is not None:
            return
        _state["users"] += 1
        if _state["users"] == 1 and gc.isenabled():
            _state["saved"] = True
            gc.freeze()  # (no collection first: it cost the test suite 30 s; start-up leaves little garbage)
            gc.disable()  # collections come from the timer only
        self._loop = loop = asyncio.get_running_loop()
        self.due = loop.time() + self.wait_s
        self._timer = loop.call_later(YOUNG_S, self._tick)

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        if loop.time() >= self.due:
            self._full()
            self.due = loop.time() + self.wait_s
        else:
            gc.collect(1)  # what survives moves to the oldest generation
        self._timer = loop.call_later(YOUNG_S, self._tick)

    def _full(self) -> None:
        found = gc.collect()
        self.wait_s = min(self.wait_s * 2, self.full_s * LONGEST) if found < LITTLE else self.full_s

    def stop(self) -> None:
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        _state["users"] -= 1
        if _state["users"] == 0 and _state["saved"]:
            gc.enable()
            gc.unfreeze()
            _state["saved"] = False
