"""Shared bench helpers: wrk runs, process RSS, a zero-delay mock and a router as subprocesses."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loadtest.router_process import router_process as start_router  # noqa: E402
from mock import MockConfig, MockProcess, free_port  # noqa: E402,F401
from mock.runner import wait_http  # noqa: E402,F401

ZERO = MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=8, parallel=100_000, max_queue=100_000)

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def wrk(
    url: str, body: str, conc: int, seconds: float = 4.0, headers: dict[str, str] | None = None
) -> dict[str, float]:
    """req/s and p50/p99 (ms) of a wrk POST run."""
    body_lua = body.replace("\\", "\\\\").replace("'", "\\'")
    lua = f"wrk.method='POST'\nwrk.body='{body_lua}'\nwrk.headers['Content-Type']='application/json'\n"
    for name, value in (headers or {}).items():
        lua += f"wrk.headers['{name}']='{value}'\n"
    return wrk_script(url, lua, conc, seconds)


def wrk_script(url: str, lua: str, conc: int, seconds: float) -> dict[str, float]:
    """req/s, p50/p99 (ms) and non-2xx count of a wrk run driven by the Lua script `lua`."""
    out = wrk_output(url, lua, conc, seconds, latency=True)
    res = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        res[f"p{pct}_ms"] = float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["non2xx"] = int(errors.group(1)) if errors else 0
    return res


def wrk_output(url: str, lua: str, conc: int, seconds: float, latency: bool = False) -> str:
    """What a wrk run driven by the Lua script `lua` prints (one thread, `conc` connections,
    whole seconds); `latency`: with its latency distribution."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
        script = f.name
    try:
        return subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{conc}",
                f"-d{max(1, round(seconds))}s",
                *(["--latency"] if latency else []),
                "-s",
                script,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 30,
        ).stdout
    finally:
        os.unlink(script)


def wait_tcp(port: int, timeout: float = 20.0) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def rss_mb(pid: int) -> float:
    total = 0
    for p in [pid] + _children(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def cpu_of(pid: int) -> float:
    """utime+stime of one process, in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []
    return kids + [g for k in kids for g in _children(k)]


@contextmanager
def mock_process(config: MockConfig = ZERO) -> Iterator[MockProcess]:
    with MockProcess(config) as m:
        yield m


def router_process(
    endpoints: list[dict], workers: int = 1, core: int | None = None, **extra: object
) -> AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """A router on a free port (pinned to `core` if given) until the block ends; `extra`: more
    config keys."""
    return start_router({"endpoints": endpoints, "max_queue": 100_000, **extra}, workers, core)
