"""Overlapping reloads: the last file read is the one in force. The first SIGHUP's file adds an
endpoint that is slow to discover (a mock that answers its model lists a second late); a second file,
read while the first reload waits, removes a client key. The first reload is superseded, never
applied after the second: the removed key gets 401 then and after the slow discovery would
have ended. Real `nomyo-router` processes, one worker and two."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest

from mock import MockConfig, MockProcess
from test.router_proc import router_workers
from test.test_reload import write

ONE, TWO, ADMIN = "key-one-0123456789", "key-two-0123456789", "admin-key-123456"
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}
LIST_DELAY_S = 1.0


def config(*eps: tuple[str, str], keys: tuple[str, ...]) -> dict[str, object]:
    return {
        "endpoints": [{"url": url, "name": name, "max_concurrent": 4} for name, url in eps],
        "client_keys": [{"name": k[:7], "key": k} for k in keys],
        "admin_key": ADMIN,
        "usage_db": None,
    }


async def status(url: str, key: str) -> int:
    """A chat with `key` on a new connection (with two workers, either may take it)."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/api/chat", json=CHAT, headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        await r.read()
        return r.status


async def discovering(slow: MockProcess, workers: int) -> None:
    """Until each worker's reload asked `slow` for its model list (and waits for it)."""
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(slow.url + "/mock/stats") as r:
                if (await r.json())["errors_injected"].get("list_delay", 0) >= workers:
                    return
            await asyncio.sleep(0.02)
    raise AssertionError("the first reload never asked the slow endpoint for its models")


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_reload_waiting_for_discovery_is_superseded_by_a_later_one(workers):
    fast = MockConfig(ttft_ms=0, tok_ms=0, tokens=2)
    with (
        MockProcess(fast) as a,
        MockProcess(MockConfig(ttft_ms=0, tok_ms=0, tokens=2, list_delay_ms=LIST_DELAY_S * 1000)) as slow,
        router_workers(config(("a", a.url), keys=(ONE, TWO)), workers) as (url, proc),
    ):
        path = proc.args[proc.args.index("--config") + 1]
        assert await status(url, TWO) == 200
        write(path, config(("a", a.url), ("slow", slow.url), keys=(ONE, TWO)))
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGHUP)  # waits a second to discover "slow"
        await discovering(slow, workers)  # (every worker reads the first file and waits)
        write(path, config(("a", a.url), keys=(ONE,)))  # "two" removed
        os.kill(proc.pid, signal.SIGHUP)
        deadline = t0 + 10
        refused = 0  # in a row: every worker has read the second file (each reloads on its own)
        while refused < 8:
            refused = refused + 1 if await status(url, TWO) == 401 else 0
            assert time.monotonic() < deadline, "the second file never took effect"
            if not refused:
                await asyncio.sleep(0.1)
        await asyncio.sleep(max(0.0, t0 + LIST_DELAY_S + 0.5 - time.monotonic()))  # the first's wait is over
        assert [await status(url, TWO) for _ in range(4)] == [401] * 4
        assert [await status(url, ONE) for _ in range(4)] == [200] * 4
        async with (
            aiohttp.ClientSession() as s,
            s.get(url + "/health", headers={"Authorization": f"Bearer {ADMIN}"}) as r,
        ):
            assert [e["name"] for e in (await r.json())["endpoints"]] == ["a"]
