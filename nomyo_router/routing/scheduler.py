"""The scheduler: which endpoints may serve a model, and a slot on one of them."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from ..domain import Endpoint
from ..state import Lease, NoEndpoint, QueueFull, QueueTimeout, StateStore
from .policies import Policy, RouteContext


class Scheduler:
    """Picks a slot: conversation affinity first (follow the pin while it has room; after
    `affinity_wait` seconds of waiting for it, spill and re-pin), then the policy's own
    pick when it has one (it may wait for a busy endpoint whose cache is worth it), then
    the policy among free endpoints, and the FIFO queue when all are full."""

    def __init__(self, endpoints: Sequence[Endpoint], store: StateStore, policy: Policy,
                 queue_timeout: float, affinity_wait: float | None = None) -> None:
        self.endpoints = list(endpoints)
        self.store = store
        self.policy = policy
        self.queue_timeout = queue_timeout
        self.affinity_wait = affinity_wait  # None: affinity off
        self._by_name = {e.name: e for e in self.endpoints}
        self._by_model: dict[str, list[Endpoint]] = {}
        self._pick = getattr(policy, "pick", None)
        self._routed = getattr(policy, "routed", None)
        self._observe = getattr(policy, "observe", None)
        self._waiting: Counter[str] = Counter()  # requests waiting for these endpoints (picked)
        self.reindex()

    def set_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Config reload: route among these from now on."""
        self.endpoints = list(endpoints)
        self._by_name = {e.name: e for e in self.endpoints}
        self.reindex()

    def reindex(self) -> None:
        """Rebuild the model index after discovery changed an endpoint's models."""
        index: dict[str, list[Endpoint]] = {}
        for ep in self.endpoints:
            for key in ep.models:
                index.setdefault(key, []).append(ep)
        self._by_model = index

    def knows(self, model: str) -> bool:
        return model in self._by_model

    def serving(self, model: str) -> int:
        """How many endpoints serve `model` (healthy or not)."""
        return len(self._by_model.get(model, ()))

    def load(self, ep: Endpoint) -> float:
        """Requests holding a slot on `ep` or waiting for it in particular (one waiting for
        any of k endpoints counts 1/k on each)."""
        return self.store.in_flight(ep) + round(self._waiting[ep.name], 6)

    def observe(self, ctx: RouteContext, ep: Endpoint, first_s: float | None, held_s: float) -> None:
        if self._observe is not None:
            self._observe(ctx, ep, first_s, held_s)

    async def acquire(self, ctx: RouteContext, exclude: Iterable[str] = ()) -> Lease:
        """A slot for `ctx.model`, skipping endpoints in `exclude` (already tried)."""
        candidates = self._by_model.get(ctx.model, [])
        if exclude:
            skip = set(exclude)
            candidates = [e for e in candidates if e.name not in skip]
        if not candidates:
            raise NoEndpoint(ctx.model)
        store = self.store
        keys = ctx.keys
        if keys is None or self.affinity_wait is None:
            lease = await self._place(ctx, candidates, None, None)
        else:
            lease = None
            order = None
            outcome = "repin" if exclude else "miss"
            pin = None if exclude or not keys.lookup else await store.find_pin(keys.lookup)
            if pin is not None:
                pinned = self._by_name.get(pin[1])
                if pinned is not None and pinned in candidates and store.is_healthy(pinned):
                    try:
                        wait = self.affinity_wait if keys.certain else 0.0
                        lease = await store.acquire(ctx.model, [pinned], self._chooser(ctx), wait,
                                                    order, keys.register)
                        outcome = "hit"
                        if self._routed is not None and ctx.prompt is not None:
                            self._routed(ctx, lease.endpoint)
                    except QueueTimeout as e:
                        outcome, order = "spill", e.order  # keep its place in the queue
                    except (QueueFull, NoEndpoint):
                        outcome = "spill"
                else:
                    outcome = "repin"  # its endpoint is gone, sick, or no longer serves the model
                    await store.drop_pin(pin[0])
            if lease is None:
                lease = await self._place(ctx, candidates, order, keys.register)
            lease.affinity = outcome
        return lease

    def _chooser(self, ctx: RouteContext):
        policy, in_flight = self.policy, self.store.in_flight
        return lambda free: policy.choose(ctx, free, in_flight)

    async def _place(self, ctx: RouteContext, candidates: list[Endpoint], order: int | None,
                     pin: str | None) -> Lease:
        store, choose = self.store, self._chooser(ctx)
        lease = None
        if self._pick is not None and len(candidates) > 1:
            healthy = [e for e in candidates if store.is_healthy(e)]
            picked = self._pick(ctx, healthy, self.load) if healthy else None
            if picked is not None:
                targets, wait = picked
                share = 1.0 / len(targets)  # one request, waiting for any of them
                waiting = self._waiting
                for t in targets:
                    waiting[t.name] += share
                try:
                    lease = await store.acquire(ctx.model, targets, choose,
                                                min(wait, self.queue_timeout), order, pin)
                except QueueTimeout as e:
                    order = e.order  # waited for it in vain: keep the place for the common queue
                except (QueueFull, NoEndpoint):
                    pass
                finally:
                    for t in targets:
                        waiting[t.name] -= share
        if lease is None:
            lease = await store.acquire(ctx.model, candidates, choose, self.queue_timeout, order, pin)
        if self._routed is not None and ctx.prompt is not None:
            self._routed(ctx, lease.endpoint)
        return lease
