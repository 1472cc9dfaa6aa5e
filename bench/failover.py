"""Kill one of two backends with SIGKILL mid-load and count what the clients saw.

    python bench/failover.py [--seconds 12] [--kill-at 4] [--concurrency 32] [--stream]

Two mock processes (20 ms TTFT, 16 tokens x 1 ms), one router worker in front, the load
tester's engine driving a closed loop straight through the kill. Non-stream requests in
flight on the killed backend are retried on the other one (nothing had reached the
client yet); a stream that already sent tokens cannot be retried and ends with an error
chunk, so --stream shows that cost honestly.
"""

from __future__ import annotations

import argparse
import asyncio
import threading

from common import router_process
from loadtest.engine import Stage, run_stage
from loadtest.metrics import summarize
from loadtest.workload import WorkloadSpec
from mock import MockConfig, MockProcess

CFG = MockConfig(ttft_ms=20.0, tok_ms=1.0, tokens=16, parallel=256)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--kill-at", type=float, default=4.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--stream", action="store_true")
    args = p.parse_args()
    with MockProcess(CFG) as a, MockProcess(CFG) as b:
        eps = [{"url": a.url, "name": "a", "max_concurrent": 256}, {"url": b.url, "name": "b", "max_concurrent": 256}]
        with router_process(eps, health_interval=1) as (url, _):
            threading.Timer(args.kill_at, b.kill).start()
            stage = Stage("closed", args.concurrency, duration=args.seconds, warmup=0.0)
            m = summarize(asyncio.run(run_stage(url, WorkloadSpec(stream=args.stream), stage, 30)))
    print(
        f"{'stream' if args.stream else 'non-stream'}: {m['requests']} requests, {m['completed']} ok, "
        f"{m['failed']} failed {m['errors'] or ''}; split {m['endpoints']}; "
        f"{m['request_throughput']:.0f} req/s; p99 {m['p99_e2el_ms']} ms"
    )


if __name__ == "__main__":
    main()
