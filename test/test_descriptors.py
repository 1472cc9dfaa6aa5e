"""Out of file descriptors is the router's own shortage: a router started with a low
`ulimit -n` (prlimit) and more clients than it has descriptors answers 503
`out_of_descriptors`, ejects no backend, counts it in /metrics and names the limit in its
log; at start the soft limit is raised to the hard one."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator

import aiohttp

from loadtest.router_process import router_argv, write_config
from mock import free_port, run_mock
from mock.runner import stop_group
from test.conftest import FAST
from test.router_proc import ready

BODY = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}).encode()
REQUEST = (
    b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


@contextlib.asynccontextmanager
async def limited_router(mock_url: str, nofile: str) -> AsyncIterator[tuple[str, subprocess.Popen[bytes], str]]:
    """The router from its CLI under `prlimit --nofile=SOFT:HARD`: (url, process, its log's path)."""
    path = write_config({"endpoints": [{"name": "m1", "url": mock_url, "max_concurrent": 64}], "usage_db": None})
    port = free_port()
    argv = router_argv(path, port)
    argv[argv.index("warning")] = "info"
    fd, log_path = tempfile.mkstemp(prefix="nomyo-fd-", suffix=".log")
    proc = subprocess.Popen(
        ["prlimit", f"--nofile={nofile}", *argv],
        stdout=subprocess.DEVNULL,
        stderr=fd,
        start_new_session=True,
    )
    os.close(fd)
    url = f"http://127.0.0.1:{port}"
    try:
        await ready(url)
        yield url, proc, log_path
    finally:
        stop_group(proc, 10.0)
        os.unlink(path)
        os.unlink(log_path)


async def _client(port: int, hold: asyncio.Event) -> str:
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused"
    try:
        await hold.wait()  # (every connection open at once: the router at its limit meanwhile)
        w.write(REQUEST)
        line = await asyncio.wait_for(r.readline(), 10)
        if not line:
            return "closed"  # accepted and closed by the event loop for want of a descriptor
        rest = await asyncio.wait_for(r.read(4096), 5)
        body = rest.partition(b"\r\n\r\n")[2].decode(errors="replace")
        return f"{line.split()[1].decode()} {body}"
    except (OSError, TimeoutError):
        return "closed"
    finally:
        w.close()


async def test_running_out_of_descriptors_blames_no_backend():
    async with run_mock(**FAST) as m, limited_router(m.url, "64:64") as (url, _, log_path):
        port = int(url.rsplit(":", 1)[1])
        hold = asyncio.Event()
        clients = [asyncio.create_task(_client(port, hold)) for _ in range(80)]
        await asyncio.sleep(2.5)  # (more than a second at the limit: the watch samples once a second)
        hold.set()
        results = collections.Counter(await asyncio.gather(*clients))
        short = sum(n for r, n in results.items() if r.startswith("503") and "out of file descriptors" in r)
        assert short > 0, results
        assert not any("no healthy endpoint" in r for r in results), results
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/api/chat", data=BODY) as resp:
                assert resp.status == 200  # descriptors back: served, by the backend never ejected
            async with s.get(url + "/metrics") as resp:
                metrics = await resp.text()
        assert 'nomyo_router_endpoint_healthy{endpoint="m1"} 1.0' in metrics
        counted = {
            line.split("{")[1].split(",")[0]: float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("nomyo_router_events_total") and 'what="descriptors_exhausted"' in line
        }
        assert counted['endpoint="m1"'] == short  # every refused connect, counted once
        assert counted['endpoint=""'] >= 1  # a second found at the limit (the accepting side)
        with open(log_path) as f:
            log = f.read()
        assert "out of file descriptors on connect (to 127.0.0.1:" in log and "RLIMIT_NOFILE soft 64, hard 64" in log
        assert "out of file descriptors on accept" in log
        assert "ejected" not in log


async def test_the_soft_limit_is_raised_to_the_hard_one():
    async with run_mock(**FAST) as m, limited_router(m.url, "100:2048") as (_, proc, log_path):
        with open(f"/proc/{proc.pid}/limits") as f:
            line = next(x for x in f if x.startswith("Max open files"))
        assert line.split()[3:5] == ["2048", "2048"]
        with open(log_path) as f:
            assert "file descriptors: soft limit 2048 (raised from 100), hard 2048" in f.read()
