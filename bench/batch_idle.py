"""Interactive latency with and without a batch running on the same endpoint.

    python bench/batch_idle.py [--seconds 10] [--clients 3] [--slots 4] [--lines 400]

One router process, one mock backend (`--slots` slots at the router, each request ~100 ms:
50 ms to the first token, 10 tokens at 5 ms). `--clients` interactive clients, each sending a
chat and pausing a random while (exponential, mean 50 ms), for `--seconds`: first alone, then
with a batch of `--lines` chat lines submitted just before (the OpenAI Batch API, `batch:
{enabled: true, max_share: 0.5}`). Then the interactive load stops and the batch is waited
for. Printed: interactive p50/p95 of each phase and their ratio (the goal: p95 within 1.25x),
batch lines per second during the load and after it, and whether the batch finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import router_process  # noqa: E402
from mock import MockConfig, MockProcess  # noqa: E402

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 10}


async def interactive(url: str, clients: int, seconds: float) -> list[float]:
    lat: list[float] = []
    end = time.monotonic() + seconds

    async def one(s: aiohttp.ClientSession) -> None:
        rng = random.Random()
        while time.monotonic() < end:
            t0 = time.perf_counter()
            async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                await r.read()
                if r.status != 200:
                    raise SystemExit(f"interactive request failed: {r.status}")
            lat.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(rng.expovariate(1 / 0.05))

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s) for _ in range(clients)))
    return lat


async def counts(s: aiohttp.ClientSession, url: str, batch_id: str) -> dict[str, object]:
    async with s.get(f"{url}/v1/batches/{batch_id}") as r:
        b: dict[str, object] = await r.json()
        return b


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1]


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--lines", type=int, default=400)
    args = p.parse_args()
    lines = b"".join(
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}).encode()
        + b"\n"
        for i in range(args.lines)
    )
    with MockProcess(MockConfig(ttft_ms=50, tok_ms=5, tokens=10, parallel=64)) as m, tempfile.TemporaryDirectory() as d:
        eps = [{"url": m.url, "name": "m", "max_concurrent": args.slots}]
        batch = {"enabled": True, "path": os.path.join(d, "batch.db"), "max_share": 0.5}
        with router_process(eps, usage_db=os.path.join(d, "usage.db"), batch=batch) as (url, _):
            await interactive(url, args.clients, 1.0)  # warm up
            alone = await interactive(url, args.clients, args.seconds)
            async with aiohttp.ClientSession() as s:
                form = aiohttp.FormData()
                form.add_field("purpose", "batch")
                form.add_field("file", lines, filename="in.jsonl")
                async with s.post(url + "/v1/files", data=form) as r:
                    file_id = (await r.json())["id"]
                body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
                async with s.post(url + "/v1/batches", json=body) as r:
                    batch_id = (await r.json())["id"]
                t0 = time.monotonic()
                with_batch = await interactive(url, args.clients, args.seconds)
                during = (await counts(s, url, batch_id))["request_counts"]
                t1 = time.monotonic()
                while (b := await counts(s, url, batch_id))["status"] not in ("completed", "failed") and (
                    time.monotonic() - t1 < 120
                ):
                    await asyncio.sleep(0.2)
                t2 = time.monotonic()
    done_during = during["completed"] + during["failed"]  # type: ignore[index]
    done_after = b["request_counts"]["completed"] + b["request_counts"]["failed"] - done_during  # type: ignore[index]
    print(
        f"interactive alone:      p50 {statistics.median(alone):6.1f} ms  p95 {p95(alone):6.1f} ms  "
        f"({len(alone)} requests)"
    )
    print(
        f"interactive with batch: p50 {statistics.median(with_batch):6.1f} ms  p95 {p95(with_batch):6.1f} ms  "
        f"({len(with_batch)} requests)"
    )
    print(f"p95 ratio: {p95(with_batch) / p95(alone):.2f}x (goal <= 1.25x)")
    print(
        f"batch lines/s during the load: {done_during / (t1 - t0):.1f}; after it: {done_after / max(t2 - t1, 1e-9):.1f}"
    )
    print(f"batch {b['status']} {t2 - t1:.1f} s after the interactive load stopped ({args.lines} lines)")


if __name__ == "__main__":
    asyncio.run(main())
