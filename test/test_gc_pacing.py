"""runtime/gc_pacing.py: while a router runs, the oldest generation is collected on a timer,
start-up's objects are frozen out of collections, and the process gets its settings back."""

from __future__ import annotations

import asyncio
import gc
import weakref

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.config import ConfigError, parse_config
from nomyo_router.runtime.gc_pacing import GcPace
from test.helpers import endpoints, run_router


class _Node:
    pass


async def test_cyclic_garbage_is_still_collected_on_the_timer():
    before = gc.get_threshold()
    pace = GcPace(full_s=0.05)
    pace.start()
    try:
        assert not gc.isenabled()  # only the timer collects
        assert gc.get_freeze_count() > 0
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: reference counting never frees it
        gone = weakref.ref(a)
        del a, b
        for _ in range(100):
            await asyncio.sleep(0.02)
            if gone() is None:
                break
        assert gone() is None
    finally:
        pace.stop()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0 and gc.isenabled()


async def test_the_timer_slows_down_while_passes_find_little_garbage_and_not_after_one_that_finds_more():
    pace = GcPace(full_s=10.0)
    pace.start()
    try:
        pace._full()  # nothing to find
        pace._full()
        assert pace.wait_s == 40.0
        for _ in range(5):
            pace._full()
        assert pace.wait_s == 160.0  # at most 16 × gc_full_interval
        nodes = [_Node() for _ in range(2000)]
        for a, b in zip(nodes, nodes[1:] + nodes[:1], strict=True):
            a.other = b  # one cycle of 2,000 objects (and their dicts)
        del nodes, a, b
        pace._full()
        assert pace.wait_s == 10.0
    finally:
        pace.stop()


async def test_requests_leave_no_cyclic_garbage():
    # What a request leaves behind must be freed by reference counting: the timed full pass
    # is rare only while it finds nothing (streams relayed natively or in Python, whole answers).
    async with (
        run_mock(tokens=20, tok_ms=1.0, ttft_ms=0.0) as m,
        run_router({"endpoints": endpoints(m)}) as r,
        aiohttp.ClientSession() as s,
    ):

        async def one(stream: bool, path: str = "/api/chat") -> None:
            body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
            async with s.post(r.url + path, json=body) as resp:
                assert resp.status == 200
                await resp.read()

        for stream in (True, False):  # (first use: lazy imports, pools)
            await one(stream)
            await one(stream, "/v1/chat/completions")
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                for stream in (True, False):
                    await one(stream)
                    await one(stream, "/v1/chat/completions")
            await asyncio.sleep(0.1)
            gc.collect()
            left = [type(o).__name__ for o in gc.garbage]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert left == []


async def test_two_routers_in_one_process_give_the_settings_back_once_both_stop():
    before = gc.get_threshold()
    async with run_mock(tokens=3, tok_ms=0.0, ttft_ms=0.0) as m:
        async with run_router({"endpoints": endpoints(m)}):
            async with run_router({"endpoints": endpoints(m)}):
                assert not gc.isenabled()
            assert not gc.isenabled()  # the first one still runs
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0 and gc.isenabled()


async def test_gc_full_interval_0_leaves_the_collector_as_it_is():
    before = gc.get_threshold()
    async with run_mock(tokens=3, tok_ms=0.0, ttft_ms=0.0) as m:
        async with run_router({"endpoints": endpoints(m), "gc_full_interval": 0}):
            assert gc.get_threshold() == before and gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_negative_gc_full_interval_is_refused_with_its_key():
    with pytest.raises(ConfigError, match="gc_full_interval"):
        parse_config({"endpoints": ["http://127.0.0.1:1"], "gc_full_interval": -1})
