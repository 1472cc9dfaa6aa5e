"""The running router: one per process, every long-lived component built once at start-up,
each given what it needs in its constructor, started and closed in order.

What serves a generation request is built here at once; what serves the operator's routes
(model management, the dashboard, usage, the cache's routes, reload, `/api/status`) is built
on first use (`handlers.py`), and imports its modules then; the started router, its reloads
and those handlers are put together by the lifespan (`lifespan.py`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from functools import cached_property
from typing import TYPE_CHECKING

from ..api import access
from ..api.client_caps import ClientLimits
from ..api.key_admission import RateLimits
from ..backends.discovery import Discovery
from ..backends.health import Health
from ..backends.management_session import ManageSession
from ..config import CONFIG_ENV, RouterConfig
from ..domain import Endpoint, model_key
from ..events import Events, RequestRecord
from ..forward import ensemble
from ..forward.extra_calls import charger
from ..forward.proxy import Proxy
from ..h1 import Upstream
from ..ops.accesslog import AccessLog
from ..ops.history import history_for
from ..ops.metrics import UNKNOWN_MODEL, Metrics, spin_counter, state_gauges
from ..ops.usage.budgets import budget_source
from ..ops.usage.store import make_usage
from ..routing.context_windows import Windows
from ..routing.policies import Policy, make_policy, picker
from ..routing.scheduler import Scheduler
from ..server.body_budget import BodyBudget
from ..server.idle_spin import IdleSpin
from ..state import MemoryStore, StateStore, private
from ..state.queue_order import specs_of
from .descriptor_watch import DescriptorWatch
from .gc_pacing import GcPace
from .loop_lag import LoopLag

if TYPE_CHECKING:
    from ..batch.service import Batches
    from ..cache.service import ResponseCache
    from ..ops.tracing import Tracer
    from ..ops.usage.stream import UsageStream
    from ..routing.kv_events import KVEventState
    from ..server.asgi import Scope

log = logging.getLogger("nomyo_router")


class Router:
    """The running router: one per process, built at start-up, closed at shutdown."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.endpoints = [Endpoint.from_config(e) for e in config.endpoints]
        policy = make_policy(config.routing, {e.name: e.kv_cache_tokens for e in config.endpoints})
        self.store: StateStore = make_store(config, self.endpoints, policy)
        share_index(policy, self.store)
        self.scheduler = Scheduler(
            self.endpoints,
            self.store,
            policy,
            config.queue_timeout,
            config.affinity_wait_ms / 1000 if config.conversation_affinity else None,
            fair=specs_of(config.client_keys),  # priorities and fair shares of the queue
        )
        self.session_header = config.session_header.lower().encode("latin-1")
        self.events = Events()
        self.events.on_request_done(self.label)  # (first: every other listener sees the label)
        self.client_limits = ClientLimits(access.caps_of(config), self.store, config.max_queue)
        self.rate_limits = RateLimits(config, self.store, self.events)  # rpm, tpm, tokens_per_day
        self.charge = charger(self.rate_limits)  # a request's further backend calls, on its key's limits
        self.keys = access.keys_of(config)
        self.origins = access.Origins(config.allowed_origins)
        self.hosts = access.Hosts(config.allowed_hosts)  # an open router's Host check
        self.body_budget = BodyBudget(config.max_queued_body_bytes)  # bodies held while queued
        self.loop_lag = LoopLag()
        self.descriptor_watch = DescriptorWatch(self.events)
        self.idle_spin = IdleSpin(config.idle_spin_us / 1e6)  # armed by the protocol (server/protocol.py)
        # full collections on a timer, not by growth (thousands of open streams)
        self.gc = GcPace(config.gc_full_interval) if config.gc_full_interval else None
        self.batches: Batches | None = None  # the Batch API (made once the proxy is)
        self.metrics = Metrics(
            self.events,
            lambda: [
                *state_gauges(self.endpoints, self.store, self.loop_lag),
                *self.rate_limits.gauges(),
                spin_counter(self.idle_spin.spun_s),
                *(self.batches.gauges() if self.batches is not None else ()),
            ],
            self.serves,
        )
        self.history = history_for(self.metrics)  # the dashboard's last hour, sampled on a timer
        self.access_log = AccessLog(self.events, config.log_format) if config.access_log else None
        self.usage = make_usage(self.events, config.usage_db, config.state, config.redis_timeout)
        self.health = Health(self.endpoints, self.store, self.events, config, self.loop_lag)
        # the one client of every upstream call but model management (traced when tracing is on)
        self.tracer: Tracer | None = None
        self.upstream = Upstream()
        if config.tracing is not None:
            from ..ops import tracing

            self.tracer, self.upstream = tracing.make(config, self.events)
        self.manage_session = ManageSession(config)  # aiohttp, made when first needed
        # context-length-aware routing (None: context_routing off); learned with discovery
        self.windows = (
            Windows(config.context_routing, self.upstream, lambda: self.endpoints)
            if config.context_routing != "off"
            else None
        )
        self.discovery = Discovery(
            self.endpoints,
            self.upstream,
            self.store,
            self.scheduler.reindex,
            config,
            self.health,
            learned=self.windows.learn if self.windows is not None else None,
        )
        self.proxy = Proxy(
            self.scheduler,
            self.upstream,
            self.store,
            config,
            self.events,
            self.health,
            rediscover=self.discovery.refresh_now,
        )
        self.cache = cache_if_on(config, self)  # the response cache; None: off
        self.ensemble = ensemble.Ensemble(self)  # moe-<model> requests
        self.kv_tasks: list[asyncio.Task[None]] = []  # precise mode: KV-event subscribers
        self.kv_states: dict[str, KVEventState] = {}
        self.batches = make_batches(config, self)  # the Batch API; None: off

    def serves(self, model: str) -> bool:
        """Does some endpoint serve `model` (for `moe-<model>`: `<model>`)?"""
        key = model_key(model.removeprefix(ensemble.PREFIX))
        return any(ep.serves(key) for ep in self.endpoints)

    def label(self, rec: RequestRecord) -> None:
        """A finished request for a model no endpoint serves is named UNKNOWN_MODEL in what
        every listener writes (spans, access lines, usage, the usage stream), as in /metrics:
        a name the client chose is never kept as a label of its own."""
        if rec.endpoint is None and rec.cache != "hit" and not self.serves(rec.model):
            rec.model = UNKNOWN_MODEL

    def model_label(self, model: str) -> str:
        """What a live view shows of an arriving request's model (the usage stream's `start`)."""
        return model if self.serves(model) else UNKNOWN_MODEL

    def require_admin(self, scope: Scope, what: str) -> None:
        """Routes that show or change what every client shares: the admin key only, when keys
        are configured (`api.access.require_admin`)."""
        access.require_admin(self, scope, what)

    @cached_property
    def usage_stream(self) -> UsageStream:
        """The live usage events' hub (`GET /api/usage-stream`), made for its first reader."""
        from ..ops.usage.stream import UsageStream, snapshot_of

        return UsageStream(
            self.events,
            lambda: snapshot_of(self.store, self.endpoints, self.metrics),
            self.require_admin,
            self.model_label,
        )

    async def start(self) -> None:
        await self.store.start()
        if self.usage is not None:
            await self.usage.start()
        if self.cache is not None:
            await self.cache.start()
        self.loop_lag.start()
        self.descriptor_watch.start()
        self.rate_limits.start()
        if self.gc is not None:
            self.gc.start()
        if self.tracer is not None:
            self.tracer.start()
        await self.discovery.start()  # (models and context windows known before serving)
        if any(e.kv_events for e in self.config.endpoints):
            from ..routing import kv_events

            self.kv_tasks, self.kv_states = kv_events.start(self.config.endpoints, self.scheduler.policy)
        if self.batches is not None:  # (after discovery: its lines need the models known)
            await self.batches.start()
        self.history.start()
        for ep in self.endpoints:
            log.info(
                "endpoint %s (%s): %d slots, healthy=%s, models=%s",
                ep.name,
                ep.type,
                ep.slots,
                self.store.is_healthy(ep),
                sorted(ep.models.values()),
            )

    async def close(self) -> None:
        await self.history.stop()
        self.metrics.flush()  # (under several workers, counts wait up to 20 ms to be handed on)
        for task in self.kv_tasks:
            task.cancel()
        if self.batches is not None:  # (its lines in flight stay queued: run again at the next start)
            await self.batches.close()
        await self.discovery.stop()
        if self.windows is not None:
            self.windows.close()
        await self.loop_lag.stop()
        await self.descriptor_watch.stop()
        await self.rate_limits.stop()
        if self.gc is not None:
            self.gc.stop()
        if self.usage is not None:
            await self.usage.close()
        if self.cache is not None:
            await self.cache.close()
        self.upstream.close()
        if self.tracer is not None:  # (what is left is sent, within a second)
            await asyncio.to_thread(self.tracer.close)
        await self.manage_session.close()
        await self.store.close()


