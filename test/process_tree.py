"""A real `python -m nomyo_router --workers N` whose processes a test can see, kill and wait
for one by one (test/router_proc.py's helper always stops the whole process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from loadtest.router_process import router_argv
from mock import free_port


def descendants(pid: int) -> set[int]:
    """Children, grandchildren, ... of `pid`, from /proc (each process's parent pid)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                raw = Path(f"/proc/{entry}/stat").read_bytes()
                parent_of[int(entry)] = int(raw[raw.rfind(b")") + 2 :].split()[1])
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parent_of.items() if parent in frontier} - out
        out |= frontier
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited process its new parent has not reaped yet)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Waits until none of `pids` runs; returns those still running at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in pids if running(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return None


def write_config(directory: Path, config: dict[str, Any], name: str = "router.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump({"usage_db": str(directory / "usage.db"), **config}))
    return path


@contextlib.contextmanager
def supervisor(
    config: Path,
    workers: int = 2,
    port: int | None = None,
    env: dict[str, str] | None = None,
    wait: float = 30.0,
    unset: tuple[str, ...] = (),
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Starts the router (`env` added to this process's environment, `unset` taken out); the test
    may signal `proc.pid` alone. Whatever is left of the process group (the workers keep the
    supervisor's group) is killed at the end."""
    port = port or free_port()
    log = tempfile.TemporaryFile()  # (a pipe nobody reads could fill and stop the router)
    proc = subprocess.Popen(
        router_argv(str(config), port, workers),
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait
        while health(url) != 200:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"router exited with {proc.returncode}: {log.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready")
            time.sleep(0.1)
        try:
            yield url, proc
        except BaseException:  # the test failed inside: what the router said tells why
            log.seek(0)
            sys.stderr.write(f"router {proc.pid} stderr:\n{log.read().decode(errors='replace')[-4000:]}\n")
            raise
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL if proc.poll() is not None else signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
