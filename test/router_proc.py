"""The router as a real multi-process server (`nomyo-router --workers N`) for tests."""

from __future__ import annotations

import contextlib
import os
import subprocess

from loadtest.router_process import router_process
from test.helpers import fresh_usage_db


def router_workers(
    config: dict[str, object], workers: int, state_path: str | None = None, wait: bool = True
) -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """`wait=False`: return at once (when this test's own event loop must keep running,
    e.g. because it hosts the shared state); then await `ready(url)`."""
    usage_db = fresh_usage_db()
    env = dict(os.environ)
    if state_path:
        env["NOMYO_ROUTER_STATE_PATH"] = state_path
    return router_process(
        {"usage_db": usage_db, **config}, workers, env=env, stderr=subprocess.DEVNULL, wait=wait, grace=15.0
    )


async def ready(url: str, timeout: float = 30.0) -> None:
    import asyncio

    import aiohttp

    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url} not ready")
            await asyncio.sleep(0.02)
