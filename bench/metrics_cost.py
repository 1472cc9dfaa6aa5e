"""CPU per request of the metrics hook (ops/metrics.py), single process and multiprocess mode,
and of the usage hook (ops/usage/store.py: what a request pays; the flush runs on a thread).

    python bench/metrics_cost.py [--n 200000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def measure(n: int, per_iteration: int) -> float:
    """µs per request when `per_iteration` requests finish in one event-loop iteration
    (1: a quiet router; 32: a busy one)."""
    import asyncio

    from nomyo_router.events import Events, RequestRecord
    from nomyo_router.ops.metrics import Metrics

    async def run() -> float:
        events = Events()
        Metrics(events, lambda: [])
        rec = RequestRecord(
            "1", "ollama", "/api/chat", "llama3", True, None, "gpu-a", 200, 0.001, 0.0002, 0.05, 0.4, 12, 200, "hit"
        )
        events.request_done(rec)
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        for _ in range(n // per_iteration):
            for _ in range(per_iteration):
                events.request_done(rec)
            await asyncio.sleep(0)  # one loop iteration: the flush runs
        return (time.perf_counter() - t0) / n * 1e6

    return asyncio.run(run())


def usage_cost(n: int) -> float:
    """µs per request added to the usage batch (the SQLite/Redis write is off the loop)."""
    from nomyo_router.events import Events, RequestRecord
    from nomyo_router.ops.usage.store import Usage

    usage = Usage(Events())
    rec = RequestRecord(
        "1", "ollama", "/api/chat", "llama3", True, "alice", "gpu-a", 200, prompt_tokens=12, completion_tokens=200
    )
    t0 = time.perf_counter()
    for _ in range(n):
        usage.add(rec)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000, help="requests to record (default 200000)")
    p.add_argument("--child", choices=["single", "multi"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(f"{measure(args.n, 1):.2f} µs alone, {measure(args.n, 32):.2f} µs with 32 per loop iteration")
        return
    for mode in ("single", "multi"):
        env = dict(os.environ)
        tmp = tempfile.mkdtemp()
        if mode == "multi":
            env["PROMETHEUS_MULTIPROC_DIR"] = tmp
        out = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--n", str(args.n)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"{mode:6} process mode: {out} (per request: requests counter, 4 histograms, affinity, tokens)")
    print(f"usage: {usage_cost(args.n):.2f} µs per request (a dict update; written once a second off the loop)")


if __name__ == "__main__":
    main()
