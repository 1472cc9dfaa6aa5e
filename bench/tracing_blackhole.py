"""Memory held for a collector that never answers: the router's RSS over a run of steady
load with `tracing` exporting to a black hole (a port that accepts and never reads).

    python bench/tracing_blackhole.py [--seconds 120] [--conc 16] [--budget-mb 16]

Every `--every` seconds it prints the router's RSS, the requests served so far and the traces
dropped (`nomyo_router_events_total{what="traces_dropped"}`): with the byte budget the RSS
levels off once `max_pending_bytes` of finished requests wait; the drops grow with the load.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import urllib.request

from common import mock_process, router_process, rss_mb, wrk_output


def black_hole() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1024)  # (accepted by the kernel's backlog; never read)
    return s, s.getsockname()[1]


def dropped(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("nomyo_router_events_total") and 'what="traces_dropped"' in line:
                return float(line.split()[-1])
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--every", type=float, default=15.0)
    p.add_argument("--conc", type=int, default=16)
    p.add_argument("--budget-mb", type=float, default=16.0)
    args = p.parse_args()
    hole, port = black_hole()
    with mock_process() as m:
        tracing: dict[str, object] = {"endpoint": f"http://127.0.0.1:{port}"}
        if args.budget_mb:  # (0: the key left out, for a build that has none)
            tracing["max_pending_bytes"] = int(args.budget_mb * 1024 * 1024)
        with router_process([{"name": "m", "url": m.url}], tracing=tracing) as (url, proc):
            lua = (
                'wrk.method="POST"; wrk.headers["Content-Type"]="application/json"; '
                'wrk.body=\'{"model":"llama3","messages":[{"role":"user","content":"hi"}],"stream":false}\''
            )
            done = threading.Event()
            out: list[str] = []

            def load() -> None:
                out.append(wrk_output(url + "/api/chat", lua, args.conc, args.seconds))
                done.set()

            threading.Thread(target=load, daemon=True).start()
            t0 = time.monotonic()
            print(f"budget {args.budget_mb:g} MB; start RSS {rss_mb(proc.pid):.1f} MB")
            while not done.wait(args.every):
                t = time.monotonic() - t0
                print(f"{t:6.0f} s  RSS {rss_mb(proc.pid):6.1f} MB  traces dropped {dropped(url):9.0f}", flush=True)
            reqs = next((line for line in out[0].splitlines() if "requests in" in line), "").strip()
            print(f"end      RSS {rss_mb(proc.pid):6.1f} MB  traces dropped {dropped(url):9.0f}  ({reqs})")
    hole.close()


if __name__ == "__main__":
    main()
