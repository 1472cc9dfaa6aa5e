"""Issue 16: a saturated router must never declare a healthy backend dead.

    python bench/overload.py [--streams 2000] [--seconds 60]

One router worker pinned to core 0, one healthy mock (50 ms to first token, 100 tokens at
40 ms: 25 tok/s) and the load tester's closed loop pinned to core 1: `--streams`
concurrent streams for `--seconds`. Printed: requests, errors by kind, how many 503s said
"no healthy endpoint" (must be 0) and how many were an explicit `router_overloaded`, the
endpoint's ejections as /health reports them, the router's CPU share and RSS idle and at
peak, and bytes per open stream: (peak RSS - RSS after a 2 s warm-up of 20 streams) / streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml
from common import free_port, rss_mb

from mock import MockConfig, MockProcess
from mock.runner import wait_http


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=2000, help="concurrent streams (default 2000)")
    p.add_argument("--seconds", type=float, default=60.0, help="stage length (default 60)")
    p.add_argument("--direct", action="store_true",
                   help="also run the same stage against the mock directly and report the added TTFT")
    args = p.parse_args()
    cfg = MockConfig(ttft_ms=50.0, tok_ms=40.0, tokens=100, parallel=100_000, max_queue=100_000)
    os.sched_setaffinity(0, {1})  # this process (the load generator) and the mock: core 1
    with MockProcess(cfg) as m:
        fd, path = tempfile.mkstemp(suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump({"endpoints": [{"url": m.url, "name": "m", "max_concurrent": 100_000}],
                            "max_queue": 100_000, "routing": "least_busy"}, f)
        port = free_port()
        router = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "nomyo_router", "--config", path,
                                   "--port", str(port), "--log-level", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/health", 30, router)
            time.sleep(1)
            cold = rss_mb(router.pid)
            from loadtest.engine import Stage, run_stage
            from loadtest.metrics import summarize
            from loadtest.workload import WorkloadSpec
            # One-time costs (lazy imports, first allocations of each path) are not per stream:
            # "idle" is measured after 20 streams ran for 2 s.
            asyncio.run(run_stage(url, WorkloadSpec(stream=True, max_tokens=20),
                                  Stage("warm", 20, duration=2.0, warmup=0.0), 30))
            time.sleep(1)
            idle = rss_mb(router.pid)
            cpu0 = _cpu(router.pid)
            peak = [idle]

            async def sample() -> None:
                while True:
                    await asyncio.sleep(1)
                    peak[0] = max(peak[0], rss_mb(router.pid))

            async def run() -> list:
                sampler = asyncio.create_task(sample())
                try:
                    stage = Stage("closed", args.streams, duration=args.seconds, warmup=0.0)
                    return await run_stage(url, WorkloadSpec(stream=True, max_tokens=100), stage, 120)
                finally:
                    sampler.cancel()
            t0 = time.monotonic()
            results = asyncio.run(run())
            wall = time.monotonic() - t0
            cpu = (_cpu(router.pid) - cpu0) / wall
            summary = summarize(results)
            direct = None
            if args.direct:  # the same stage, same cores, without the router: what it adds to TTFT
                direct = summarize(asyncio.run(run_stage(
                    m.url, WorkloadSpec(stream=True, max_tokens=100),
                    Stage("closed", args.streams, duration=args.seconds, warmup=0.0), 120)))
            with urllib.request.urlopen(url + "/health") as r:
                health = json.load(r)
            with urllib.request.urlopen(url + "/metrics") as r:  # what the router says it refused, and why
                metrics = r.read().decode()
            overloaded = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                             if line.startswith("nomyo_router_events_total{") and 'what="overloaded"' in line)
            statuses: dict[str, float] = {}
            for line in metrics.splitlines():
                if line.startswith("nomyo_router_requests_total{"):
                    status = line.split('status="', 1)[1].split('"', 1)[0]
                    statuses[status] = statuses.get(status, 0) + float(line.rsplit(" ", 1)[1])
        finally:
            router.terminate()
            _, err = router.communicate(timeout=20)
            os.unlink(path)
    false_dead = err.count("no healthy endpoint") + err.count(": ejected")
    print(json.dumps({
        "streams": args.streams, "seconds": args.seconds, "requests": summary["requests"],
        "completed": summary["completed"], "errors": summary["errors"],
        "ejections_in_health": health["endpoints"][0].get("health", {}).get("ejections"),
        "ejections_or_no_healthy_in_log": false_dead,
        "router_statuses": statuses, "router_overloaded_503": overloaded,
        "router_cpu_share": round(cpu, 2), "rss_cold_mb": round(cold, 1), "rss_idle_mb": round(idle, 1), "rss_peak_mb": round(peak[0], 1),
        "bytes_per_stream": round((peak[0] - idle) * 1024 * 1024 / args.streams),
        "request_throughput": summary["request_throughput"],
        "ttft_ms": {"p50": summary["median_ttft_ms"], "p99": summary["p99_ttft_ms"]},
        **({"direct": {"errors": direct["errors"], "request_throughput": direct["request_throughput"],
                       "ttft_ms": {"p50": direct["median_ttft_ms"], "p99": direct["p99_ttft_ms"]}},
            "added_ttft_p99_ms": round(summary["p99_ttft_ms"] - direct["p99_ttft_ms"], 1)} if direct else {})},
        indent=1))


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
