"""A reference re-implementation of SGLang router's `cache_aware` policy, for comparison.

Follows sgl-router `src/policies/cache_aware.rs` (HTTP path, text tree):

- loads = in-flight requests per worker (here: holding a slot or waiting for that one);
  the system is imbalanced when max - min > `balance_abs_threshold` AND
  max > min x `balance_rel_threshold`; then the least loaded worker gets the request.
- otherwise the prompt text is prefix-matched against the tree; if matched / total
  characters > `cache_threshold` the worker owning the deepest match gets it, else the
  worker with the smallest tree ("most cache capacity").
- the chosen worker's text is inserted into the tree in both cases, at routing time.
- the tree is bounded by `max_tree_size` characters per worker (CLI default 2^26), far
  above any KV cache, so it does not learn the backend's evictions.
- SGLang sends the request to that worker whatever its queue; here it waits for that
  endpoint's slot (up to `queue_timeout`).

Differences: the match is at our block granularity (1024 characters), not per character.
Defaults are the sgl-router CLI's (0.3 / 64 / 1.5).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from ...domain import Endpoint
from ..prefix_index import BLOCK_CHARS, CHARS_PER_TOKEN, PrefixIndex
from .base import RouteContext


class SGLangCacheAware:
    name = "sglang"
    wants_prompt = True

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_size: int = 2**26,
        rng: random.Random | None = None,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.abs = balance_abs_threshold
        self.rel = balance_rel_threshold
        self.index = PrefixIndex(default_tokens=max_tree_size // CHARS_PER_TOKEN)
        self._rng = rng or random.Random()

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Endpoint], load: Callable[[Endpoint], float]
    ) -> tuple[list[Endpoint], float] | None:
        loads = [load(e) for e in candidates]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.abs and hi > lo * self.rel:
            return [candidates[loads.index(lo)]], math.inf
        p = ctx.prompt
        if p is not None and p.keys:
            matched = self.index.match(p.keys, [e.name for e in candidates])
            best = max(matched.values())
            chars = p.tokens * CHARS_PER_TOKEN
            if best and best * BLOCK_CHARS / chars > self.cache_threshold:
                owners = [e for e in candidates if matched[e.name] == best]
                return [self._rng.choice(owners)], math.inf
        # A miss: the worker with the smallest tree.
        sizes = [self.index.blocks(e.name) for e in candidates]
        return [candidates[sizes.index(min(sizes))]], math.inf

    def choose(self, ctx: RouteContext, free: Sequence[Endpoint], in_flight: Callable[[Endpoint], int]) -> Endpoint:
        return min(free, key=in_flight)  # shortest queue, as SGLang's fallback

    def routed(self, ctx: RouteContext, endpoint: Endpoint) -> None:
        p = ctx.prompt
        if p is not None and p.keys:
            self.index.insert(endpoint.name, p.keys)