def cache_if_on(config: RouterConfig, router: Router) -> ResponseCache | None:
    """The response cache, its modules imported only when it is on."""
    if not config.cache.enabled:
        return None
    from ..cache.routes import make_cache as make

    return make(config, router.events, router)


def make_batches(config: RouterConfig, router: Router) -> Batches | None:
    """The Batch API, its modules imported only when it is on."""
    if not config.batch.enabled:
        return None
    from ..batch.service import Batches

    assert router.proxy is not None
    return Batches(
        config,
        router.proxy.forward,
        router.store,
        lambda: router.endpoints,
        router.events,
        lambda client: router.rate_limits.by_client.get(client),
        lambda client: next((c.models for c in router.config.client_keys if c.name == client), None),
    )


def share_index(policy: Policy, store: StateStore) -> None:
    """Every worker and instance learns what the others routed where, so they all route
    from the same prefix index (it converges within one message, not by chance). The one
    link made after construction, and on purpose: the policy and the store need each other
    (the workers' shared store takes the policy's choice, `picker`; the index publishes
    through the store), so one of them must learn of the other once both exist."""
    index = getattr(policy, "index", None)
    if index is None:
        return
    index.publish = lambda endpoint, keys: store.publish("prefix", [endpoint, keys])

    def received(data: object) -> None:  # [endpoint, keys], from another worker or instance
        if isinstance(data, list) and len(data) == 2 and isinstance(data[0], str) and isinstance(data[1], list):
            index.apply(data[0], data[1])

    store.subscribe("prefix", received)


