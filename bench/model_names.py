"""What huge client-chosen model names cost the router's memory, with tracing on.

    python bench/model_names.py [--requests 50] [--mb 2] [--rounds 2]

One router process (tracing on, every request sampled, to a local OTLP sink that discards
what it gets; access lines on, to /dev/null), one mock backend. Each round sends `--requests`
chat requests one after another, each naming a model of its own of `--mb` MB that nobody
serves. Printed: the statuses and the router's RSS after start and after each round. A router
that keeps such names (spans, their templates, access lines, usage) grows by about the names'
size each round; one that refuses them at the door (400) does not grow.

To measure another tree's router, put it first on PYTHONPATH (the router is started with
`python -P -m nomyo_router`): `PYTHONPATH=/tmp/other-tree python bench/model_names.py`.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import ZERO, free_port, mock_process, rss_mb  # noqa: E402
from loadtest.router_process import router_process  # noqa: E402


def sink() -> int:
    """An OTLP/HTTP collector that reads and discards every export; its port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return port


def send(url: str, model: str) -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False})
    conn.request("POST", "/api/chat", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=50, help="requests per round (default 50)")
    p.add_argument("--mb", type=float, default=2.0, help="megabytes per model name (default 2)")
    p.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    args = p.parse_args()
    size = int(args.mb * (1 << 20))
    collector = sink()
    with mock_process(ZERO) as m:
        config = {
            "endpoints": [{"url": m.url, "name": "m", "max_concurrent": 8}],
            "tracing": {"endpoint": f"http://127.0.0.1:{collector}", "sample_ratio": 1.0},
            "access_log": True,
            "usage_db": None,
            "max_body_bytes": size + (1 << 20),
        }
        with router_process(config, stderr=subprocess.DEVNULL) as (url, proc):
            time.sleep(1.0)
            start = rss_mb(proc.pid)
            print(f"{args.requests} requests a round, each naming a model of {args.mb:g} MB nobody serves")
            print(f"  started:  RSS {start:6.1f} MB")
            n = 0
            for rnd in range(1, args.rounds + 1):
                statuses: collections.Counter[int] = collections.Counter()
                for _ in range(args.requests):
                    n += 1
                    statuses[send(url, f"{n:08d}" + "m" * (size - 8))] += 1
                time.sleep(2.5)  # the exporter's batches go out every second
                rss = rss_mb(proc.pid)
                print(f"  round {rnd}:  RSS {rss:6.1f} MB (+{rss - start:.1f}), statuses {dict(statuses)}")


if __name__ == "__main__":
    main()
