"""upstream/gcpace.py: while a router runs, the oldest generation is collected on a timer,
start-up's objects are frozen out of collections, and the process gets its settings back."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from mock import run_mock
from nomyo_router.config import ConfigError, parse_config
from nomyo_router.upstream.gcpace import GcPace
from test.helpers import endpoints, run_router


class _Node:
    pass


async def test_cyclic_garbage_is_still_collected_on_the_timer():
    before = gc.get_threshold()
    pace = GcPace(full_s=0.05)
    pace.start()
    try:
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10**6
        assert gc.get_freeze_count() > 0
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: reference counting never frees it
        gone = weakref.ref(a)
        gc.disable()  # only the timer may collect it (not an allocation-driven pass)
        try:
            del a, b
            for _ in range(100):
                await asyncio.sleep(0.02)
                if gone() is None:
                    break
        finally:
            gc.enable()
        assert gone() is None
    finally:
        pace.stop()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


async def test_two_routers_in_one_process_give_the_settings_back_once_both_stop():
    before = gc.get_threshold()
    async with run_mock(tokens=3, tok_ms=0.0, ttft_ms=0.0) as m:
        async with run_router({"endpoints": endpoints(m)}):
            async with run_router({"endpoints": endpoints(m)}):
                assert gc.get_threshold()[2] > 10**6
            assert gc.get_threshold()[2] > 10**6  # the first one still runs
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


async def test_gc_full_interval_0_leaves_the_collector_as_it_is():
    before = gc.get_threshold()
    async with run_mock(tokens=3, tok_ms=0.0, ttft_ms=0.0) as m:
        async with run_router({"endpoints": endpoints(m), "gc_full_interval": 0}):
            assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_negative_gc_full_interval_is_refused_with_its_key():
    with pytest.raises(ConfigError, match="gc_full_interval"):
        parse_config({"endpoints": ["http://127.0.0.1:1"], "gc_full_interval": -1})
