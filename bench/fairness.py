"""Fair queuing, measured: a light client key's queue wait while another key floods.

    python bench/fairness.py [--seconds 10] [--workers 1] [--flood 32] [--slots 2] [--service-ms 50]

One endpoint (a mock with a fixed service time) with `--slots` slots; key `flood` keeps
`--flood` requests in flight; key `light` sends one request every 4 service times. Each
request's queue wait is the router's own (`X-Router-Queue-Ms`). Three runs: the light
requests under their own key (fair share), under the flood's key (what FIFO gives them: one
queue, arrival order), and under their own key with `priority: 1`. Prints p50/p99 of each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp

from common import MockConfig, mock_process, router_process

FLOOD, LIGHT = "flood-key-0123456789", "light-key-0123456789"
BODY = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


async def drive(url: str, seconds: float, flood: int, gap: float, light_key: str) -> dict[str, list[float]]:
    waits: dict[str, list[float]] = {"flood": [], "light": []}
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one(name: str, key: str) -> None:
            async with s.post(url + "/api/chat", json=BODY, headers={"Authorization": f"Bearer {key}"}) as r:
                await r.read()
                if r.status == 200:
                    waits[name].append(float(r.headers.get("X-Router-Queue-Ms", "nan")))

        async def flooder() -> None:
            while time.monotonic() < deadline:
                await one("flood", FLOOD)

        async def light() -> None:
            await asyncio.sleep(gap)  # (the flood fills the queue first)
            tasks = []
            while time.monotonic() < deadline:
                tasks.append(asyncio.create_task(one("light", light_key)))
                await asyncio.sleep(gap)
            await asyncio.gather(*tasks)

        await asyncio.gather(*[flooder() for _ in range(flood)], light())
    return waits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per run (default 10)")
    p.add_argument("--workers", type=int, default=1, help="router workers (default 1)")
    p.add_argument("--flood", type=int, default=32, help="the flood's requests in flight (default 32)")
    p.add_argument("--slots", type=int, default=2, help="the endpoint's slots (default 2)")
    p.add_argument("--service-ms", type=float, default=50.0, help="the mock's time per request (default 50)")
    args = p.parse_args()
    service = args.service_ms / 1000
    mock = MockConfig(ttft_ms=args.service_ms, tok_ms=0.0, tokens=1, parallel=args.slots * 4, max_queue=100_000)
    runs = [
        ("fair share (own key)", LIGHT, {}),
        ("FIFO (the flood's key)", FLOOD, {}),
        ("priority 1 (own key)", LIGHT, {"priority": 1}),
    ]
    print(
        f"one endpoint, {args.slots} slots, {args.service_ms:g} ms a request; the flood keeps {args.flood} "
        f"in flight; {args.workers} worker(s); queue wait in ms (the router's X-Router-Queue-Ms)"
    )
    with mock_process(mock) as m:
        for label, key, light_extra in runs:
            keys = [{"name": "flood", "key": FLOOD}, {"name": "light", "key": LIGHT, **light_extra}]
            with router_process(
                [{"url": m.url, "name": "one", "max_concurrent": args.slots}],
                args.workers,
                client_keys=keys,
                queue_timeout=120,
            ) as (url, _):
                waits = asyncio.run(drive(url, args.seconds, args.flood, 4 * service, key))
            lw, fw = waits["light"], waits["flood"]
            print(
                f"{label:24} light: n={len(lw):4} p50 {pct(lw, 50):7.1f}  p99 {pct(lw, 99):7.1f} | "
                f"flood: n={len(fw):5} p50 {pct(fw, 50):7.1f}  p99 {pct(fw, 99):7.1f}"
                + (f"  (light mean {statistics.mean(lw):.1f})" if lw else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
