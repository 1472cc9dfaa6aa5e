"""Workers die with their supervisor: a SIGKILLed `nomyo-router --workers N` leaves no orphan
holding the port (a restart on the same port works at once), streams in flight do not keep
the orphans alive, and a SIGTERM still drains gracefully. On real processes."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mock import MockConfig, MockProcess
from test.process_tree import descendants, health, supervisor, wait_gone, write_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def backend(**knobs: float) -> MockProcess:
    return MockProcess(MockConfig(**{"ttft_ms": 0.0, "tok_ms": 0.0, "tokens": 4, "parallel": 64, **knobs}))


def env_for(tmp_path: Path) -> dict[str, str]:
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700, exist_ok=True)
    return {"XDG_RUNTIME_DIR": str(xdg)}


class Stream(threading.Thread):
    """One streamed chat, read line by line until the router ends it (or cuts it)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.port = int(url.rsplit(":", 1)[1])
        self.lines: list[dict] = []
        self.first = threading.Event()
        self.ended_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            body = {"model": "llama3", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            conn.request("POST", "/api/chat", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            while line := resp.readline():
                self.lines.append(json.loads(line))
                self.first.set()
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.error = e
        finally:
            self.ended_at = time.monotonic()
            self.first.set()

    @property
    def complete(self) -> bool:
        return bool(self.lines) and self.lines[-1].get("done") is True


def test_sigkill_of_the_supervisor_ends_every_process_and_frees_the_port(tmp_path):
    with backend() as m:
        cfg = write_config(tmp_path, {"endpoints": [{"url": m.url, "name": "m"}]})
        with supervisor(cfg, 2, env=env_for(tmp_path)) as (url, proc):
            tree = descendants(proc.pid)
            assert len(tree) >= 3, tree  # two workers and multiprocessing's resource tracker
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            t0 = time.monotonic()
            left = wait_gone(tree, 3.0)
            assert not left, f"still running 3 s after the supervisor's SIGKILL: {sorted(left)}"
            print(f"every process gone {time.monotonic() - t0:.2f}s after the SIGKILL")
            port = int(url.rsplit(":", 1)[1])
            with supervisor(cfg, 2, port=port, env=env_for(tmp_path), wait=15) as (url2, _):
                assert url2 == url and health(url2) == 200


def test_a_stream_in_flight_does_not_keep_orphaned_workers_alive(tmp_path):
    with backend(tokens=3000, tok_ms=20.0) as m:  # a minute of tokens
        cfg = write_config(tmp_path, {"endpoints": [{"url": m.url, "name": "m"}]})
        with supervisor(cfg, 2, env=env_for(tmp_path)) as (url, proc):
            tree = descendants(proc.pid)
            stream = Stream(url)
            stream.start()
            assert stream.first.wait(10) and stream.lines, stream.error
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            t0 = time.monotonic()
            left = wait_gone(tree, 3.0)
            assert not left, f"still running 3 s after the supervisor's SIGKILL: {sorted(left)}"
            stream.join(5)
            assert stream.ended_at is not None and stream.ended_at - t0 < 3.0
            assert not stream.complete  # cut after the orphan's short grace, not drained for a minute


def test_sigterm_to_the_supervisor_still_drains_streams_gracefully(tmp_path):
    with backend(tokens=30, tok_ms=50.0) as m:  # 1.5 s of tokens
        cfg = write_config(tmp_path, {"endpoints": [{"url": m.url, "name": "m"}]})
        with supervisor(cfg, 2, env=env_for(tmp_path)) as (url, proc):
            tree = descendants(proc.pid)
            stream = Stream(url)
            stream.start()
            assert stream.first.wait(10) and stream.lines, stream.error
            os.kill(proc.pid, signal.SIGTERM)  # the supervisor alone, as systemd's stop would
            stream.join(20)
            assert stream.complete, (stream.error, stream.lines[-1:])
            assert proc.wait(20) == 0
            assert not wait_gone(tree, 3.0)


# ---- the mechanism in a bare process: no router, one parent, one child ----------------

CHILD = r"""
import os, signal, sys, time
from nomyo_router.ops import lifecycle
if sys.argv[2] == "no-prctl":  # as on a system without prctl: only the watcher notices
    lifecycle.arm_parent_death_signal = lambda sig=signal.SIGTERM: False

class Config:
    timeout_graceful_shutdown = 30.0

class Server:  # what the worker's uvicorn Server offers: its config and its exit handler
    config = Config()
    def handle_exit(self, sig, frame):
        print("exit", self.config.timeout_graceful_shutdown, flush=True)
        if sys.argv[2] != "hangs":
            sys.exit(0)

server = Server()
lifecycle.bind_to_parent(int(sys.argv[1]), server)
signal.signal(signal.SIGTERM, server.handle_exit)  # (uvicorn installs it when it serves)
print("ready", flush=True)
while True:
    time.sleep(0.02)
"""

PARENT = r"""
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2]], stdout=open(sys.argv[3], "w"))
time.sleep(120)
"""


@pytest.mark.parametrize("mode, within", [("prctl", 0.5), ("no-prctl", 1.0), ("hangs", 3.0)])
def test_a_child_bound_to_its_parent_ends_when_the_parent_is_killed(tmp_path, mode, within):
    """prctl: at once. Without prctl: the watcher, within its half-second poll. A shutdown that
    hangs: ended by the watcher ORPHAN_DEADLINE_S after it saw the parent gone."""
    out = tmp_path / "out"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, mode, str(out)], start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while "ready" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline, "the child never got ready"
            time.sleep(0.05)
        (child,) = descendants(parent.pid)
        parent.kill()
        parent.wait()
        t0 = time.monotonic()
        assert not wait_gone({child}, within), f"{mode}: child still running after {within}s"
        print(f"{mode}: child gone {time.monotonic() - t0:.2f}s after its parent")
        assert "exit 1.0" in out.read_text()  # an orphan's grace is short, whatever was configured
    finally:
        with contextlib.suppress(ProcessLookupError):  # (what a failed test left of the group)
            os.killpg(parent.pid, signal.SIGKILL)


def test_a_worker_whose_supervisor_died_before_it_was_bound_does_not_start():
    r = subprocess.run(
        [sys.executable, "-c", "from nomyo_router.ops import lifecycle; lifecycle.bind_to_parent(1, None)"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "supervisor 1 is gone; not starting" in r.stderr
