"""Cache-aware routing against least-busy, conversation affinity alone and SGLang's thresholds.

    python bench/cache_routing.py [--requests 480] [--workloads shared,docs,hot,unique]
                                  [--policies least_busy,affinity,sglang,cache_aware] [--workers 1]

Four mocks, 4 slots each, with the simulated KV prefix cache sized so that not every
prefix fits everywhere (each holds 36k tokens, `--kv-tokens`; the 8 shared 6k-token
prefixes need 48k; 36k holds a quarter of them twice over, with room left for the
requests' own tails),
prefill cost on (25 ms per 1k uncached tokens, as bench/affinity.py), a closed loop of 16
users (= all slots: near capacity). Workloads:

- shared:  8 applications, each with a 6k-token system prompt; every request picks one
           at random and asks a short unique question.
- docs:    8 shared 4k-token documents; each user holds a 4-turn conversation about one.
- hot:     like shared, but one application takes 80% of the traffic.
- unique:  2k-token prompts that share nothing.

Policies: `least_busy` (conversation affinity off), `affinity` (least_busy + today's
conversation pins), `sglang` (the sgl-router cache_aware reference, affinity off) and
`cache_aware` (ours, with affinity: the default). Reports TTFT mean/p50/p90 at the
client, throughput, the mocks' KV token hit rate (/mock/stats) and the imbalance
(max/min requests per backend). The first `--warmup` requests of each run are not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MockConfig, MockProcess, router_process  # noqa: E402

SLOTS = 4
MOCKS = 4
USERS = MOCKS * SLOTS
KV_TOKENS = 36_000
PREFIX_TOKENS = 6_000
DOC_TOKENS = 4_000
GROUPS = 8
POLICIES = {  # name -> router config
    "least_busy": {"routing": "least_busy", "conversation_affinity": False},
    "affinity": {"routing": "least_busy", "conversation_affinity": True},
    "sglang": {"routing": "sglang", "conversation_affinity": False},
    "cache_aware": {"routing": "cache_aware", "conversation_affinity": True},
    "index_only": {"routing": "cache_aware", "conversation_affinity": False},  # no pins
}
WORDS = "the router keeps every shared prefix where it is already cached and spreads the rest ".split()


def text(tokens: int, tag: str, seed: int) -> str:
    rng = random.Random(seed)
    out = [f"[{tag}]"]
    n = 0
    while n < tokens * 4:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[: tokens * 4]


class Workload:
    """Yields, per user, the message lists to send (a conversation grows with answers)."""

    def __init__(self, kind: str, seed: int = 1) -> None:
        self.kind = kind
        self.rng = random.Random(seed)
        self.prefixes = [text(PREFIX_TOKENS, f"app {g}", g) for g in range(GROUPS)]
        self.docs = [text(DOC_TOKENS, f"doc {g}", 100 + g) for g in range(GROUPS)]
        self.n = 0

    def conversation(self) -> tuple[list[dict[str, str]], int]:
        """The first turn's messages and the number of turns."""
        self.n += 1
        n, rng = self.n, self.rng
        question = f"question {n}: {text(30, f'q{n}', 10_000 + n)}"
        if self.kind == "shared":
            return [{"role": "system", "content": rng.choice(self.prefixes)}, {"role": "user", "content": question}], 1
        if self.kind == "hot":
            g = 0 if rng.random() < 0.8 else rng.randrange(1, GROUPS)
            return [{"role": "system", "content": self.prefixes[g]}, {"role": "user", "content": question}], 1
        if self.kind == "docs":
            return [
                {"role": "system", "content": "Answer from the document."},
                {"role": "user", "content": rng.choice(self.docs) + "\n\n" + question},
            ], 4
        return [{"role": "user", "content": text(2_000, f"unique {n}", 20_000 + n)}], 1


QUEUE_MS: list[float] = []


