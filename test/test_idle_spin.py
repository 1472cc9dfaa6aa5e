"""The idle spin: the loop keeps polling after a request or an answer only while that pays.

Whether the loop spun is read from what it costs: the thread's CPU time while the test
waits (a sleeping loop uses next to none, a spinning one all of its wall time), and the
router's own `nomyo_router_idle_spin_seconds_total`.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from nomyo_router.server.idle_spin import CAP, FEW, IdleSpin
from test.helpers import endpoints, run_router
from test.test_metrics import CHAT, value

WINDOW = 0.05  # long, so that a spin shows in the thread's CPU time on a busy machine


async def _cpu_while_waiting(seconds: float) -> float:
    t0 = time.thread_time()
    await asyncio.sleep(seconds)
    return time.thread_time() - t0


def _steady(spin: IdleSpin, in_progress: int = 1, gap: float = WINDOW / 10) -> None:
    """Arms as a steady stream of quick requests would, `gap` apart."""
    for _ in range(40):
        spin.arm(in_progress)
        spin.last -= gap  # (as if the previous arm was `gap` ago)


async def test_close_arms_make_the_loop_poll_for_a_window_then_sleep():
    spin = IdleSpin(WINDOW)
    _steady(spin)
    t0 = time.perf_counter()
    spin.arm(1)
    assert spin.spinning
    cpu = await _cpu_while_waiting(3 * WINDOW)
    assert not spin.spinning  # the window ran out: the loop sleeps again
    assert cpu >= WINDOW / 5, cpu  # it polled through the window instead of sleeping
    assert WINDOW * 0.9 <= spin.spun_s <= time.perf_counter() - t0, spin.spun_s
    assert await _cpu_while_waiting(3 * WINDOW) < WINDOW / 5  # and now it does sleep


async def test_a_new_arm_while_spinning_extends_the_spin_and_schedules_no_second_one():
    spin = IdleSpin(WINDOW)
    _steady(spin)
    spin.arm(1)
    first = spin.deadline
    await asyncio.sleep(WINDOW / 2)
    spin.arm(1)
    assert spin.spinning and spin.deadline > first
    await asyncio.sleep(2.5 * WINDOW)
    assert not spin.spinning
    assert spin.spun_s >= 1.4 * WINDOW, spin.spun_s  # one spin, from the first arm to the last's window


async def test_far_apart_arms_or_many_requests_in_progress_never_spin():
    spin = IdleSpin(WINDOW)
    for _ in range(5):  # each arm a long time after the last: no spin would be ended by the next
        spin.arm(1)
        assert not spin.spinning
        spin.last -= 10 * WINDOW
    busy = IdleSpin(WINDOW)
    _steady(busy, in_progress=FEW + 1)  # a busy loop seldom sleeps: polling would only split its batches
    assert not busy.spinning
    off = IdleSpin(0.0)
    _steady(off)
    assert not off.spinning
    assert await _cpu_while_waiting(3 * WINDOW) < WINDOW / 5
    assert spin.spun_s == busy.spun_s == off.spun_s == 0.0


async def test_spinning_stops_when_requests_spread_out_and_resumes_after_a_few_close_ones():
    spin = IdleSpin(WINDOW)
    _steady(spin)
    assert spin.gap < WINDOW
    for _ in range(40):  # requests an hour apart: each gap counts as CAP windows, not as an hour
        spin.last -= 3600
        spin.arm(1)
    assert WINDOW < spin.gap <= CAP * WINDOW
    await asyncio.sleep(2 * WINDOW)  # (a spin the first of them started runs out)
    assert not spin.spinning
    arms = 0
    while spin.gap >= WINDOW:
        spin.last -= WINDOW / 10
        spin.arm(1)
        arms += 1
    assert arms <= 12, arms
    assert spin.spinning
    await asyncio.sleep(2 * WINDOW)


async def test_a_router_counts_the_time_it_spun_and_spins_not_when_off(mock):
    seen = {}
    for us in (5000.0, 0.0):  # 5 ms: wider than the gaps between this test's requests
        cfg = {"endpoints": endpoints(mock), "idle_spin_us": us}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            for _ in range(30):
                async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                    assert resp.status == 200
                    await resp.read()
            await asyncio.sleep(0.02)  # the last window runs out
            async with s.get(r.url + "/metrics") as resp:
                seen[us] = value(await resp.text(), "nomyo_router_idle_spin_seconds_total")
    assert seen[0.0] == 0.0
    assert seen[5000.0] > 0.005, seen
