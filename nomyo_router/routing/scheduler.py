"""The scheduler: which endpoints may serve a model, and a slot on one of them."""

from __future__ import annotations

from typing import Iterable, Sequence

from ..domain import Endpoint
from ..state import Lease, NoEndpoint, QueueFull, QueueTimeout, StateStore
from .policies import Policy, RouteContext


class Scheduler:
    """Picks a slot: the policy among free endpoints, the queue when all are full, and
    conversation affinity on top (follow the pin while it has room; after
    `affinity_wait` seconds of waiting for it, spill to the least busy and re-pin)."""

    def __init__(self, endpoints: Sequence[Endpoint], store: StateStore, policy: Policy,
                 queue_timeout: float, affinity_wait: float | None = None) -> None:
        self.endpoints = list(endpoints)
        self.store = store
        self.policy = policy
        self.queue_timeout = queue_timeout
        self.affinity_wait = affinity_wait  # None: affinity off
        self._by_name = {e.name: e for e in self.endpoints}
        self._by_model: dict[str, list[Endpoint]] = {}
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

    async def acquire(self, ctx: RouteContext, exclude: Iterable[str] = ()) -> Lease:
        """A slot for `ctx.model`, skipping endpoints in `exclude` (already tried)."""
        candidates = self._by_model.get(ctx.model, [])
        if exclude:
            skip = set(exclude)
            candidates = [e for e in candidates if e.name not in skip]
        if not candidates:
            raise NoEndpoint(ctx.model)
        store, policy = self.store, self.policy

        def choose(free: Sequence[Endpoint]) -> Endpoint:
            return policy.choose(ctx, free, store.in_flight)

        keys = ctx.keys
        if keys is None or self.affinity_wait is None:
            return await store.acquire(ctx.model, candidates, choose, self.queue_timeout)
        lease = None
        order = None
        outcome = "repin" if exclude else "miss"
        pin = None if exclude or not keys.lookup else await store.find_pin(keys.lookup)
        if pin is not None:
            pinned = self._by_name.get(pin[1])
            if pinned is not None and pinned in candidates and store.is_healthy(pinned):
                try:
                    wait = self.affinity_wait if keys.certain else 0.0
                    lease = await store.acquire(ctx.model, [pinned], choose, wait, order, keys.register)
                    outcome = "hit"
                except QueueTimeout as e:
                    outcome, order = "spill", e.order  # keep its place in the queue
                except (QueueFull, NoEndpoint):
                    outcome = "spill"
            else:
                outcome = "repin"  # its endpoint is gone, sick, or no longer serves the model
                await store.drop_pin(pin[0])
        if lease is None:
            lease = await store.acquire(ctx.model, candidates, choose, self.queue_timeout, order,
                                        keys.register)
        lease.affinity = outcome
        return lease
