"""What a flood from one capped client key costs the router's memory.

    python bench/capped_key.py [--requests 5000] [--max-queue 1024]

One router process, one mock backend (2 s to first token, so nothing finishes during the
flood). Two floods of `--requests` concurrent connections, each sending one chat request:
first with a wrong key (every request refused 401 at once: the cost of that many connections
and nothing more), then with a valid key capped at `max_concurrent: 1`. The capped key's
requests beyond its permit wait aside, counting toward `max_queue`; beyond the queue each is
refused at once (503 + Retry-After) before its body is read. Printed: the router's RSS growth
for each flood and the statuses; the capped flood should cost about the refused flood plus
what `--max-queue` waiting requests hold.
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

KEY = "flood-key-0123456789"
BODY = json.dumps(
    {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hello " * 50}]}
).encode()


async def one(port: int, key: str, statuses: collections.Counter[int], hold: asyncio.Event) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        statuses[-1] += 1
        return
    head = (
        f"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode()
    writer.write(head + BODY)
    try:
        line = await asyncio.wait_for(reader.readline(), 0.5)
        statuses[int(line.split()[1]) if line else 0] += 1
    except (TimeoutError, OSError, ValueError, IndexError):
        statuses[1] += 1  # still waiting (held aside or queued): that is the point
    await hold.wait()  # every connection stays open until the peak was read
    writer.close()


async def flood(url: str, pid: int, key: str, n: int) -> tuple[float, collections.Counter[int]]:
    port = int(url.rsplit(":", 1)[1])
    statuses: collections.Counter[int] = collections.Counter()
    hold = asyncio.Event()
    before = rss_mb(pid)
    tasks = [asyncio.create_task(one(port, key, statuses, hold)) for _ in range(n)]
    await asyncio.sleep(3.0)
    peak = rss_mb(pid)
    hold.set()
    await asyncio.gather(*tasks)
    await asyncio.sleep(1.0)
    return peak - before, statuses


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--max-queue", type=int, default=1024)
    args = p.parse_args()
    results = []
    with MockProcess(MockConfig(ttft_ms=2000, tok_ms=0, tokens=2, parallel=64)) as m:
        eps = [{"url": m.url, "name": "m", "max_concurrent": 4}]
        for key in ("wrong-key-0123456789", KEY):  # a fresh router for each flood
            with router_process(
                eps,
                client_keys=[{"name": "flood", "key": KEY, "max_concurrent": 1}],
                usage_db=None,
                max_queue=args.max_queue,
            ) as (url, proc):
                time.sleep(1.0)
                results.append(await flood(url, proc.pid, key, args.requests))
    (refused, s1), (capped, s2) = results
    print(f"{args.requests} connections, one request each")
    print(f"  wrong key (all refused): RSS +{refused:.1f} MB, statuses {dict(s1)}")
    print(f"  capped key:              RSS +{capped:.1f} MB, statuses {dict(s2)} (1 = still waiting)")


if __name__ == "__main__":
    asyncio.run(main())
