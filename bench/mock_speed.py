"""How fast the mock is in zero-delay mode, and the load tester's own ceiling beside wrk.

    python bench/mock_speed.py [--seconds 4]

wrk measures the mock at c=1, 32 and 64 (non-stream and stream). Then the load tester
(through the router's own HTTP/1.1 client) drives the same mock at c=64, to show how much
load one Python client process can generate compared with wrk.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from common import mock_process, wrk
from loadtest.engine import Stage, run_stage
from loadtest.metrics import summarize
from loadtest.workload import WorkloadSpec

BODY = {"model": "llama3", "messages": [{"role": "user", "content": "hello there"}]}


async def client_ceiling(url: str, stream: bool, conc: int, seconds: float) -> dict:
    run = await run_stage(url, WorkloadSpec(stream=stream), Stage("closed", conc, seconds, warmup=0.5), 30)
    return summarize(run)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    with mock_process() as m:
        for stream in (False, True):
            body = json.dumps({**BODY, "stream": stream})
            for c in (1, 32, 64):
                r = wrk(m.url + "/api/chat", body, c, args.seconds)
                print(
                    f"mock {'stream' if stream else 'whole '} c={c:<3} wrk: {r['rps']:8.0f} req/s  "
                    f"p50 {r['p50_ms']:.3f} ms"
                )
        for stream in (False, True):
            w = wrk(m.url + "/api/chat", json.dumps({**BODY, "stream": stream}), 64, args.seconds)
            c = asyncio.run(client_ceiling(m.url, stream, 64, args.seconds))
            print(
                f"client ceiling {'stream' if stream else 'whole '} c=64: "
                f"loadtest {c['request_throughput']:8.0f} req/s "
                f"(cpu {c['client']['cpu_share']:.0%}) vs wrk {w['rps']:8.0f} req/s"
            )


if __name__ == "__main__":
    main()