def make_store(config: RouterConfig, endpoints: list[Endpoint], policy: Policy) -> StateStore:
    """`auto`: in-memory for one process (the fast path), shared when uvicorn runs workers."""
    mode = config.state
    if mode == "auto":
        mode = "shared" if multiprocessing.parent_process() is not None else "memory"
    budgets = budget_source(config)  # what the token budgets spent before this process
    if mode == "memory":
        return MemoryStore(config.max_queue, config.affinity_ttl, config.affinity_max_pins, budgets)
    if mode == "shared":
        from ..state.worker_store import WorkerStore

        return WorkerStore(
            shared_state_path(),
            endpoints,
            config.max_queue,
            config.affinity_ttl,
            config.affinity_max_pins,
            picker(policy),
            budgets,
        )
    from ..state.redis import RedisStore

    local = None
    if multiprocessing.parent_process() is not None:  # workers: one table while Redis is away
        from ..state.redis_local import HostTable

        local = HostTable(
            shared_state_path(),
            endpoints,
            config.max_queue,
            config.affinity_ttl,
            config.affinity_max_pins,
            picker(policy),
        )
    return RedisStore(mode, endpoints, config, local)


def shared_state_path() -> str:
    """Where the workers of one master meet (see `state/private.py`): private to this user."""
    return private.shared_state_path(os.getppid(), os.environ.get(CONFIG_ENV, "config.yaml"))
