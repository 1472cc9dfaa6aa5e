"""The router as a real multi-process server (`nomyo-router --workers N`) for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import yaml

from mock import free_port
from mock.runner import wait_http


@contextlib.contextmanager
def router_workers(
    config: dict[str, Any], workers: int, state_path: str | None = None, wait: bool = True
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`wait=False`: return at once (when this test's own event loop must keep running,
    e.g. because it hosts the shared state); then await `ready(url)`."""
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(
            {"usage_db": os.path.join(tempfile.gettempdir(), f"nomyo-usage-test-{os.getpid()}.db"), **config}, f
        )
    port = free_port()
    env = dict(os.environ)
    if state_path:
        env["NOMYO_ROUTER_STATE_PATH"] = state_path
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nomyo_router",
            "--config",
            path,
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if wait:
            wait_http(url + "/health", 30, proc)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.unlink(path)


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
            await asyncio.sleep(0.1)
