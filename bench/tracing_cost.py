"""What OpenTelemetry tracing costs: c=32 throughput through the router with `tracing` off and
on (sample ratio 1.0, every span exported to a local OTLP/HTTP sink), side by side.

    python bench/tracing_cost.py [--seconds 5] [--rounds 3] [--conc 32]

The router runs pinned to core 0 (its exporter thread included: encoding competes with the
event loop for that core, as it would in production); the zero-delay mock, the sink and wrk
share core 1. Off and on alternate for `--rounds` rounds; medians are compared. Prints req/s
and p50/p99 of each, the ratio (on / off; the goal is >= 0.7) and the spans the sink got.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common import cpu_of, free_port, mock_process, router_process, wrk

BODY = {"model": "llama3", "messages": [{"role": "user", "content": "hello there"}]}


class Sink:
    """An OTLP/HTTP endpoint that takes every POST /v1/traces and counts it (spans are counted
    by decoding at the end, so the sink costs core 1 little during the runs)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                sink.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> int:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        total = 0
        for body in self.bodies:
            msg = ExportTraceServiceRequest.FromString(body)
            total += sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per wrk run (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="off/on pairs, alternating (default 3)")
    p.add_argument("--conc", type=int, default=32, help="concurrent connections (default 32)")
    p.add_argument("--stream", action="store_true", help="streamed chat instead of whole answers")
    p.add_argument("--json", default=None, help="write the figures here too")
    args = p.parse_args()
    os.sched_setaffinity(0, {1})  # this process (the sink's thread) and wrk
    sink = Sink()
    body = json.dumps({**BODY, "stream": args.stream})
    ep = [{"url": "", "name": "mock", "max_concurrent": 4096}]
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with mock_process() as m:
        os.sched_setaffinity(m.proc.pid, {1})
        ep[0]["url"] = m.url
        configs = {"off": {}, "on": {"tracing": {"endpoint": f"http://127.0.0.1:{sink.port}", "sample_ratio": 1.0}}}
        for _ in range(args.rounds):
            for mode in ("off", "on"):
                with router_process(ep, core=0, **configs[mode]) as (url, proc):
                    wrk(url + "/api/chat", body, args.conc, 1.0)  # warm-up: connections, learned deadlines
                    cpu = cpu_of(proc.pid)
                    r = wrk(url + "/api/chat", body, args.conc, args.seconds)
                    r["cpu_us"] = (cpu_of(proc.pid) - cpu) / (r["rps"] * round(args.seconds)) * 1e6
                runs[mode].append(r)
                print(
                    f"{mode:3} c={args.conc} {r['rps']:8.0f} req/s p50 {r['p50_ms']:7.3f} ms "
                    f"p99 {r['p99_ms']:7.3f} ms"
                    f"  router CPU {r['cpu_us']:5.0f} us/request" + (f"  non2xx {r['non2xx']}" if r["non2xx"] else ""),
                    flush=True,
                )
    med = {
        mode: {k: statistics.median(r[k] for r in rs) for k in ("rps", "p50_ms", "p99_ms", "cpu_us")}
        for mode, rs in runs.items()
    }
    ratio = med["on"]["rps"] / med["off"]["rps"]
    spans = sink.spans()
    print(
        f"median off {med['off']['rps']:.0f} req/s, on {med['on']['rps']:.0f} req/s: "
        f"ratio {ratio:.2f} (goal >= 0.70); p50 {med['off']['p50_ms']:.3f} -> {med['on']['p50_ms']:.3f} ms; "
        f"the sink got {spans} spans in {len(sink.bodies)} export requests"
    )
    print(
        f"router CPU per request: off {med['off']['cpu_us']:.0f} us, on {med['on']['cpu_us']:.0f} us "
        f"(+{med['on']['cpu_us'] - med['off']['cpu_us']:.0f} us; CPU-bound throughput ratio "
        f"{med['off']['cpu_us'] / med['on']['cpu_us']:.2f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "median": med, "ratio": ratio, "spans": spans}, f, indent=2)


if __name__ == "__main__":
    main()
