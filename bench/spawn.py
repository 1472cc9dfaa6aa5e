"""Starting and stopping the routers the benchmarks compare, pinned to a core.

Shared by bench/peers.py (every peer beside the others) and bench/scaling.py (nomyo-router
with N workers); kept apart so neither imports the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from common import free_port, wait_http
from loadtest.router_process import write_config
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


def cli_argv(config_path: str, port: int, workers: int = 1, exe: str | None = None) -> list[str]:
    """`nomyo-router` as its users start it: the console script `exe`, by default the one
    installed beside this interpreter (so `.venv-pip/bin/python bench/peers.py` measures what
    `pip install .` gives, `.venv-compiled/bin/python ...` the compiled build), with no option
    but the config, the port and the workers (the default log level, info, included)."""
    exe = exe or os.path.join(os.path.dirname(sys.executable), "nomyo-router")
    if not os.path.exists(exe):
        raise SystemExit(f"{exe} not found: install the router into this interpreter's environment (pip install .)")
    return [exe, "--config", config_path, "--port", str(port), "--workers", str(workers)]


def plain_config(mock: str, slots: int | None) -> dict[str, object]:
    """The config a user writes to put the router in front of one backend: its URL and, to
    compare proxies rather than admission, `slots` for it (None: the router's default of 2,
    beyond which requests wait in its queue, as they should in front of a real LLM server)."""
    endpoint: dict[str, object] = {"url": mock, "name": "mock"}
    if slots is not None:
        endpoint["max_concurrent"] = slots
    return {"endpoints": [endpoint]}


@contextmanager
def run_nomyo(
    mock: str,
    core: int | None,
    workers: int = 1,
    shared: bool = False,
    slots: int | None = 4096,
    exe: str | None = None,
    name: str = "nomyo-router",
) -> Iterator[Peer]:
    """The router from its CLI (`exe`: see `cli_argv`) with a plain config (`plain_config`),
    pinned to `core`; the peer's `restart` starts a fresh one. `shared`: one worker exactly as
    each of N (the shared store, multiprocess metrics)."""
    config = plain_config(mock, slots)
    if shared:
        config["state"] = "shared"
    path = write_config(config)
    env = dict(os.environ)
    if shared:
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="nomyo-metrics-")
    procs: list[subprocess.Popen] = []

    def start(peer: Peer | None = None) -> Peer:
        if procs:
            stop_group(procs.pop())
        port = free_port()
        proc = _spawn(cli_argv(path, port, workers, exe), core, env=env)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", 30, proc)
        _served(url + PATH, proc)
        if peer is None:
            return Peer(name, url, proc.pid, restart=start)
        peer.url, peer.pid = url, proc.pid
        return peer

    try:
        yield start()
    finally:
        if procs:
            stop_group(procs.pop())
        os.unlink(path)


@contextmanager
def _nomyo_at(mock: str, core: int | None, workers: int, shared: bool = False) -> Iterator[tuple[str, int]]:
    with run_nomyo(mock, core, workers, shared) as peer:
        yield peer.url, peer.pid
