"""The router as a child process on a free port: the load tester's fleet, the benchmarks and
the multi-process tests all start it the same way.

It runs in its own session (process group), so stopping the group also stops uvicorn's worker
processes; its config is written to a temporary YAML file that goes when it stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO

import yaml

from mock.runner import free_port, stop_group, wait_http


def router_argv(
    config_path: str, port: int, workers: int = 1, core: int | None = None, log_level: str = "warning"
) -> list[str]:
    """`nomyo-router` serving the config at `config_path` on `port` (pinned to `core` if given)."""
    pin = ["taskset", "-c", str(core)] if core is not None else []
    # -P: the installed package is served, never a `nomyo_router/` directory the command
    # happens to be started from (a source tree beside a compiled install)
    return [
        *pin,
        sys.executable,
        "-P",
        "-m",
        "nomyo_router",
        "--config",
        config_path,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        log_level,
    ]


def write_config(config: Mapping[str, object], prefix: str = "nomyo-") -> str:
    """`config` in a new temporary YAML file; its path (the caller removes it)."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(dict(config), f)
    return path


@contextmanager
def router_process(
    config: Mapping[str, object],
    workers: int = 1,
    core: int | None = None,
    env: Mapping[str, str] | None = None,
    stderr: int | IO[bytes] = subprocess.PIPE,
    wait: bool = True,
    grace: float = 10.0,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """(its base URL, its process) until the block ends, then its group is stopped (SIGTERM,
    SIGKILL after `grace` seconds). `env`: the whole environment (default: this process's).
    `wait=False`: yield at once, before it answers /health."""
    path = write_config(config)
    port = free_port()
    proc = subprocess.Popen(
        router_argv(path, port, workers, core),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
        env=None if env is None else dict(env),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if wait:
            wait_http(url + "/health", 30, proc)
        yield url, proc
    finally:
        stop_group(proc, grace)
        os.unlink(path)
