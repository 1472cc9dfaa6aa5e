"""Router overhead, measured honestly: direct to a zero-delay mock vs through the router,
side by side in one run, with wrk (C) as the client so the client is not what is measured.

    python bench/overhead.py [--seconds 4] [--conc 1,8,32,64]

Prints, for non-stream and stream chat at each concurrency: req/s and p50/p99 direct and
via the router, the added p50, the throughput ratio, and the router's RSS idle and loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import threading
import time
from contextlib import contextmanager

from common import free_port, mock_process, router_process, rss_mb, wait_tcp, wrk
from mock.runner import stop_group
from rivals import floor_argv

BODY = {"model": "llama3", "messages": [{"role": "user", "content": "hello there"}]}


@contextmanager
def floor_process(upstream: str):
    port = free_port()
    proc = subprocess.Popen(
        floor_argv(port),
        env={**os.environ, "UPSTREAM": upstream},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_tcp(port)
        yield url
    finally:
        stop_group(proc)


def _pin_listener(url: str, core: int) -> None:
    """Pin the process listening on `url`'s port (the floor server) to `core`."""
    port = int(url.rsplit(":", 1)[1])
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    for pid in {int(x) for x in re.findall(r"pid=(\d+)", out)}:
        os.sched_setaffinity(pid, {core})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--conc", default="1,8,32,64")
    p.add_argument("--json", default=None)
    p.add_argument(
        "--floor",
        action="store_true",
        help="also measure bench/minimal_passthrough.py (uvicorn + aiohttp, nothing else)",
    )
    p.add_argument("--key", action="store_true", help="run the router with a client key configured (and send it)")
    p.add_argument("--pin", action="store_true", help="router and floor on core 0; mock and wrk on core 1")
    args = p.parse_args()
    concs = [int(c) for c in args.conc.split(",")]
    rows = []
    extra = {"router_api_key": "bench-key-0123456789"} if args.key else {}
    auth = {"Authorization": "Bearer bench-key-0123456789"} if args.key else None
    with (
        mock_process() as m,
        router_process([{"url": m.url, "name": "mock", "max_concurrent": 4096}], **extra) as (url, proc),
    ):
        if args.pin:
            os.sched_setaffinity(proc.pid, {0})
            os.sched_setaffinity(m.proc.pid, {1})
            os.sched_setaffinity(0, {1})  # this process, hence wrk
        time.sleep(0.5)
        idle = rss_mb(proc.pid)
        peak = [idle]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_mb(proc.pid))
                time.sleep(0.2)

        threading.Thread(target=sample, daemon=True).start()
        for stream in (False, True):
            body = json.dumps({**BODY, "stream": stream})
            for c in concs:
                d = wrk(m.url + "/api/chat", body, c, args.seconds)
                r = wrk(url + "/api/chat", body, c, args.seconds, auth)
                if args.floor:
                    with floor_process(m.url) as furl:
                        if args.pin:
                            _pin_listener(furl, 0)
                        f = wrk(furl + "/api/chat", body, c, args.seconds)
                    print(
                        f"{'':6} c={c:<3} floor (uvicorn+aiohttp only) {f['rps']:8.0f} req/s p50 {f['p50_ms']:7.3f} "
                        f"(+{f['p50_ms'] - d['p50_ms']:.3f} ms)",
                        flush=True,
                    )
                rows.append(
                    {
                        "stream": stream,
                        "conc": c,
                        "direct": d,
                        "router": r,
                        "added_p50_ms": round(r["p50_ms"] - d["p50_ms"], 3),
                        "added_p99_ms": round(r["p99_ms"] - d["p99_ms"], 3),
                        "throughput_ratio": round(r["rps"] / d["rps"], 3),
                    }
                )
                print(
                    f"{'stream' if stream else 'whole ':6} c={c:<3} direct {d['rps']:8.0f} req/s "
                    f"p50 {d['p50_ms']:7.3f} p99 {d['p99_ms']:7.3f} | router {r['rps']:8.0f} req/s "
                    f"p50 {r['p50_ms']:7.3f} p99 {r['p99_ms']:7.3f} | +p50 {rows[-1]['added_p50_ms']:+.3f} ms  "
                    f"ratio {rows[-1]['throughput_ratio']:.2f}" + (f"  non2xx {r['non2xx']}" if r["non2xx"] else ""),
                    flush=True,
                )
        stop.set()
        print(f"router RSS: idle {idle:.1f} MB, peak under load {peak[0]:.1f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "rss_idle_mb": idle, "rss_peak_mb": peak[0]}, f, indent=2)


if __name__ == "__main__":
    main()
