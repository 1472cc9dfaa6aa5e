"""The compiled load side of bench/overload.py: bench/slowgen (Go, stdlib only).

At 2,000 streams × 25 tok/s (~50,000 chunks a second) the Python mock and client saturate
the core they share, so the direct stage measured the load side, not the backend's 50 ms.
bench/slowgen is a fake backend serving the same /api/chat streams as mock/ with
stream_tick_ms (`serve`) and a lean client (`load`, one epoll loop); each runs with
GOMAXPROCS=1 on the caller's cores. It is for that benchmark only: mock/ stays the
project's test backend.

    build() -> path      `go build` into ~/.cache/nomyo-router/ (once per version of the sources)
    backend(...)         the fake backend as a child process (context manager)
    relay(...)           a byte-level TCP relay to it, the floor of any proxy (context manager)
    run(...)             one client run, as a slowload.Outcome
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import slowload

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slowgen")
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "nomyo-router")
_ENV = {"GOMAXPROCS": "1"}


def go_tool() -> str | None:
    """`go` on PATH, else the usual install directory; None without Go."""
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    return found


def build(nice: int = 0) -> str:
    """The slowgen binary for the current sources, built with `go build` if not cached. A
    build under way in another thread or process is waited for, not done twice. `nice`: the
    build's scheduling niceness (a build in the background of other work)."""
    go = go_tool()
    if go is None:
        raise RuntimeError("no `go` on PATH (install Go, or use --load python)")
    digest = hashlib.sha256()
    for name in sorted(os.listdir(SRC)):
        if name.endswith((".go", ".mod")):
            with open(os.path.join(SRC, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    target = os.path.join(CACHE, f"slowgen-{digest.hexdigest()[:12]}")
    if os.path.exists(target):
        return target
    os.makedirs(CACHE, exist_ok=True)
    with open(target + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when closed)
        if os.path.exists(target):
            return target
        tmp = f"{target}.{os.getpid()}"
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": ""}
        niced = ["nice", "-n", str(nice)] if nice and shutil.which("nice") else []
        done = subprocess.run(
            [*niced, go, "build", "-trimpath", "-o", tmp, "."],
            cwd=SRC,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"go build of bench/slowgen failed: {done.stderr.strip()}")
        os.replace(tmp, target)
    return target


@dataclass
class Backend:
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def backend(binary: str, ttft_ms: float, tok_ms: float, tokens: int, tick_ms: float) -> Iterator[Backend]:
    """The fake backend on a free port of 127.0.0.1, on the caller's cores."""
    with _child(
        [
            binary,
            "serve",
            "--port",
            "0",
            "--ttft-ms",
            str(ttft_ms),
            "--tok-ms",
            str(tok_ms),
            "--tokens",
            str(tokens),
            "--tick-ms",
            str(tick_ms),
        ]
    ) as b:
        yield b


@contextmanager
def relay(binary: str, to_port: int, core: int) -> Iterator[Backend]:
    """The byte-level relay (`slowgen relay`) to 127.0.0.1:`to_port`, pinned to `core`."""
    with _child(["taskset", "-c", str(core), binary, "relay", "--port", "0", "--to", str(to_port)]) as b:
        yield b


@contextmanager
def _child(cmd: list[str]) -> Iterator[Backend]:
    """A slowgen server that prints its port first; stopped when the block ends."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, **_ENV})
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line.strip().isdigit():
            raise RuntimeError(f"{' '.join(cmd[:2])} did not start (exit {proc.poll()})")
        yield Backend(int(line), proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


def run(
    binary: str,
    host: str,
    port: int,
    streams: int,
    tokens: int,
    ramp: float,
    warm: float,
    seconds: float,
    timeout: float = 60.0,
    at_window: Callable[[str], None] | None = None,
) -> slowload.Outcome:
    """slowload.run's contract, from the Go client: `at_window("start" | "end")` is called as
    the client says the window opened and closed."""
    proc = subprocess.Popen(
        [
            binary,
            "load",
            "--host",
            host,
            "--port",
            str(port),
            "--streams",
            str(streams),
            "--tokens",
            str(tokens),
            "--ramp",
            str(ramp),
            "--warm",
            str(warm),
            "--seconds",
            str(seconds),
            "--timeout",
            str(timeout),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **_ENV},
    )
    result = None
    for line in proc.stdout:  # type: ignore[union-attr]
        line = line.strip()
        if line in ("start", "end"):
            if at_window:
                at_window(line)
        elif line.startswith("{"):
            result = json.loads(line)
    if proc.wait() != 0 or result is None:
        raise RuntimeError(f"slowgen load failed (exit {proc.returncode})")
    nan = float("nan")
    return slowload.Outcome(
        requests=[(sent, nan if ttft is None else ttft, err) for sent, ttft, err in result["requests"]],
        send_lags=result["send_lags"] or [],
        loop_lags=result["loop_lags"] or [],
        open_samples=result["open_samples"] or [],
        window=tuple(result["window"]),  # type: ignore[arg-type]
        cpu_s=result["cpu_s"],
        wall_s=result["wall_s"],
        lines=result["lines"],
        nbytes=result["nbytes"],
    )
