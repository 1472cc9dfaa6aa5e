"""What cache-aware routing costs per request, in-process: µs per decision.

    python bench/policy_cost.py [--endpoints 16] [--tokens 32000]

Times, separately: rendering a chat request and cutting it into block keys (done once per
request by the proxy), and the policy's work (pick + routed: the index walk for all
endpoints, the cost of each, the LRU insert), with the index warm: every endpoint holds
other prompts up to its `kv_cache_tokens` and one endpoint holds this prompt's prefix.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nomyo_router.domain import Endpoint  # noqa: E402
from nomyo_router.routing.policies import CacheAware, LeastBusy, RouteContext, SGLangCacheAware  # noqa: E402
from nomyo_router.routing.prefix_index import PrefixIndex, request_prompt  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoints", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32000)
    p.add_argument("--n", type=int, default=2000)
    args = p.parse_args()
    eps = []
    for i in range(args.endpoints):
        e = Endpoint(name=f"e{i}", url=f"http://127.0.0.1:{2000 + i}", slots=4)
        e.set_models(["llama3"])
        e.loaded = frozenset(["llama3:latest"])
        eps.append(e)
    rng = random.Random(1)
    doc = "".join(rng.choice("abcdefghij klmnop") for _ in range(args.tokens * 4 - 200))
    bodies = [
        {"messages": [{"role": "system", "content": doc}, {"role": "user", "content": f"question {i} " * 10}]}
        for i in range(args.n)
    ]
    t0 = time.perf_counter()
    prompts = [request_prompt("chat", "llama3:latest", b) for b in bodies]
    keys_us = (time.perf_counter() - t0) / args.n * 1e6
    load = {e.name: rng.randrange(5) for e in eps}
    for policy in (CacheAware(PrefixIndex({e.name: 131072 for e in eps})), SGLangCacheAware(), LeastBusy()):
        index = getattr(policy, "index", None)
        if index is not None:  # warm: every endpoint full of other prompts, one holds ours
            for e in eps:
                other = request_prompt("generate", "llama3:latest", {"prompt": e.name * 150_000})
                index.insert(e.name, other.keys)
            index.insert(eps[3].name, prompts[0].keys)
        pick = getattr(policy, "pick", None)
        routed = getattr(policy, "routed", None)
        t0 = time.perf_counter()
        for prompt in prompts:
            ctx = RouteContext("llama3:latest", "ollama", "chat", prompt=prompt)
            picked = pick(ctx, eps, lambda e: load[e.name]) if pick else None
            ep = picked[0][0] if picked else policy.choose(ctx, eps, lambda e: load[e.name])
            if routed:
                routed(ctx, ep)
        us = (time.perf_counter() - t0) / args.n * 1e6
        print(
            f"{policy.name:12} {args.endpoints} endpoints, {args.tokens}-token prompts "
            f"({len(prompts[0].keys)} blocks): decision {us:7.1f} µs  (+ prompt keys {keys_us:.1f} µs "
            f"per request, any prefix-aware policy)"
        )


if __name__ == "__main__":
    main()
