"""Abusive connections against one router worker.

    python bench/slowloris.py [--slow 1000] [--big 100] [--seconds 30]

`--slow` connections send a request head at 1 byte/s, `--big` connections each send an
unfinished 1 MiB header; meanwhile one client sends normal requests in a loop. Printed: the
normal requests' p50/p99 idle and under abuse, the router's RSS before, at peak and after,
and how long until every abusive connection had been closed by the router.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp

from common import router_process, rss_mb
from mock import MockConfig, MockProcess

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def normal(url: str, seconds: float) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as s:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            async with s.post(url + "/api/chat", json=CHAT) as r:
                await r.read()
                assert r.status == 200, r.status
            out.append(time.monotonic() - t0)
    return out


async def slow(host: str, port: int, closed: list[float], t0: float) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
        for ch in b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 60:
            if reader.at_eof():
                break
            writer.write(bytes([ch]))
            await writer.drain()
            try:
                await asyncio.wait_for(reader.read(1 << 16), 1.0)
                break  # any answer (408) or EOF: the router ended it
            except TimeoutError:
                continue
    except (ConnectionError, OSError):
        pass
    closed.append(time.monotonic() - t0)


async def big(host: str, port: int, closed: list[float], t0: float) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nX-Big: ")
        for _ in range(256):  # 256 x 4 KiB = 1 MiB, never finished
            writer.write(b"b" * 4096)
            await writer.drain()
        await asyncio.wait_for(reader.read(), 60)
    except (TimeoutError, ConnectionError, OSError):
        pass
    closed.append(time.monotonic() - t0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow", type=int, default=1000, help="connections sending 1 byte/s (default 1000)")
    p.add_argument("--big", type=int, default=100, help="connections with an unfinished 1 MiB header (default 100)")
    p.add_argument("--seconds", type=float, default=30.0, help="how long the abuse runs at most (default 30)")
    args = p.parse_args()
    with MockProcess(MockConfig(ttft_ms=0, tok_ms=0, tokens=8)) as m:
        with router_process([{"url": m.url, "name": "m", "max_concurrent": 64}]) as (url, proc):
            host, port = url.removeprefix("http://").split(":")

            async def run() -> dict:
                idle = await normal(url, 3)
                rss0 = rss_mb(proc.pid)
                peak = [rss0]
                closed: list[float] = []
                t0 = time.monotonic()
                abuse = [asyncio.create_task(slow(host, int(port), closed, t0)) for _ in range(args.slow)]
                abuse += [asyncio.create_task(big(host, int(port), closed, t0)) for _ in range(args.big)]

                async def sample() -> None:
                    while True:
                        peak[0] = max(peak[0], rss_mb(proc.pid))
                        await asyncio.sleep(0.5)

                sampler = asyncio.create_task(sample())
                loaded = await normal(url, 8)
                await asyncio.wait(abuse, timeout=args.seconds)
                sampler.cancel()
                await asyncio.sleep(1)
                return {
                    "normal_p50_ms_idle": pct(idle, 0.5),
                    "normal_p99_ms_idle": pct(idle, 0.99),
                    "normal_p50_ms_abused": pct(loaded, 0.5),
                    "normal_p99_ms_abused": pct(loaded, 0.99),
                    "abusive_connections": len(abuse),
                    "closed_by_router": len(closed),
                    "all_closed_within_s": round(max(closed), 1) if closed else None,
                    "rss_mb_before": round(rss0, 1),
                    "rss_mb_peak": round(peak[0], 1),
                    "rss_mb_after": round(rss_mb(proc.pid), 1),
                }

            print(json.dumps(asyncio.run(run()), indent=1))


if __name__ == "__main__":
    main()
