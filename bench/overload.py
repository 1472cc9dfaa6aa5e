"""One router worker under 2,000 slow streams: errors, ejections, memory, TTFT.

    python bench/overload.py [--streams 2000] [--seconds 60] [--direct] [--floor] [--tick-ms 5] [--load go|python]

One router worker pinned to core 0; one healthy backend (50 ms to first token, 100 tokens at
40 ms: 25 tok/s, written by a shared 5 ms tick) and the load generator pinned to core 1.
`--load go` (the default when Go is installed; bench/goload.py): both are bench/slowgen,
compiled, one thread each — at 2,000 streams the Python pair saturates core 1 by itself.
`--load python`: the mock (`stream_tick_ms`) and bench/slowload.py (a lean client on uvloop).
`--streams` users open their first stream evenly over one stream's length (4.05 s), then loop closed; only streams
started in the `--seconds` window count, and the window opens one stream's length after
the ramp, so every counted stream was opened in the steady state. `--direct` runs the same
stage against the mock without the router first: the added TTFT is router minus direct at
the same percentile. `--floor` also runs it through `slowgen relay` on core 0, a byte-level
relay (a read and a write per chunk, no HTTP, compiled): on loopback the sending core also
runs the receiver's TCP input and wakes it, and the floor shows what that alone costs the
router's core. A stream is an error unless it is a 200 with every token and the final
`"done": true` line.

Printed: requests, errors by kind, how many 503s said "no healthy endpoint" (must be 0) and
how many were an explicit `router_overloaded`, the endpoint's ejections as /health reports
them, RSS idle and at peak and bytes per open stream ((peak - RSS after a 2 s warm-up of 20
streams) / streams), TTFT percentiles, and, to show who was the limit, over the window: the
CPU of the router, of the backend ("mock": slowgen serve or the mock) and of the client
(utime+stime / wall, in cores), how busy each core was (/proc/stat), the client's send lag
(request written - when it was due) and event-loop lag (how late a 10 ms sleep woke).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
import urllib.request

import goload
import slowload
from common import cpu_of, free_port, rss_mb
from loadtest.router_process import router_argv, write_config
from mock import MockConfig, MockProcess
from mock.runner import wait_http

TTFT_MS, TOK_MS, TOKENS = 50.0, 40.0, 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=2000, help="concurrent streams (default 2000)")
    p.add_argument("--seconds", type=float, default=60.0, help="measured window (default 60)")
    p.add_argument(
        "--direct",
        action="store_true",
        help="first run the same stage against the mock directly and report the added TTFT",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also run the stage through a byte-level relay on core 0 (slowgen relay: a read "
        "and a write per chunk, no HTTP): what the kernel alone costs the router's core",
    )
    p.add_argument(
        "--tick-ms",
        type=float,
        default=5.0,
        help="the mock's stream_tick_ms (default 5; 0: one sleep per token per stream)",
    )
    p.add_argument(
        "--ramp",
        type=float,
        default=(TTFT_MS + TOKENS * TOK_MS) / 1000,
        help="seconds over which the streams are first opened (default: one stream's length)",
    )
    p.add_argument(
        "--load",
        choices=("go", "python"),
        default="go" if goload.go_tool() else "python",
        help="the backend and client: bench/slowgen (compiled; default when Go is installed) "
        "or the Python mock and bench/slowload.py",
    )
    args = p.parse_args()
    if args.floor and args.load != "go":
        p.error("--floor needs the compiled load side (Go)")
    if args.load == "go" and args.tick_ms <= 0:
        p.error("--load go writes streams on a shared tick: --tick-ms must be > 0")
    length = (TTFT_MS + TOKENS * TOK_MS) / 1000
    cfg = MockConfig(
        ttft_ms=TTFT_MS, tok_ms=TOK_MS, tokens=TOKENS, parallel=100_000, max_queue=100_000, stream_tick_ms=args.tick_ms
    )
    os.sched_setaffinity(0, {1})  # this process (the load generator) and the mock: core 1
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    def stage(port: int, router: int | None, mock: int) -> dict:
        """One stage of `args.streams` users on `port`; its figures over the window."""
        snaps: dict[str, tuple] = {}

        def at(edge: str) -> None:
            snaps[edge] = (time.perf_counter(), cpu_of(mock), cpu_of(router) if router else 0.0, _cores())

        if binary:
            out = goload.run(
                binary, "127.0.0.1", port, args.streams, TOKENS, args.ramp, length, args.seconds, at_window=at
            )
        else:
            out = asyncio.run(
                slowload.run("127.0.0.1", port, args.streams, TOKENS, args.ramp, length, args.seconds, at_window=at)
            )
        (n0, m0, r0, c0), (n1, m1, r1, c1) = snaps["start"], snaps["end"]
        wall = n1 - n0
        ttft = [t for _, t, err in out.requests if err is None]
        errors: dict[str, int] = {}
        for _, _, err in out.requests:
            if err is not None:
                errors[err] = errors.get(err, 0) + 1
        ms = lambda v: round(v * 1000, 1)  # noqa: E731
        return {
            "requests": len(out.requests),
            "errors": sum(errors.values()),
            "errors_by_kind": errors,
            "open_streams": {
                "min": min(out.open_samples, default=0),
                "mean": round(sum(out.open_samples) / max(len(out.open_samples), 1)),
            },
            "chunks_per_s": round(out.lines / wall),
            "ttft_ms": {q: ms(slowload.pct(ttft, float(q[1:]))) for q in ("p50", "p90", "p99", "p99.9")}
            | {"max": ms(max(ttft, default=float("nan")))},
            "cpu_cores": {
                "router": round((r1 - r0) / wall, 2),
                "mock": round((m1 - m0) / wall, 2),
                "client": round(out.cpu_s / out.wall_s, 2),
                **{f"core{k}_busy": round(1 - (c1[k][1] - c0[k][1]) / max(c1[k][0] - c0[k][0], 1), 2) for k in c0},
                **{f"core{k}_softirq": round((c1[k][2] - c0[k][2]) / max(c1[k][0] - c0[k][0], 1), 2) for k in c0},
            },
            "client_send_lag_ms": {
                "p50": ms(slowload.pct(out.send_lags, 50)),
                "p99": ms(slowload.pct(out.send_lags, 99)),
                "max": ms(max(out.send_lags)),
            },
            "client_loop_lag_ms": {"p99": ms(slowload.pct(out.loop_lags, 99)), "max": ms(max(out.loop_lags))},
        }

    binary = goload.build() if args.load == "go" else None
    with goload.backend(binary, TTFT_MS, TOK_MS, TOKENS, args.tick_ms) if binary else MockProcess(cfg) as m:
        mock_pid = m.pid if binary else m.proc.pid  # type: ignore[union-attr]
        direct = stage(m.port, None, mock_pid) if args.direct else None
        floor = None
        if args.floor:
            with goload.relay(binary, m.port, 0) as r:  # type: ignore[arg-type]
                floor = stage(r.port, r.pid, mock_pid)
        path = write_config(
            {
                "endpoints": [{"url": m.url, "name": "m", "max_concurrent": 100_000}],
                "max_queue": 100_000,
                "routing": "least_busy",
            }
        )
        port = free_port()
        router = subprocess.Popen(
            router_argv(path, port, core=0),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/health", 30, router)
            time.sleep(1)
            cold = rss_mb(router.pid)
            # One-time costs (lazy imports, first allocations of each path) are not per stream:
            # "idle" is measured after 20 streams ran for 2 s.
            asyncio.run(slowload.run("127.0.0.1", port, 20, 20, 0.1, 0.0, 2.0))
            time.sleep(1)
            idle = rss_mb(router.pid)
            peak = [idle]
            stop = [False]

            def sample() -> None:  # RSS once a second, beside the stage (a thread: reads /proc only)
                while not stop[0]:
                    time.sleep(1)
                    peak[0] = max(peak[0], rss_mb(router.pid))

            import threading

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                summary = stage(port, router.pid, mock_pid)
            finally:
                stop[0] = True
                sampler.join()
            with urllib.request.urlopen(url + "/health") as r:
                health = json.load(r)
            with urllib.request.urlopen(url + "/metrics") as r:  # what the router says it refused, and why
                metrics = r.read().decode()
            overloaded = sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("nomyo_router_events_total{") and 'what="overloaded"' in line
            )
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
    added = {}
    if direct:
        added = {"added_ttft_ms": {q: round(summary["ttft_ms"][q] - direct["ttft_ms"][q], 1) for q in ("p50", "p99")}}
    if direct and floor:
        added["floor_added_ttft_ms"] = {q: round(floor["ttft_ms"][q] - direct["ttft_ms"][q], 1) for q in ("p50", "p99")}
    print(
        json.dumps(
            {
                "streams": args.streams,
                "seconds": args.seconds,
                "ramp_s": args.ramp,
                "tick_ms": args.tick_ms,
                "load": args.load,
                "router": summary,
                **({"direct": direct} if direct else {}),
                **({"floor": floor} if floor else {}),
                **added,
                "ejections_in_health": health["endpoints"][0].get("health", {}).get("ejections"),
                "ejections_or_no_healthy_in_log": false_dead,
                "router_statuses": statuses,
                "router_overloaded_503": overloaded,
                "rss_cold_mb": round(cold, 1),
                "rss_idle_mb": round(idle, 1),
                "rss_peak_mb": round(peak[0], 1),
                "bytes_per_stream": round((peak[0] - idle) * 1024 * 1024 / args.streams),
            },
            indent=1,
        )
    )


def _cores() -> dict[int, tuple[int, int, int]]:
    """(total, idle + iowait, softirq) jiffies of cores 0 and 1."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            for k in (0, 1):
                if line.startswith(f"cpu{k} "):
                    v = [int(x) for x in line.split()[1:]]
                    out[k] = (sum(v[:8]), v[3] + v[4], v[6])
    return out


if __name__ == "__main__":
    main()
