"""Real servers for tests: the router under uvicorn in this event loop, on a free port."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from mock import free_port
from nomyo_router.app import RouterApp
from nomyo_router.config import RouterConfig, parse_config


class _Server(uvicorn.Server):
    """uvicorn's server, stopped without its fixed pauses: uvicorn looks at `should_exit` every
    0.1 s and, stopping, waits 0.1 s after asking the connections to close before it waits for
    them to be closed: 0.2 s of each test's teardown, with hundreds of routers in a run. The
    same steps and the same conditions waited for (no connection, no task left), looked at
    every 5 ms. `stop()` asks it to stop."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self.should_exit = True
        self._stop.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # (the Date header, once a second)
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        while self.server_state.connections or self.server_state.tasks:
            await asyncio.sleep(0.005)
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


class RunningRouter:
    def __init__(self, app: RouterApp, url: str) -> None:
        self.app = app
        self.url = url

    @property
    def router(self):
        return self.app.router


@contextlib.asynccontextmanager
async def run_router(
    config: RouterConfig | dict[str, Any],
    http: str = "nomyo_router.server.protocol:GuardedHttpToolsProtocol",
    keep_alive: float = 5.0,
    tls: tuple[str, str] | None = None,
) -> AsyncIterator[RunningRouter]:
    """`http`: uvicorn's protocol; ours by default (what `nomyo-router` serves with).
    `keep_alive`: seconds an idle kept-alive connection stays open (uvicorn's default).
    `tls`: (key file, certificate file) to serve https."""
    if isinstance(config, dict):
        config = parse_config({"usage_db": fresh_usage_db(), **config})
    app = RouterApp(config)
    port = free_port()
    server = _Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            lifespan="on",
            log_level="warning",
            access_log=False,
            http=http,
            timeout_keep_alive=keep_alive,
            limit_concurrency=config.max_connections or None,
            ssl_keyfile=tls[0] if tls else None,
            ssl_certfile=tls[1] if tls else None,
        )
    )
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # tests own signals
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("router did not start")
        await asyncio.sleep(0.01)
    try:
        yield RunningRouter(app, f"{'https' if tls else 'http'}://127.0.0.1:{port}")
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)


TEST_USAGE_DB = os.path.join(tempfile.gettempdir(), f"nomyo-usage-test-{os.getpid()}.db")
_USAGE_DIR = tempfile.mkdtemp(prefix="nomyo-usage-test-")
atexit.register(shutil.rmtree, _USAGE_DIR, True)
_USAGE_DBS = itertools.count()


def fresh_usage_db() -> str:
    """A usage database of its own for each router a test starts: the token budgets read back
    what a database holds (a restart remembers them), so routers must not share one by chance."""
    return os.path.join(_USAGE_DIR, f"usage-{next(_USAGE_DBS)}.db")


def endpoints(*mocks: Any, slots: int = 2, **extra: Any) -> list[dict[str, Any]]:
    return [{"url": m.url, "name": f"m{i}", "max_concurrent": slots, **extra} for i, m in enumerate(mocks)]


def fifo(done_at: list[float], service: float) -> bool:
    """`done_at[i]`: when request i (in sending order) finished, with 2 slots and a fixed
    service time. Requests i and i+1 may share a wave; any later request j >= i+2 was
    queued behind i and must finish at least about one service time after it. Times, not
    rounded wave numbers: waves drift with the router's per-wave overhead."""
    n = len(done_at)
    return all(done_at[j] - done_at[i] > service / 2 for i in range(n) for j in range(i + 2, n))


async def post_stream_raw(
    url: str, path: str, body: dict[str, Any], rcvbuf: int = 0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST `body` on a plain socket (receive buffer `rcvbuf` if > 0, so the sender's writes
    pile up) and read the head of a 200 chunked answer; the body is left to the caller."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    data = json.dumps(body).encode()
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (path.encode(), len(data), data)
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    return reader, writer


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """One content-length answer from a raw socket: (status line, headers with lower-case
    names, in order, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, *lines = head[:-4].split(b"\r\n")
    headers = [(n.lower(), v) for n, v in (line.split(b": ", 1) for line in lines)]
    body = await asyncio.wait_for(reader.readexactly(int(dict(headers)[b"content-length"])), 10)
    return status, headers, body
