"""Starting and stopping the routers the benchmarks compare, pinned to a core.

Shared by bench/peers.py (every peer beside the others) and bench/scaling.py (nomyo-router
with N workers); kept apart so neither imports the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from common import free_port, wait_http
from loadtest.router_process import router_argv, write_config
from mock.runner import stop_group

MODEL = "llama3"
PATH = "/v1/chat/completions"


@dataclass
class Peer:
    name: str
    url: str  # base URL; requests go to url + PATH (or `path`)
    pid: int
    path: str = PATH
    restart: Callable[[Peer], Peer] | None = None  # a fresh process, after runs that leave it broken


def _spawn(cmd: list[str], core: int | None, **kw) -> subprocess.Popen:
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, **kw)


def _served(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until a chat request through `url` answers 200 (the peer found the mock's model)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    wait_http(url, timeout, proc, body)


@contextmanager
def run_nomyo(mock: str, core: int | None, workers: int = 1, shared: bool = False) -> Iterator[Peer]:
    """`shared`: one worker exactly as each of N (the shared store, multiprocess metrics)."""
    path = write_config(
        {
            "endpoints": [{"url": mock, "name": "mock", "max_concurrent": 4096}],
            "max_queue": 100_000,
            **({"state": "shared"} if shared else {}),
        }
    )
    port = free_port()
    env = dict(os.environ)
    if shared:
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="nomyo-metrics-")
    proc = _spawn(router_argv(path, port, workers), core, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", 30, proc)
        _served(url + PATH, proc)
        yield Peer("nomyo-router", url, proc.pid)
    finally:
        stop_group(proc)
        os.unlink(path)


@contextmanager
def _nomyo_at(mock: str, core: int | None, workers: int, shared: bool = False) -> Iterator[tuple[str, int]]:
    with run_nomyo(mock, core, workers, shared) as peer:
        yield peer.url, peer.pid
