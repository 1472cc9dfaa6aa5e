"""The router's CPU per relayed chunk of slow streams, user and kernel apart.

    python bench/relay_cost.py [--streams 2000] [--seconds 20]

The stage of bench/overload.py without its memory, /health and /metrics figures: one router
worker pinned to core 0; the mock (50 ms to the first token, 100 tokens at 25 tok/s, a
shared 5 ms tick) and the load generator (bench/slowload.py) on core 1. Over the window it
prints chunks/s, the router's utime and stime per relayed chunk (µs), its cores busy, and
the TTFT percentiles through the router. Alternate runs of two checkouts to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import slowload
from common import router_process
from mock import MockConfig, MockProcess

TTFT_MS, TOK_MS, TOKENS = 50.0, 40.0, 100


def _times(pid: int) -> tuple[float, float]:
    """(utime, stime) of `pid` in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    length = (TTFT_MS + TOKENS * TOK_MS) / 1000
    cfg = MockConfig(
        ttft_ms=TTFT_MS, tok_ms=TOK_MS, tokens=TOKENS, parallel=100_000, max_queue=100_000, stream_tick_ms=5.0
    )
    os.sched_setaffinity(0, {1})
    import uvloop

    uvloop.install()
    with MockProcess(cfg) as m:
        endpoints = [{"url": m.url, "name": "m", "max_concurrent": 100_000}]
        snaps: dict[str, tuple] = {}
        with router_process(endpoints, core=0, routing="least_busy") as (url, router):
            port = int(url.rsplit(":", 1)[1])
            asyncio.run(slowload.run("127.0.0.1", port, 20, 20, 0.1, 0.0, 1.0))  # warm-up
            out = asyncio.run(
                slowload.run(
                    "127.0.0.1",
                    port,
                    args.streams,
                    TOKENS,
                    length,
                    length,
                    args.seconds,
                    at_window=lambda edge: snaps.__setitem__(edge, (time.perf_counter(), _times(router.pid))),
                )
            )
    (t0, (u0, s0)), (t1, (u1, s1)) = snaps["start"], snaps["end"]
    wall = t1 - t0
    ttft = sorted(t for _, t, err in out.requests if err is None)
    errors = sum(1 for _, _, err in out.requests if err is not None)
    print(
        json.dumps(
            {
                "streams": args.streams,
                "requests": len(out.requests),
                "errors": errors,
                "chunks_per_s": round(out.lines / wall),
                "router_us_per_chunk": {
                    "user": round((u1 - u0) / out.lines * 1e6, 2),
                    "kernel": round((s1 - s0) / out.lines * 1e6, 2),
                    "total": round((u1 - u0 + s1 - s0) / out.lines * 1e6, 2),
                },
                "router_cores": round((u1 - u0 + s1 - s0) / wall, 2),
                "ttft_ms": {q: round(slowload.pct(ttft, q) * 1000, 1) for q in (50, 99)},
            }
        )
    )


if __name__ == "__main__":
    main()
