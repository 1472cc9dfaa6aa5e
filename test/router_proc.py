"""The router as a real multi-process server (`nomyo-router --workers N`) for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Iterator

import yaml

from mock import free_port
from mock.runner import wait_http


@contextlib.contextmanager
def router_workers(config: dict[str, Any], workers: int, state_path: str | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    port = free_port()
    env = dict(os.environ)
    if state_path:
        env["NOMYO_ROUTER_STATE_PATH"] = state_path
    proc = subprocess.Popen([sys.executable, "-m", "nomyo_router", "--config", path, "--port", str(port),
                             "--workers", str(workers), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
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
