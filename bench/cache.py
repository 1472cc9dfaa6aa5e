"""The response cache: what a hit costs against a miss, and what the cache costs the requests
that do not use it.

    python bench/cache.py [--seconds 4] [--conc 1,32] [--backends memory,sqlite,redis]

Two parts:

1. In-process, the gate every generation request passes (app.py): with the cache off, one
   lookup of `"nomyo"` in the parsed body; with it on, that and one scan of the headers
   (`cache.hook.handler`). µs per request, median of timeit runs in the process's CPU time;
   a substring search of the raw body is shown for scale (it grows with the body).
2. End to end, with wrk against a router process (1 worker) and a zero-delay mock (8 tokens):
   req/s and p50/p99 of the same chat, non-stream and stream, (a) not opted in (the baseline),
   (b) opted in and answered from the cache (every request but the first is a hit), (c) opted
   in with a new prompt each time (every request a miss: the backend's answer captured and
   stored). With a zero-delay backend a miss is the router's cheapest possible miss; against
   a real model it also waits for the generation, which a hit never does.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Iterator
from contextlib import contextmanager

from common import free_port, mock_process, router_process, wait_tcp, wrk_script

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MSGS = [{"role": "user", "content": "Why is the sky blue? Explain it briefly to a child, please."}]


def gate_cost(runs: int = 7) -> dict[str, float]:
    """µs per request of the cache's gate, for a request that did not opt in."""
    from nomyo_router.api.requests import parse
    from nomyo_router.cache import hook
    from nomyo_router.cache.service import ResponseCache
    from nomyo_router.cache.stores import MemoryAnswerStore
    from nomyo_router.config import CacheConfig
    from nomyo_router.events import Events

    small = json.dumps({"model": "llama3", "stream": True, "messages": MSGS}).encode()
    long = json.dumps(
        {
            "model": "llama3",
            "stream": True,
            "messages": [
                {"role": "user" if i % 2 == 0 else "assistant", "content": "lorem ipsum dolor sit amet " * 40}
                for i in range(20)
            ],
        }
    ).encode()
    scope = {
        "headers": [
            (b"host", b"127.0.0.1:12434"),
            (b"user-agent", b"openai-python/1.40"),
            (b"content-type", b"application/json"),
            (b"accept", b"application/json"),
            (b"authorization", b"Bearer sk-xxxxxxxx"),
            (b"content-length", b"120"),
            (b"x-stainless-lang", b"python"),
            (b"accept-encoding", b"gzip"),
        ]
    }
    cache = ResponseCache(CacheConfig(enabled=True), MemoryAnswerStore(CacheConfig()), Events())

    def handle(req, send, rec):  # (never called)
        raise AssertionError

    out = {}
    for label, raw in (("1-message chat", small), ("20-message chat (22 KB)", long)):
        req = parse("/api/chat", raw, 0.0)
        off: ResponseCache | None = None
        cases = {
            "off": lambda off=off, req=req: off is not None or "nomyo" in req.body,
            "on": lambda req=req: (
                hook.handler(cache, scope, req, handle) if (cache is not None or "nomyo" in req.body) else 0
            ),
            "off, searching the raw body instead": lambda raw=raw: b'"nomyo"' in raw,
        }
        for mode, fn in cases.items():
            n = 200_000
            times = [t / n * 1e6 for t in timeit.repeat(fn, number=n, repeat=runs, timer=time.process_time)]
            out[f"{label}, cache {mode}"] = statistics.median(times)
    return out


def wrk_run(url: str, body: dict, conc: int, seconds: float, unique: bool) -> dict[str, float]:
    """req/s, p50/p99 (ms) of a wrk POST run; `unique`: a new prompt per request (all misses)."""
    text = json.dumps(body)
    lua = ["wrk.method = 'POST'", "wrk.headers['Content-Type'] = 'application/json'"]
    if unique:  # the prompt's text gets a counter: every request is another question
        head, tail = text.split("Why is the sky blue?", 1)
        lua += [
            "local n = 0",
            f"local id = '{secrets.token_hex(8)}'",  # (new each run: no run hits another's)
            "request = function()",
            "  n = n + 1",
            f"  return wrk.format(nil, nil, nil, [[{head}]] .. id .. '-' .. n .. [[ Why is the sky blue?{tail}]])",
            "end",
        ]
    else:
        lua.append(f"wrk.body = [[{text}]]")
    return wrk_script(url, "\n".join(lua) + "\n", conc, seconds)


@contextmanager
def redis_server() -> Iterator[str]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found: apt-get install redis-server (or leave redis out of --backends)")
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_tcp(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def end_to_end(backend: str, seconds: float, concs: list[int], tmp: str) -> list[dict]:
    rows = []
    with contextlib_redis(backend) as url, mock_process() as m:
        cache = {"enabled": True, "backend": backend, "max_entries": 1_000_000, "path": os.path.join(tmp, "c.db")}
        if url:
            cache["url"] = url
        with router_process(
            [{"url": m.url, "name": "m", "max_concurrent": 1000}], core=0, cache=cache, usage_db=None
        ) as (router, _):
            for stream in (False, True):
                body = {"model": "llama3", "messages": MSGS, "stream": stream}
                for conc in concs:
                    for case, b, unique in (
                        ("baseline (not opted in)", body, False),
                        ("hit", {**body, "nomyo": {"cache": True}}, False),
                        ("miss (stored)", {**body, "nomyo": {"cache": True}}, True),
                    ):
                        r = wrk_run(router + "/api/chat", b, conc, seconds, unique)
                        rows.append({"backend": backend, "stream": stream, "conc": conc, "case": case, **r})
                        print(
                            f"{backend:7} stream={stream!s:5} c={conc:<3} {case:24} {r['rps']:9.0f} req/s  "
                            f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  non-2xx {r['non2xx']}",
                            flush=True,
                        )
    return rows


@contextmanager
def contextlib_redis(backend: str) -> Iterator[str | None]:
    if backend != "redis":
        yield None
        return
    with redis_server() as url:
        yield url


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--conc", default="1,32")
    p.add_argument("--backends", default="memory,sqlite,redis")
    p.add_argument("--json", default=None, help="also write the figures here")
    a = p.parse_args()
    print("gate cost for a request that did not opt in (µs per request):")
    gate = gate_cost()
    for label, us in gate.items():
        print(f"  {label:40} {us:.3f}")
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in a.backends.split(","):
            rows += end_to_end(backend, a.seconds, [int(c) for c in a.conc.split(",")], tmp)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gate_us": gate, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
