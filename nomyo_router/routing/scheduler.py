"""The scheduler: which endpoints may serve a model, and a slot on one of them."""

from __future__ import annotations

from typing import Iterable, Sequence

from ..domain import Endpoint
from ..state import Lease, NoEndpoint, StateStore
from .policies import Policy, RouteContext


class Scheduler:
    def __init__(self, endpoints: Sequence[Endpoint], store: StateStore, policy: Policy,
                 queue_timeout: float) -> None:
        self.endpoints = list(endpoints)
        self.store = store
        self.policy = policy
        self.queue_timeout = queue_timeout
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

    def serving(self, model: str) -> list[Endpoint]:
        return self._by_model.get(model, [])

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

        return await store.acquire(ctx.model, candidates, choose, self.queue_timeout)