async def one(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    ttft = None
    answer = []
    async with session.post(url + "/api/chat", json={"model": "llama3", "messages": messages, "stream": True}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        QUEUE_MS.append(float(resp.headers.get("X-Router-Queue-Ms", 0)))
        async for line in resp.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            if line.strip():
                answer.append(json.loads(line).get("message", {}).get("content", ""))
    return ttft or 0.0, time.perf_counter() - t0, "".join(answer)


async def drive(
    url: str, workload: Workload, requests: int, warmup: int, users: int, stats_urls: list[str], marks: list
) -> dict[str, Any]:
    ttfts: list[float] = []
    sent = 0
    t_start = [0.0]
    failures = [0]

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < requests + warmup:
            messages, turns = workload.conversation()
            for _ in range(turns):
                if sent >= requests + warmup:
                    return
                sent += 1
                measured = sent > warmup
                if sent == warmup + 1:
                    t_start[0] = time.perf_counter()
                    marks.append(await mock_stats(stats_urls))  # KV counters from here on
                try:
                    ttft, _, answer = await one(session, url, messages)
                except (TimeoutError, aiohttp.ClientError, RuntimeError):
                    failures[0] += 1
                    break
                if measured:
                    ttfts.append(ttft)
                messages = messages + [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"and then? ({sent})"},
                ]

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=users)) as s:
        await asyncio.gather(*(user(s) for _ in range(users)))
    elapsed = time.perf_counter() - t_start[0]
    ttfts.sort()
    queue = QUEUE_MS[warmup:]
    QUEUE_MS.clear()
    return {
        "queue_mean_ms": statistics.fmean(queue) if queue else 0.0,
        "n": len(ttfts),
        "failed": failures[0],
        "rps": len(ttfts) / elapsed,
        "ttft_mean_ms": 1000 * statistics.fmean(ttfts),
        "ttft_p50_ms": 1000 * ttfts[len(ttfts) // 2],
        "ttft_p90_ms": 1000 * ttfts[int(len(ttfts) * 0.9)],
    }


async def mock_stats(urls: list[str]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        out = []
        for u in urls:
            async with s.get(u + "/mock/stats") as r:
                out.append(await r.json())
        return out


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.post(u + "/mock/reset") as r:
                await r.read()


def run_one(
    mocks: list[MockProcess],
    policy: str,
    kind: str,
    requests: int,
    warmup: int,
    workers: int,
    router_kv: int,
    users: int,
) -> dict[str, Any]:
    urls = [m.url for m in mocks]
    asyncio.run(reset(urls))
    eps = [
        {
            "url": u,
            "name": f"mock{i}",
            "max_concurrent": SLOTS,
            "type": "ollama",
            "models": ["llama3"],
            "kv_cache_tokens": router_kv,
        }
        for i, u in enumerate(urls)
    ]
    with router_process(eps, workers=workers, **POLICIES[policy]) as (url, _):
        marks: list = []
        res = asyncio.run(drive(url, Workload(kind), requests, warmup, users, urls, marks))
        after = asyncio.run(mock_stats(urls))
        before = marks[0]
    hit = sum(a["kv_cache"]["hit_tokens"] - b["kv_cache"]["hit_tokens"] for a, b in zip(after, before, strict=True))
    miss = sum(a["kv_cache"]["miss_tokens"] - b["kv_cache"]["miss_tokens"] for a, b in zip(after, before, strict=True))
    per = [a["requests_total"] for a in after]  # whole run: where the traffic went
    res.update(
        policy=policy,
        workload=kind,
        workers=workers,
        kv_hit=hit / max(hit + miss, 1),
        split=per,
        imbalance=max(per) / max(min(per), 1),
    )
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=480, help="measured requests per run")
    p.add_argument("--warmup", type=int, default=64)
    p.add_argument("--workloads", default="shared,docs,hot,unique")
    p.add_argument("--policies", default="least_busy,affinity,sglang,cache_aware", help=f"of {', '.join(POLICIES)}")
    p.add_argument("--workers", default="1", help="router workers, e.g. 1,4")
    p.add_argument("--kv-tokens", type=int, default=KV_TOKENS, help="each mock's KV cache, in tokens")
    p.add_argument(
        "--router-kv-tokens",
        type=int,
        default=None,
        help="kv_cache_tokens the router is told per endpoint (default: --kv-tokens)",
    )
    p.add_argument("--users", type=int, default=USERS, help=f"closed-loop users (default {USERS} = all slots)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    cfg = MockConfig(
        models=["llama3"],
        ttft_ms=20.0,
        tokens=32,
        tok_ms=3.0,
        parallel=SLOTS,
        prefill_ms_per_1k_tokens=25.0,
        kv_cache_tokens=args.kv_tokens,
    )
    router_kv = args.kv_tokens if args.router_kv_tokens is None else args.router_kv_tokens
    mocks = [MockProcess(cfg).start() for _ in range(MOCKS)]
    rows = []
    try:
        print(
            f"{'workload':8} {'policy':12} {'wk':>2} {'ttft mean':>9} {'p50':>7} {'p90':>7} "
            f"{'req/s':>6} {'kv hit':>6} {'max/min':>7}  split"
        )
        for kind in args.workloads.split(","):
            for workers in [int(w) for w in args.workers.split(",")]:
                for policy in args.policies.split(","):
                    r = run_one(mocks, policy, kind, args.requests, args.warmup, workers, router_kv, args.users)
                    rows.append(r)
                    print(
                        f"{kind:8} {policy:12} {workers:>2} {r['ttft_mean_ms']:7.1f}ms {r['ttft_p50_ms']:5.1f}ms "
                        f"{r['ttft_p90_ms']:5.1f}ms {r['rps']:6.1f} {r['kv_hit']:6.1%} {r['imbalance']:7.2f}  "
                        f"{'/'.join(map(str, r['split']))}  queue {r['queue_mean_ms']:.1f}ms"
                        + (f"  failed {r['failed']}" if r["failed"] else ""),
                        flush=True,
                    )
    finally:
        for m in mocks:
            m.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
