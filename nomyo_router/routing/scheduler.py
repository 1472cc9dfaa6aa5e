"""The scheduler: which endpoints may serve a model, and a slot on one of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..domain import Endpoint
from ..state import Ask, Lease, NoEndpoint, QueueFull, QueueTimeout, Rehome, StateStore
from ..state.queue_order import BATCH, Fair
from .policies import Policy, RouteContext


class Scheduler:
    """Picks a slot: conversation affinity first (follow the pin while it has room; after
    `affinity_wait` seconds of waiting for it, spill and re-pin), then the policy's own
    pick when it has one (it may wait for a busy endpoint whose cache is worth it), then
    the policy among free endpoints, and the FIFO queue when all are full."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        store: StateStore,
        policy: Policy,
        queue_timeout: float,
        affinity_wait: float | None = None,
        fair: dict[str, Fair] | None = None,
    ) -> None:
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
        self._waiting: dict[str, float] = {}  # requests waiting for these endpoints (picked)
        self._changes = 0  # index changes so far: a request that awaited something checks it
        # each client key's priority and share of the queue (client_keys[].priority, .weight);
        # a key not listed, and no key, have the default (state/queue_order.py)
        self.fair: dict[str, Fair] = fair or {}
        self.reindex()

    def set_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Config reload: route among these from now on (requests already waiting too)."""
        self.endpoints = list(endpoints)
        self._by_name = {e.name: e for e in self.endpoints}
        self.reindex()

    def reindex(self) -> None:
        """Rebuild the model index after discovery changed an endpoint's models. Requests
        waiting for a model whose endpoints changed are placed again among the new ones
        (`StateStore.rehome`): at once on one that was added, answered at once when none
        serves the model any more, never left waiting for one that is gone."""
        index: dict[str, list[Endpoint]] = {}
        for ep in self.endpoints:
            for key in ep.models:
                index.setdefault(key, []).append(ep)
        old, self._by_model = self._by_model, index
        if not old:
            return  # (the first index: nobody waits yet)
        changes: dict[str, tuple[frozenset[str], list[Endpoint]]] = {}
        for model in old.keys() | index.keys():
            before = {e.name for e in old.get(model, ())}
            now = index.get(model, [])
            if before != {e.name for e in now}:
                gone = before.difference(e.name for e in now)
                changes[model] = (frozenset(gone), [e for e in now if e.name not in before])
        if changes:
            self._changes += 1
            self.store.rehome(changes)

    def knows(self, model: str) -> bool:
        return model in self._by_model

    def serving(self, model: str) -> int:
        """How many endpoints serve `model` (healthy or not)."""
        return len(self._by_model.get(model, ()))

    def load(self, ep: Endpoint) -> float:
        """Requests holding a slot on `ep` or waiting for it in particular (one waiting for
        any of k endpoints counts 1/k on each)."""
        return self.store.in_flight(ep) + round(self._waiting.get(ep.name, 0.0), 6)

    def observe(self, ctx: RouteContext, ep: Endpoint, first_s: float | None, held_s: float) -> None:
        if self._observe is not None:
            self._observe(ctx, ep, first_s, held_s)

    async def acquire(self, ctx: RouteContext, exclude: Iterable[str] = ()) -> Lease:
        """A slot for `ctx.model`, skipping endpoints in `exclude` (already tried)."""
        candidates = self._by_model.get(ctx.model, [])
        if ctx.too_small:  # (too short a context window: left out before affinity and load)
            candidates = [e for e in candidates if e.name not in ctx.too_small]
        if exclude:
            skip = set(exclude)
            candidates = [e for e in candidates if e.name not in skip]
        if not candidates:
            raise NoEndpoint(ctx.model)
        store = self.store
        keys = ctx.keys
        try:
            if keys is None or self.affinity_wait is None:
                return await self._place(ctx, candidates, None, None)
            lease = None
            order: int | None = None
            outcome = "repin" if exclude else "miss"
            changes = self._changes
            pin = None if exclude or not keys.lookup else await store.find_pin(keys.lookup)
            if changes != self._changes:  # the index changed while it looked: nothing queued yet
                raise Rehome(ctx.model, None, 0.0)
            if pin is not None:
                pinned = self._by_name.get(pin[1])
                if pinned is not None and pinned in candidates and store.is_healthy(pinned):
                    try:
                        wait = self.affinity_wait if keys.certain else 0.0
                        lease = await store.acquire(self._ask(ctx, [pinned], wait, order, keys.register))
                        outcome = "hit"
                        if self._routed is not None and ctx.prompt is not None:
                            self._routed(ctx, lease.endpoint)
                    except QueueTimeout as waited:
                        outcome, order = "spill", waited.order  # keep its place in the queue
                    except (QueueFull, NoEndpoint):
                        outcome = "spill"
                else:
                    outcome = "repin"  # its endpoint is gone, sick, or no longer serves the model
                    await store.drop_pin(pin[0])
            if lease is None:
                lease = await self._place(ctx, candidates, order, keys.register)
            lease.affinity = outcome
            return lease
        except Rehome as e:  # the endpoints changed while it waited: a reload or a rediscovery
            return await self._rehomed(ctx, exclude, e)

    async def _rehomed(self, ctx: RouteContext, exclude: Iterable[str], signal: Rehome) -> Lease:
        """Place a request again that the store sent back because the endpoints changed while
        it waited: among the model's endpoints as they are now (none left: NoEndpoint, so the
        client is answered at once), in its old place in the FIFO queue, for what is left of
        `queue_timeout`. Straight to the common queue: a request that already waited goes to
        the first slot that frees, not to a policy's or a pin's favourite."""
        keys = ctx.keys
        pin = keys.register if keys is not None and self.affinity_wait is not None else None
        skip = set(exclude) | (ctx.too_small or set())
        waited = 0.0
        while True:
            waited += signal.waited
            candidates = [e for e in self._by_model.get(ctx.model, ()) if e.name not in skip]
            if not candidates:
                raise NoEndpoint(ctx.model)
            left = self.queue_timeout - waited
            if left <= 0:
                raise QueueTimeout(ctx.model, signal.order)
            try:
                lease = await self.store.acquire(self._ask(ctx, candidates, left, signal.order, pin))
                break
            except Rehome as e:  # changed again meanwhile
                signal = e
        lease.queued_s += waited
        if self._routed is not None and ctx.prompt is not None:
            self._routed(ctx, lease.endpoint)
        if pin is not None:
            lease.affinity = "repin"  # (its pin, if any, now points at the endpoint it got)
        return lease

    def _fair(self, ctx: RouteContext) -> Fair | None:
        if ctx.client is None:
            return None
        return self.fair.get(ctx.client) or (BATCH if ctx.client == BATCH[0] else None)

    def _ask(
        self, ctx: RouteContext, candidates: Sequence[Endpoint], timeout: float, order: int | None, pin: str | None
    ) -> Ask:
        """What the store is asked for `ctx`: a slot on one of `candidates`, the policy choosing."""
        policy, in_flight = self.policy, self.store.in_flight
        return Ask(
            model=ctx.model,
            candidates=candidates,
            choose=lambda free: policy.choose(ctx, free, in_flight),
            timeout=timeout,
            order=order,
            pin=pin,
            fair=self._fair(ctx),
        )

    async def _place(self, ctx: RouteContext, candidates: list[Endpoint], order: int | None, pin: str | None) -> Lease:
        store = self.store
        lease = None
        if self._pick is not None and len(candidates) > 1:
            healthy = [e for e in candidates if store.is_healthy(e)]
            picked = self._pick(ctx, healthy, self.load) if healthy else None
            if picked is not None:
                targets, wait = picked
                share = 1.0 / len(targets)  # one request, waiting for any of them
                waiting = self._waiting
                for t in targets:
                    waiting[t.name] = waiting.get(t.name, 0.0) + share
                try:
                    lease = await store.acquire(self._ask(ctx, targets, min(wait, self.queue_timeout), order, pin))
                except QueueTimeout as e:
                    order = e.order  # waited for it in vain: keep the place for the common queue
                except (QueueFull, NoEndpoint):
                    pass
                finally:
                    for t in targets:
                        waiting[t.name] -= share  # (added above)
        if lease is None:
            lease = await store.acquire(self._ask(ctx, candidates, self.queue_timeout, order, pin))
        if self._routed is not None and ctx.prompt is not None:
            self._routed(ctx, lease.endpoint)
        return lease
