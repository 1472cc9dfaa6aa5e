"""The routers bench/peers.py measures nomyo-router against: getting them (Olla built with Go,
vllm-router installed from PyPI into its own venv, both cached in ~/.cache/nomyo-router/peers)
and running each on a free port, pinned to a core, until the block ends. A peer that cannot
be had is skipped with the reason logged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from collections.abc import Iterator
from contextlib import contextmanager

import yaml

from common import free_port, wait_tcp
from mock.runner import stop_group
from spawn import PATH, Peer, _served, _spawn

CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "nomyo-router", "peers")
HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- getting the peers --------------------------------------------------------------------


def olla_binary(args: argparse.Namespace) -> str | None:
    if args.olla_bin:
        return args.olla_bin
    target = os.path.join(CACHE, "olla")
    if os.path.exists(target):
        return target
    if shutil.which("go") is None:
        log("olla: skipped (no `go` on PATH; install Go or pass --olla-bin)")
        return None
    os.makedirs(CACHE, exist_ok=True)
    env = {**os.environ, "GOBIN": CACHE, "CGO_ENABLED": "0"}
    if args.olla_src:
        cmd, cwd = ["go", "build", "-o", target, "."], args.olla_src
    else:
        cmd, cwd = ["go", "install", "github.com/thushan/olla@latest"], None
    log(f"olla: {' '.join(cmd)}" + (f" (in {cwd})" if cwd else ""))
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not os.path.exists(target):
        log(
            f"olla: skipped (build failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}); "
            "pass --olla-src DIR (a checkout) or --olla-bin PATH"
        )
        return None
    return target


def vllm_router_binary(args: argparse.Namespace) -> str | None:
    env_dir = os.path.join(CACHE, "vllm-router-venv")
    exe = os.path.join(env_dir, "bin", "vllm-router")
    if not os.path.exists(exe):
        log(f"vllm-router: pip install {args.vllm_router} into {env_dir}")
        venv.create(env_dir, with_pip=True)
        done = subprocess.run(
            [os.path.join(env_dir, "bin", "pip"), "install", "-q", args.vllm_router],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0 or not os.path.exists(exe):
            log(f"vllm-router: skipped (pip failed: {done.stderr.strip().splitlines()[-1:]})")
            return None
    return exe


# ---- running them (on core 0) -------------------------------------------------------------


def floor_argv(port: int) -> list[str]:
    """The floor (bench/minimal_passthrough.py: uvicorn + one aiohttp session) on `port`; it
    relays to the URL in its UPSTREAM environment variable."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "minimal_passthrough:app",
        "--app-dir",
        HERE,
        "--port",
        str(port),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--no-access-log",
        "--log-level",
        "warning",
        "--no-proxy-headers",
    ]


@contextmanager
def run_floor(mock: str, core: int | None) -> Iterator[Peer]:
    port = free_port()
    proc = _spawn(floor_argv(port), core, env={**os.environ, "UPSTREAM": mock})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_tcp(port)
        _served(url + PATH, proc)
        yield Peer("floor", url, proc.pid)
    finally:
        stop_group(proc)


@contextmanager
def run_olla(binary: str, mock: str, core: int | None) -> Iterator[Peer]:
    work = tempfile.mkdtemp(prefix="olla-")
    procs: list[subprocess.Popen] = []

    def start(peer: Peer | None = None) -> Peer:
        """A fresh Olla, after every run: wrk cuts the requests in flight when it stops (32 of
        them at c=32), Olla's circuit breaker — 5 consecutive failures, open 30 s, not
        configurable — counts them, and the next run would measure its 502s."""
        if procs:
            stop_group(procs.pop())
        port = free_port()
        cfg = {
            "server": {
                "host": "127.0.0.1",
                "port": port,
                "request_logging": False,
                "rate_limits": {
                    "global_requests_per_minute": 0,
                    "per_ip_requests_per_minute": 0,
                    "health_requests_per_minute": 0,
                },
            },
            "proxy": {"engine": "olla", "profile": "auto", "load_balancer": "least-connections"},
            "discovery": {
                "type": "static",
                "static": {
                    "endpoints": [
                        {
                            "url": mock,
                            "name": "mock",
                            "type": "openai-compatible",
                            "priority": 100,
                            "model_url": "/v1/models",
                            "health_check_url": "/v1/models",
                            # generous, so that a check timing out on a saturated core plays no part
                            "check_interval": "30s",
                            "check_timeout": "10s",
                        }
                    ]
                },
                "model_discovery": {"enabled": True, "interval": "5m", "timeout": "10s"},
            },
            "logging": {"level": "error", "format": "text", "output": "stdout"},
            "dashboard": {"enabled": False},
        }
        path = os.path.join(work, "config.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        proc = _spawn([binary, "--config", path], core, cwd=work)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_tcp(port, 30)
        _served(url + "/olla/proxy" + PATH, proc)
        if peer is None:
            return Peer("olla", url, proc.pid, "/olla/proxy" + PATH, restart=start)
        peer.url, peer.pid = url, proc.pid
        return peer

    try:
        yield start()
    finally:
        if procs:
            stop_group(procs.pop())
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def run_vllm_router(exe: str, mock: str, core: int | None) -> Iterator[Peer]:
    port = free_port()
    proc = _spawn(
        [
            exe,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            mock,
            "--policy",
            "round_robin",
            "--health-check-endpoint",
            "/v1/models",
            "--log-level",
            "error",
            "--max-concurrent-requests",
            "4096",
        ],
        core,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_tcp(port, 60)
        _served(url + PATH, proc)
        yield Peer("vllm-router", url, proc.pid)
    finally:
        stop_group(proc)
