"""What large bodies held by queued requests cost the router's memory.

    python bench/queued_bodies.py [--requests 40] [--body-mb 15] [--budget-mb N]

One router process, one mock backend with 4 slots and 20 s to first token (so nothing
finishes while the bodies arrive). `--requests` connections each send one chat request
whose body is `--body-mb` MB, all at once, from one key without a cap: 4 take the slots, the
rest wait in the queue holding their bodies, until `max_queued_body_bytes` (the router's
default, or `--budget-mb`) refuses the next ones with 503 `queue_full`. Printed: the
router's peak RSS over the flood (sampled every 0.1 s) above its RSS before, and the
statuses ("waiting": still queued when the flood ended). Run it against a router without the
budget to see the bound it replaces: `max_queue` x `max_body_bytes`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import router_process, rss_mb  # noqa: E402
from mock import MockConfig, MockProcess  # noqa: E402


async def one(port: int, body: bytes, statuses: collections.Counter[str], hold: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body)
    try:
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 15.0)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        answer = await asyncio.wait_for(reader.readexactly(length), 1.0)
        code = next((c for c in (b"max_queued_body_bytes", b"overloaded") if c in answer), b"")
        statuses[(line.split()[1] + b" " + code).decode().strip() if line else "closed"] += 1
    except (TimeoutError, OSError, ValueError, IndexError):
        statuses["waiting"] += 1  # still waiting in the queue
    await hold.wait()
    writer.close()


async def flood(url: str, pid: int, n: int, body: bytes) -> tuple[float, collections.Counter[str]]:
    port = int(url.rsplit(":", 1)[1])
    statuses: collections.Counter[str] = collections.Counter()
    hold = asyncio.Event()
    before = peak = rss_mb(pid)
    tasks = [asyncio.create_task(one(port, body, statuses, hold)) for _ in range(n)]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 16.0 and sum(statuses.values()) < n:
        peak = max(peak, rss_mb(pid))
        await asyncio.sleep(0.1)
    peak = max(peak, rss_mb(pid))
    hold.set()
    await asyncio.gather(*tasks)
    return peak - before, statuses


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--body-mb", type=float, default=15.0)
    p.add_argument("--budget-mb", type=float, default=None, help="max_queued_body_bytes (default: the router's)")
    args = p.parse_args()
    content = "x" * int(args.body_mb * 1_000_000)
    body = json.dumps({"model": "llama3", "stream": False, "messages": [{"role": "user", "content": content}]})
    # (the overload guard off: parsing 15 MB bodies lags the loop, and its 503s would hide the budget's)
    extra: dict[str, object] = {"overload_lag_ms": 0}
    if args.budget_mb is not None:
        extra["max_queued_body_bytes"] = int(args.budget_mb * 2**20)
    with MockProcess(MockConfig(ttft_ms=20_000, tok_ms=0, tokens=1, parallel=64)) as m:
        eps = [{"url": m.url, "name": "m", "max_concurrent": 4}]
        with router_process(eps, usage_db=None, max_queue=1024, max_body_bytes=64 * 2**20, **extra) as (url, proc):
            time.sleep(1.0)
            grew, statuses = await flood(url, proc.pid, args.requests, body.encode())
    print(f"{args.requests} requests of {len(body) / 1e6:.1f} MB at once, 4 slots busy for 20 s")
    print(f"  router RSS: +{grew:.0f} MB at peak; statuses {dict(statuses)}")


if __name__ == "__main__":
    asyncio.run(main())
