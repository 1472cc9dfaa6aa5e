"""Logs rate-limited per cause: a full disk under the response cache (a real tmpfs filled up)
logs one line for many failed writes, not one each; the usage store's flush to a Redis that
is down logs once, not every second; `usage_db: null` writes no usage, with Redis state too.
And the limiter itself: one line a minute per cause with the count of what it held back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from mock import run_mock
from nomyo_router.ops.log_limit import LimitedLog
from test.conftest import FAST, RedisServer
from test.helpers import endpoints, run_router

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_one_line_per_cause_and_minute_with_the_count_held_back(caplog):
    now = [0.0]
    limited = LimitedLog(logging.getLogger("nomyo_router.test"), every=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for i in range(100):  # one failure a second, 100 s long
            now[0] = float(i)
            limited.failed("write", logging.WARNING, "could not write %d rows", i)
            limited.failed("read", logging.WARNING, "could not read")  # another cause: its own lines
        limited.recovered("write", logging.WARNING, "writing again")
        limited.recovered("write", logging.WARNING, "writing again")  # (not failing: nothing)
    assert [r.getMessage() for r in caplog.records] == [
        "could not write 0 rows",
        "could not read",
        "could not write 60 rows (and 59 more times in the last 60 s, not logged)",
        "could not read (and 59 more times in the last 60 s, not logged)",
        "writing again (after 100 failures)",
    ]


@contextlib.contextmanager
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only)."""
    d = tmp_path / "disk"
    d.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill up needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)


def fill(directory: Path) -> None:
    with open(directory / "filler", "wb") as f:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                f.write(b"\0" * 65536)
                f.flush()


async def test_a_full_disk_under_the_response_cache_logs_once_not_per_write(tmp_path, caplog):
    with small_disk(tmp_path) as disk:
        cache = {"enabled": True, "backend": "sqlite", "path": str(disk / "cache.db")}
        async with run_mock(**FAST) as m, run_router({"endpoints": endpoints(m), "cache": cache}) as r:
            fill(disk)
            with caplog.at_level(logging.WARNING, logger="nomyo_router"):
                async with aiohttp.ClientSession() as s:
                    for i in range(20):  # every answer a new one to keep: 20 failed writes
                        body = {"model": "llama3", "messages": [{"role": "user", "content": f"q{i} " * 300}]}
                        async with s.post(
                            r.url + "/api/chat", json={**body, "stream": False, "nomyo": {"cache": True}}
                        ) as resp:
                            assert resp.status == 200  # the cache fails, never the request
                            await resp.read()
                # each answer is kept after it is sent: the 20th write may still be under way
                # (its question leaves the cache's in-flight table once its write has failed)
                for _ in range(500):
                    if not r.router.cache._inflight:
                        break
                    await asyncio.sleep(0.01)
                failed = lines(caplog, "response cache: could not write")
                assert len(failed) == 1, failed
                assert "full" in failed[0], failed  # SQLite's reason: database or disk is full
                os.unlink(disk / "filler")  # room again: the next write works, and says so once
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(
                        r.url + "/api/chat",
                        json={"model": "llama3", "messages": MSGS, "nomyo": {"cache": True}, "stream": False},
                    ) as resp,
                ):
                    assert resp.status == 200
                    await resp.read()
                for _ in range(200):  # (the answer is kept after it is sent: wait for the write)
                    if lines(caplog, "response cache: write works again"):
                        break
                    await asyncio.sleep(0.01)
                assert lines(caplog, "response cache: write works again") == [
                    "response cache: write works again (after 20 failures)"
                ]


async def test_usage_to_a_redis_that_is_down_logs_once_and_usage_db_null_writes_none(caplog):
    with RedisServer() as redis_server:
        state = {"state": redis_server.url, "redis_timeout": 0.2}
        async with run_mock(**FAST) as m:
            async with run_router({"endpoints": endpoints(m), **state, "usage_db": None}) as r:
                assert r.router.usage is None
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(r.url + "/api/chat", json={"model": "llama3", "messages": MSGS, "stream": False}) as resp,
                ):
                    assert resp.status == 200
            db = aioredis.from_url(redis_server.url)
            assert [k async for k in db.scan_iter("*:usage:*")] == []  # (a flush would have come at close)
            await db.aclose()
            async with run_router({"endpoints": endpoints(m), **state}) as r:
                assert r.router.usage is not None
                redis_server.stop()
                with caplog.at_level(logging.WARNING, logger="nomyo_router"):
                    async with aiohttp.ClientSession() as s:
                        for _ in range(3):  # a request to count each second, flushed each second
                            async with s.post(
                                r.url + "/api/chat", json={"model": "llama3", "messages": MSGS, "stream": False}
                            ) as resp:
                                await resp.read()
                            await asyncio.sleep(0.9)
                    failed = lines(caplog, "usage: could not write")
                    assert len(failed) == 1, failed
