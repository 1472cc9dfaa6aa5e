"""Cache aware: send each request where its time to first token is expected to be lowest.

For every candidate endpoint:

    cost = expected queue wait + prefill rate x (prompt tokens - tokens it has cached)

- the cached prefix comes from the `PrefixIndex` (what this endpoint recently served);
- the wait is (load - slots + 1) / slots x the mean time a request holds a slot there,
  where load counts requests holding a slot and those already waiting for that endpoint;
- the prefill rate (seconds per uncached token) is fitted per endpoint from observed
  backend times to first byte against the uncached tokens we estimated (a decayed least
  squares line); until an endpoint has enough spread in its samples, the fit over all
  endpoints, and before that a prior.

No fixed thresholds: a hot prefix is served where it is cached until the wait there
costs more than prefilling it elsewhere, so it replicates to more backends exactly when
one is busy; a miss costs the same everywhere, so it goes to the least loaded endpoint
(the same choice as `least_busy`). Costs within `TIE_S` are ties, broken by load and then
at random, so noise in the fitted rates never herds requests onto one endpoint.

When every home of a prefix (each endpoint holding as much of it) is full, the request
waits for whichever frees a slot first. Each such wait is short of a prefill, but together
they are not: the expected waits are added to the prefix's debt, and once the debt pays
for one prefill elsewhere (rent or buy), the prefix gets another home on a free endpoint,
if that endpoint's cache has room beside the shared prefixes it already holds. Two homes
per prefix let each request take the less busy one, which cuts the queueing at a single
home that otherwise sets the tail.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from ...domain import Endpoint
from ..prefix_index import BLOCK_TOKENS, PrefixIndex
from .base import RouteContext

PRIOR_S_PER_TOKEN = 1e-4  # 0.1 ms per token: a 7-8B model on one consumer GPU
PRIOR_HOLD_S = 1.0
TIE_S = 0.005
DECAY = 0.995  # the fit forgets with a half-life of ~140 samples
MIN_SAMPLES = 8
MIN_SPREAD_TOKENS = 128.0  # a fit needs samples with and without cache hits
REPLICA_SLACK = 0.125  # a replica must leave this share of the cache for requests' own tails
# a candidate as ranked: (sort key, the endpoint, expected wait + prefill, prefill) in seconds
Ranked = tuple[tuple[bool, int, float, float, float], Endpoint, float, float]


class _Fit:
    """Decayed least squares of y = a + b x."""

    __slots__ = ("n", "sx", "sy", "sxx", "sxy")

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        d = DECAY
        self.n = self.n * d + 1.0
        self.sx = self.sx * d + x
        self.sy = self.sy * d + y
        self.sxx = self.sxx * d + x * x
        self.sxy = self.sxy * d + x * y

    def slope(self) -> float | None:
        n = self.n
        if n < MIN_SAMPLES:
            return None
        var = self.sxx / n - (self.sx / n) ** 2
        if var < MIN_SPREAD_TOKENS**2:
            return None
        return max((self.sxy / n - self.sx * self.sy / (n * n)) / var, 0.0)


class CacheAware:
    name = "cache_aware"
    wants_prompt = True

    def __init__(
        self,
        index: PrefixIndex | None = None,
        rng: random.Random | None = None,
        prior_s_per_token: float = PRIOR_S_PER_TOKEN,
    ) -> None:
        self.index = index or PrefixIndex()
        self._random = (rng or random.Random()).random
        self.prior = prior_s_per_token
        self._fits: dict[str, _Fit] = {}  # stream first bytes against uncached tokens
        self._all = _Fit()
        self._fits_whole: dict[str, _Fit] = {}  # whole answers (no stream) against uncached tokens
        self._all_whole = _Fit()
        self._hold: dict[str, float] = {}
        self._placed: dict[str, float] = {}  # recent new prompts placed per endpoint (decayed)
        self._debt: dict[int, float] = {}  # prefix key -> expected waits for its full homes

    # ---- the learned model ---------------------------------------------------------
    def rate(self, endpoint: str) -> float:
        """Seconds per uncached prompt token at `endpoint`: its own fit, else the fit over all
        endpoints; from stream first bytes, else (no streams seen) from whole answers, whose
        slope is the same prefill cost with the decode time as extra noise; else the prior."""
        for fits, pooled in ((self._fits, self._all), (self._fits_whole, self._all_whole)):
            fit = fits.get(endpoint)
            b = fit.slope() if fit is not None else None
            if b is None:
                b = pooled.slope()
            if b is not None:
                return b
        return self.prior

    def observe(self, ctx: RouteContext, endpoint: Endpoint, first_s: float | None, held_s: float) -> None:
        name = endpoint.name
        h = self._hold.get(name)
        self._hold[name] = held_s if h is None else 0.8 * h + 0.2 * held_s
        if ctx.prompt is None:
            return
        uncached = float(ctx.prompt.tokens - (ctx.cached_tokens or 0))
        fits, pooled, y = (
            (self._fits, self._all, first_s) if first_s is not None else (self._fits_whole, self._all_whole, held_s)
        )
        fit = fits.get(name)
        if fit is None:
            fit = fits[name] = _Fit()
        fit.add(uncached, y)
        pooled.add(uncached, y)

    # ---- decisions -------------------------------------------------------------------
    def _matched(self, ctx: RouteContext, endpoints: Sequence[Endpoint]) -> dict[str, int]:
        p = ctx.prompt
        if p is None or not p.keys:
            return {}
        blocks = self.index.match(p.keys, [e.name for e in endpoints])
        return {n: min(b * BLOCK_TOKENS, p.tokens) for n, b in blocks.items() if b}

    def _occupancy(self, ep: Endpoint) -> float:
        cap = self.index.capacity_blocks(ep.name)
        return min(self.index.blocks(ep.name) / cap, 1.0) if cap else 1.0

    def _prefill(self, ctx: RouteContext, ep: Endpoint, matched: dict[str, int]) -> float:
        tokens = ctx.prompt.tokens if ctx.prompt is not None else 0
        return self.rate(ep.name) * (tokens - matched.get(ep.name, 0))

    def _wait(self, ep: Endpoint, load: float) -> float:
        over = load - ep.slots + 1
        return 0.0 if over <= 0 else over * self._hold.get(ep.name, PRIOR_HOLD_S) / ep.slots

    def _rank(
        self, ctx: RouteContext, cands: Sequence[Endpoint], load: Callable[[Endpoint], float], matched: dict[str, int]
    ) -> list[Ranked]:
        model, rand = ctx.model, self._random
        out: list[Ranked] = []
        for e in cands:
            n = load(e)
            prefill = self._prefill(ctx, e, matched)
            cost = self._wait(e, n) + prefill
            out.append(
                (
                    (model not in e.loaded, math.floor(cost / TIE_S), n / e.slots, self._occupancy(e), rand()),
                    e,
                    cost,
                    prefill,
                )
            )
        out.sort(key=lambda r: r[0])
        return out

    def pick(
        self, ctx: RouteContext, candidates: Sequence[Endpoint], load: Callable[[Endpoint], float]
    ) -> tuple[list[Endpoint], float] | None:
        matched = self._matched(ctx, candidates)
        if not matched:
            return None  # nothing cached anywhere: the store's least-busy choice is ours
        ranked = self._rank(ctx, candidates, load, matched)
        _, best, cost, prefill = ranked[0]
        # The prefix's homes: every endpoint holding as much of it (as cheap to prefill).
        home_prefill = min(r[3] for r in ranked)
        if prefill > home_prefill + TIE_S and load(best) < best.slots:
            ctx.cached_tokens = matched.get(best.name, 0)
            return [best], 0.0  # waiting at any home costs more than prefilling here
        homes = [r for r in ranked if r[3] <= home_prefill + TIE_S]
        others = [r for r in ranked if r[3] > home_prefill + TIE_S]
        if not others:
            return None  # it is cached everywhere it could go: first free slot anywhere
        alt = min(others, key=lambda r: r[2])
        budget = alt[2] - home_prefill  # worth waiting while wait + prefill beats it
        if budget <= TIE_S:
            return None  # waiting buys nothing: first free slot anywhere
        if load(best) >= best.slots and self._replicate(ctx, homes, alt, cost - prefill, load):
            ctx.cached_tokens = matched.get(alt[1].name, 0)
            return [alt[1]], 0.0
        # A free home takes it at once; when all are full (or our view of their load is
        # stale: another worker just took the slot), it waits for whichever frees first.
        ctx.cached_tokens = matched.get(homes[0][1].name, 0)
        return [r[1] for r in homes], budget

    def _replicate(
        self, ctx: RouteContext, homes: list[Ranked], alt: Ranked, wait: float, load: Callable[[Endpoint], float]
    ) -> bool:
        """Rent or buy: requests that wait for a prefix's full homes add their expected wait
        to its debt; once the debt pays for one prefill elsewhere, the prefix gets another
        home on a free endpoint whose cache has room for it without evicting a prefix in
        use (the ski-rental rule: rent until the rent paid would have bought). A replica
        pays for itself only if the prefix keeps coming, which is what the debt measures."""
        target = alt[1]
        if load(target) >= target.slots:
            return False
        p = ctx.prompt
        if p is None:  # (not asked: a prefix is matched only for a prompt)
            return False
        shared = max(self.index.match(p.keys, [homes[0][1].name]).values())
        if shared < 1:
            return False
        key = p.keys[shared - 1]  # names the whole shared prefix
        cap = self.index.capacity_blocks(target.name)
        room = cap - self.index.shared_blocks(target.name) - shared
        if room < cap * REPLICA_SLACK:
            return False  # it would push out a prefix in use there: keep waiting
        debt = self._debt.pop(key, 0.0) + wait
        if debt >= alt[3] - homes[0][3]:
            return True
        if len(self._debt) >= 4096:
            self._debt.clear()
        self._debt[key] = debt
        return False

    def choose(self, ctx: RouteContext, free: Sequence[Endpoint], in_flight: Callable[[Endpoint], int]) -> Endpoint:
        matched = self._matched(ctx, free)
        if not matched:
            # A miss everywhere: the least busy, and among those the emptiest cache (it
            # evicts the least, and new prefixes spread over the endpoints).
            model, rand, placed = ctx.model, self._random, self._placed
            if ctx.prompt is None or not ctx.prompt.keys:
                return min(free, key=lambda e: (model not in e.loaded, in_flight(e) / e.slots, rand()))
            ep = min(
                free, key=lambda e: (model not in e.loaded, placed.get(e.name, 0.0), in_flight(e) / e.slots, rand())
            )
            for name in placed:
                placed[name] *= 0.9
            placed[ep.name] = placed.get(ep.name, 0.0) + 1.0
            return ep
        return self._rank(ctx, free, in_flight, matched)[0][1]

    def routed(self, ctx: RouteContext, endpoint: Endpoint) -> None:
        p = ctx.prompt
        if p is not None and p.keys:
            ctx.cached_tokens = self._matched(ctx, [endpoint]).get(endpoint.name, 0)
            self.index.insert(endpoint.name, p.keys)
