"""Starting a mock: in this event loop (tests) or as its own process (CLI, load tester)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import asdict, fields
from typing import Any

from .config import MockConfig
from .http import Server
from .server import MockBackend


class RunningMock:
    """A mock serving in the current loop; `backend` is the live object, for knobs and stats."""

    def __init__(self, backend: MockBackend, server: Server, url: str) -> None:
        self.backend = backend
        self.url = url
        self._server = server

    def update(self, **changes: Any) -> MockConfig:
        return self.backend.update(**changes)

    def stats(self) -> dict[str, Any]:
        return self.backend.stats()

    async def close(self) -> None:
        await self._server.close()
        if self.backend.kv_events is not None:
            self.backend.kv_events.close()


async def start_mock(config: MockConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> RunningMock:
    backend = MockBackend(config or MockConfig())
    server = Server(backend.handle)
    await server.start(host, port)
    return RunningMock(backend, server, f"http://{host}:{server.port}")


@contextlib.asynccontextmanager
async def run_mock(config: MockConfig | None = None, **knobs: Any) -> AsyncIterator[RunningMock]:
    """`async with run_mock(tokens=5, tok_ms=0) as m:` serves on a free port until the block ends."""
    cfg = (config or MockConfig()).updated(knobs) if knobs else (config or MockConfig())
    mock = await start_mock(cfg)
    try:
        yield mock
    finally:
        await mock.close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def config_args(config: MockConfig) -> list[str]:
    args: list[str] = []
    for f in fields(MockConfig):
        value = getattr(config, f.name)
        if isinstance(value, bool):  # a switch: --name / --no-name
            args.append(("--" if value else "--no-") + f.name.replace("_", "-"))
            continue
        if f.name == "models":
            value = ",".join(value)
        args += ["--" + f.name.replace("_", "-"), str(value)]
    return args


class MockProcess:
    """A mock in a child process (its own core, killable with SIGKILL)."""

    def __init__(self, config: MockConfig | None = None, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.config = config or MockConfig()
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> MockProcess:
        cmd = [sys.executable, "-m", "mock", "--host", self.host, "--port", str(self.port), *config_args(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        wait_http(self.url + "/api/version", timeout, self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            stop_group(self.proc, 5.0)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> MockProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM to `proc`'s process group (it was started in a session of its own, so its
    children go too), SIGKILL when it has not exited after `grace` seconds; a group already
    gone is fine."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, body: bytes | None = None) -> None:
    """Block until `url` answers 200 (to a GET, or to a JSON POST of `body`); fail early if
    `proc` died."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready:\n{err}")
        try:
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"} if body else {})
            with urllib.request.urlopen(request, timeout=2 if body else 1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout:g}s")
        time.sleep(0.05 if body else 0.01)  # (a refused connect costs microseconds: a process up waits for nothing)


def serve_forever(config: MockConfig, host: str, port: int) -> None:
    """The CLI's main loop: serve until SIGINT/SIGTERM."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def main() -> None:
        mock = await start_mock(config, host, port)
        print(json.dumps({"mock": mock.url, "config": asdict(config)}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await mock.close()

    asyncio.run(main())
