"""The ASGI application: where a request enters.

`uvicorn nomyo_router.app:app` serves it; the config path comes from
NOMYO_ROUTER_CONFIG (default ./config.yaml). Everything long-lived (config, upstream client,
state store, scheduler, discovery) is built in the lifespan and held by `Router`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn

from .api import access, listing, manage
from .api import status as ollama_status
from .api.asgi import (
    BODY_WRITER,
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    cancel_on_disconnect,
    header,
    read_body,
    send_response,
    with_headers,
)
from .api.errors import ApiError, error_body, render
from .api.fairness import ClientLimits
from .api.ratelimits import SCOPE_KEY as RATELIMIT_HEADERS
from .api.ratelimits import RateLimits
from .api.requests import GENERATION_ROUTES, parse
from .cache import hook as response_cache
from .cache import routes as cache_routes
from .config import CONFIG_ENV, ConfigError, RouterConfig, load_config
from .domain import Endpoint, model_key
from .events import Events, RequestRecord
from .forward import moe, overflow
from .forward.exchange import Exchange, Handle
from .forward.proxy import Proxy
from .ops import dashboard, reload, tracing, usage_api, usage_stream
from .ops.accesslog import AccessLog
from .ops.metrics import CONTENT_TYPE as METRICS_TYPE
from .ops.metrics import Metrics, state_gauges
from .ops.usage_store import make_usage
from .routing import kv_events
from .routing.context import TooLong, Windows
from .routing.policies import Policy, make_policy, picker
from .routing.scheduler import Scheduler
from .state import MemoryStore, QueueFull, SharedStore, StateStore, private
from .state.fair import specs_of
from .upstream.discovery import Discovery
from .upstream.gcpace import GcPace
from .upstream.health import Health
from .upstream.looplag import LoopLag
from .upstream.session import ManageSession
from .upstream.unload import is_unload, unload

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
        )
        self.scheduler.fair = specs_of(config.client_keys)  # priorities and fair shares of the queue
        self.session_header = config.session_header.lower().encode("latin-1")
        self.events = Events()
        self.client_limits = ClientLimits(access.caps_of(config), self.store, config.max_queue)
        self.rate_limits = RateLimits(config, self.store, self.events)  # rpm, tpm, tokens_per_day
        self.keys = access.keys_of(config)
        self.origins = access.Origins(config.allowed_origins)
        self.loop_lag = LoopLag()
        # full collections on a timer, not by growth (thousands of open streams)
        self.gc = GcPace(config.gc_full_interval) if config.gc_full_interval else None
        self.metrics = Metrics(
            self.events,
            lambda: [*state_gauges(self.endpoints, self.store, self.loop_lag), *self.rate_limits.gauges()],
            self.serves,
        )
        self.history = dashboard.history_for(self.metrics)  # the dashboard's last hour, sampled on a timer
        self.access_log = AccessLog(self.events, config.log_format) if config.access_log else None
        self.usage = make_usage(self.events, config.usage_db, config.state, config.redis_timeout)
        self.cache = cache_routes.make_cache(config, self.events, self)  # the response cache; None: off
        self.ensemble = moe.Ensemble(self)  # moe-<model> requests
        self.usage_stream = usage_stream.UsageStream(self.events, lambda: usage_stream.snapshot_of(self))
        self.health = Health(self.endpoints, self.store, self.events, config, self.loop_lag)
        # the one client of every upstream call but model management (traced when tracing is on)
        self.tracer, self.upstream = tracing.make(config, self.events)
        self.manage_session = ManageSession(config)  # aiohttp, made when first needed
        self.discovery: Discovery | None = None
        # context-length-aware routing (None: context_routing off)
        self.windows = (
            Windows(config.context_routing, self.upstream, lambda: self.endpoints)
            if config.context_routing != "off"
            else None
        )
        self.proxy: Proxy | None = None
        self.kv_tasks: list[asyncio.Task[None]] = []  # precise mode: KV-event subscribers
        self.kv_states: dict[str, kv_events.KVEventState] = {}

    def serves(self, model: str) -> bool:
        key = model_key(model)
        return any(ep.serves(key) for ep in self.endpoints)

    async def start(self) -> None:
        await self.store.start()
        if self.usage is not None:
            await self.usage.start()
        if self.cache is not None:
            await self.cache.start()
        self.loop_lag.start()
        self.rate_limits.start()
        if self.gc is not None:
            self.gc.start()
        if self.tracer is not None:
            self.tracer.exporter.start()
        self.proxy = Proxy(self.scheduler, self.upstream, self.store, self.config, self.events, self.health)
        self.discovery = Discovery(self.endpoints, self.upstream, self.store, self.scheduler, self.config, self.health)
        await self.discovery.start()
        if self.windows is not None:
            self.windows.start()
        self.proxy.rediscover = self.discovery.refresh_now
        self.kv_tasks, self.kv_states = kv_events.start(self.config.endpoints, self.scheduler.policy)
        reload.install(self)
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
        reload.uninstall()
        await self.history.stop()
        self.metrics.flush()  # (under several workers, counts wait up to 20 ms to be handed on)
        for task in self.kv_tasks:
            task.cancel()
        if self.discovery:
            await self.discovery.stop()
        if self.windows is not None:
            await self.windows.stop()
        await self.loop_lag.stop()
        await self.rate_limits.stop()
        if self.gc is not None:
            self.gc.stop()
        if self.usage is not None:
            await self.usage.close()
        if self.cache is not None:
            await self.cache.close()
        self.upstream.close()
        if self.tracer is not None:  # (what is left is sent, within a few seconds)
            await asyncio.to_thread(self.tracer.close)
        await self.manage_session.close()
        await self.store.close()


def share_index(policy: Policy, store: StateStore) -> None:
    """Every worker and instance learns what the others routed where, so they all route
    from the same prefix index (it converges within one message, not by chance)."""
    index = getattr(policy, "index", None)
    if index is None:
        return
    index.publish = lambda endpoint, keys: store.publish("prefix", [endpoint, keys])
    store.subscribe("prefix", lambda data: index.apply(data[0], data[1]))


def make_store(config: RouterConfig, endpoints: list[Endpoint], policy: Policy) -> StateStore:
    """`auto`: in-memory for one process (the fast path), shared when uvicorn runs workers."""
    mode = config.state
    if mode == "auto":
        mode = "shared" if multiprocessing.parent_process() is not None else "memory"
    if mode == "memory":
        return MemoryStore(config.max_queue, config.affinity_ttl, config.affinity_max_pins)
    if mode == "shared":
        return SharedStore(
            shared_state_path(),
            endpoints,
            config.max_queue,
            config.affinity_ttl,
            config.affinity_max_pins,
            picker(policy),
        )
    from .state.redis import RedisStore

    return RedisStore(mode, endpoints, config)


def shared_state_path() -> str:
    """Where the workers of one master meet (see `state/private.py`): private to this user."""
    return private.shared_state_path(os.getppid(), os.environ.get(CONFIG_ENV, "config.yaml"))


_request_ids = itertools.count(1)
_id_prefix = f"{os.getpid():x}-"
# A client's X-Request-ID is kept only when it is 1-128 printable ASCII characters without
# spaces: it is echoed in a response header and written in the access log, where spaces,
# control characters or non-ASCII bytes could forge fields or lines. Else one is made up.
_GIVEN_ID = re.compile(rb"[\x21-\x7e]{1,128}")


def next_request_id() -> str:
    """Unique within this process and across workers (the pid is part of it); cheap."""
    return _id_prefix + str(next(_request_ids))


Handler = Callable[["RouterApp", Scope, Receive, Send, float], Awaitable[None]]


class RouterApp:
    def __init__(self, config: RouterConfig | None = None) -> None:
        self._config = config
        self.router: Router | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "websocket":  # no WebSocket routes: refused before accepting (HTTP 403)
            await receive()
            await send({"type": "websocket.close", "code": 1008})

    # ---- lifespan -----------------------------------------------------------
    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    config = self._config or load_config(os.environ.get(CONFIG_ENV, "config.yaml"))
                    self.router = Router(config)
                    await self.router.start()
                except ConfigError as e:
                    print(f"nomyo-router: bad config: {e}", file=sys.stderr, flush=True)
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                except Exception as e:  # start-up must fail loudly, never half-start
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": f"{type(e).__name__}: {e}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self.router:
                    await self.router.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ---- HTTP ---------------------------------------------------------------
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        path: str = scope["path"]
        api = ("anthropic" if path.startswith("/v1/messages") else "openai") if path.startswith("/v1/") else "ollama"
        handler = ROUTES.get((scope["method"], path)) or prefix_route(scope["method"], path)
        try:
            if self.router is not None:
                send, preflight = self._admit(scope, send)
                if preflight is not None:
                    await send_response(send, 204, b"", headers=access.preflight_headers(preflight))
                    return
            if handler is None:
                if any(p == path for _, p in ROUTES) or any(path.startswith(p) for _, p, _ in PREFIX_ROUTES):
                    raise ApiError(405, f"method {scope['method']} not allowed on {path}")
                raise ApiError(404, f"no route for {scope['method']} {path}")
            await handler(self, scope, receive, send, t0)
        except ApiError as e:
            status, body, headers = render(api, e)
            if RATELIMIT_HEADERS in scope:  # a limited key's request, admitted, then refused
                headers += scope[RATELIMIT_HEADERS]
            await send_response(send, status, body, headers=headers)
        except BodyTooLarge:
            limit = self.router.config.max_body_bytes if self.router else 0
            await send_response(send, 413, error_body(api, 413, f"request body exceeds {limit} bytes"))
        except ClientGone:
            return

    def _admit(self, scope: Scope, send: Send) -> tuple[Send, bytes | None]:
        """Origin and client key, before any route runs. Returns the `send` to use (with CORS
        headers for an allowed browser origin), and the origin when this is a CORS preflight."""
        router = self.router
        assert router is not None
        origin, key = access.inspect(scope["headers"])
        if origin is not None:
            if not router.origins.allowed(origin.decode("latin-1")):
                raise ApiError(403, f"origin {origin.decode('latin-1')!r} is not allowed; add it to allowed_origins")
            if scope["method"] == "OPTIONS":
                return send, origin
            send = with_headers(scope, send, access.cors_headers(origin))
        keys, path = router.keys, scope["path"]
        if keys is None:
            return send, None
        if path in access.OPERATOR_PATHS:
            client = keys.check(key)
            if client is None and (key is not None or path != "/dashboard"):  # (the page is static)
                raise ApiError(
                    401,
                    f"{path} needs the admin or metrics key (Authorization: Bearer KEY)"
                    if key is None
                    else "invalid API key",
                )
            if client is not None and not client.operator:
                raise ApiError(
                    403, f"{path} shows every client's traffic: it needs the admin or metrics key, not a client key"
                )
        elif path not in access.OPEN_PATHS:
            client = keys.check(key)
            if client is None and keys.required:
                raise ApiError(
                    401,
                    "a valid API key is required (Authorization: Bearer KEY or x-api-key)"
                    if key is None
                    else "invalid API key",
                )
            if client is not None and client.role == "metrics":
                raise ApiError(403, "the metrics key only reads /metrics, /dashboard/data and /health")
            scope["nomyo.client"] = client
        return send, None

    async def generate(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        router = self._router()
        client = scope.get("nomyo.client")
        if client is not None and router.client_limits.full(client.name):
            _refuse_full(router.config)  # before its body is read: a flood from one key buffers nothing
        if client is not None and client.name in router.rate_limits.by_client:  # (429 before its body is read)
            send = await router.rate_limits.admit(client.name, scope, send)
        raw = await read_body(scope, receive, router.config.max_body_bytes)
        req = parse(scope["path"], raw, t0)
        ensemble = req.model.startswith(moe.PREFIX)  # NOMYO's moe-<model>: <model>'s best of several answers
        if ensemble:
            moe.prepare(req)
        if client is not None:
            if not client.may_use(req.key):
                raise ApiError(403, f"this API key may not use model '{req.model}'")
            req.client = client.name
        if router.windows is not None and req.ctype is None:  # longer than some endpoint's context window?
            try:
                req.too_small = router.windows.check(req, router.endpoints)
            except TooLong as e:  # (context_routing: reject, and no endpoint's window fits)
                raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from None
        if is_unload(req.kind, req.api, req.body):  # `ollama stop`: every endpoint that has it loaded
            assert router.discovery is not None
            await router.discovery.fresh_ps(max_age=0.0)  # a model loaded a moment ago must be unloaded too
            status, body = await unload(router.upstream, router.endpoints, req.path, req.key, raw)
            await send_response(send, status, body)
            return
        sid = header(scope, router.session_header)
        if sid:
            req.session_id = sid.decode("latin-1")
        assert router.proxy is not None
        given = header(scope, b"x-request-id")
        rid = given.decode("ascii") if given is not None and _GIVEN_ID.fullmatch(given) else next_request_id()
        rec = RequestRecord(rid, req.api, req.path, req.model, req.stream, req.client)
        if router.tracer is not None:
            router.tracer.begin(rec, scope, req.kind, req.key, t0)
        # The one way out of this request's answer, and its one completion point (`finish`).
        # (the writer is popped from the scope: no reference cycle through it)
        ex = Exchange(send, rec, t0, router.events, scope.pop(BODY_WRITER, None))
        handle: Handle = router.ensemble.handle if ensemble else router.proxy.forward
        if router.config.context_overflow == "trim":  # a chat too long for the model: its oldest turns go
            handle = overflow.wrap(handle, router.events)
        if router.cache is not None or "nomyo" in req.body:  # the response cache; NOMYO's body field
            handle = response_cache.handler(router.cache, scope, req, handle)
        router.events.request_started(rec)  # (no listener unless /api/usage-stream is read)
        limits = router.client_limits
        held: list[str] = []  # the client whose permit this request holds, once it has one
        try:
            if limits.capped(req.client) and not ensemble:  # (an ensemble's steps each take a permit)
                await cancel_on_disconnect(_enter(limits, req.client, router.config, held), receive, scope)
                if not held:
                    return  # the client left while waiting for its permit
            await cancel_on_disconnect(handle(req, ex), receive, scope)
        except ApiError as e:  # in the caller's API shape, through the exchange
            await ex.fail(e)
        finally:
            if held:
                limits.leave(held[0])
            ex.finish()

    async def show(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        router = self._router()
        raw = await read_body(scope, receive, router.config.max_body_bytes)
        status, body = await listing.show(
            raw, router.endpoints, router.store, router.upstream, listing.visible_to(scope.get("nomyo.client"))
        )
        await send_response(send, status, body)

    async def listing(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        router = self._router()
        eps = router.endpoints
        if scope["path"] == "/api/ps" and router.discovery is not None:
            await router.discovery.fresh_ps()  # what is loaded changes by the second
        if scope["path"] == "/api/version":
            body = listing.version(eps)
        else:  # a key limited to some models sees only those
            body = {"/api/tags": listing.tags, "/api/ps": listing.ps, "/v1/models": listing.openai_models}[
                scope["path"]
            ](eps, listing.visible_to(scope.get("nomyo.client")))
        await send_response(send, 200, body)

    async def health(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        """Anyone may ask whether the router is up; with keys configured, only an operator key
        (admin or metrics) sees the details: endpoints, models, counters."""
        router = self._router()
        client = router.keys.check(access.inspect(scope["headers"])[1]) if router.keys is not None else None
        status, body = await listing.health(
            router.endpoints,
            router.store,
            router.health,
            details=router.keys is None or (client is not None and client.operator),
        )
        await send_response(send, status, body)

    async def model(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        status, body = listing.openai_model(
            self._router().endpoints, scope["path"][len("/v1/models/") :], listing.visible_to(scope.get("nomyo.client"))
        )
        await send_response(send, status, body)

    async def metrics(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        await send_response(send, 200, self._router().metrics.render(), METRICS_TYPE)

    async def root(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        await send_response(send, 200, b"Ollama is running", b"text/plain; charset=utf-8")

    def _router(self) -> Router:
        return self.current()

    def current(self) -> Router:
        """The running router, for handlers in other modules; 503 while starting."""
        if self.router is None:
            raise ApiError(503, "router is starting")
        return self.router


async def _enter(limits: ClientLimits, client: str, config: RouterConfig, held: list[str]) -> None:
    try:
        await limits.enter(client, config.queue_timeout)
        held.append(client)
    except TimeoutError:
        raise ApiError(
            503,
            f"no slot became free within queue_timeout ({config.queue_timeout:g}s)",
            code="queue_timeout",
            retry_after=config.retry_after,
        ) from None
    except QueueFull:
        _refuse_full(config)


def _refuse_full(config: RouterConfig) -> NoReturn:
    raise ApiError(
        503,
        "server busy, please try again: the router's queue is full",
        code="queue_full",
        retry_after=config.retry_after,
    )


ROUTES: dict[tuple[str, str], Handler] = {("POST", p): RouterApp.generate for p in GENERATION_ROUTES}
ROUTES.update(
    {
        ("POST", "/api/show"): RouterApp.show,
        ("GET", "/api/tags"): RouterApp.listing,
        ("GET", "/api/ps"): RouterApp.listing,
        ("GET", "/api/version"): RouterApp.listing,
        ("HEAD", "/api/version"): RouterApp.listing,
        ("HEAD", "/api/tags"): RouterApp.listing,
        ("GET", "/v1/models"): RouterApp.listing,
        ("GET", "/health"): RouterApp.health,
        ("GET", "/metrics"): RouterApp.metrics,
        ("GET", "/"): RouterApp.root,
        ("HEAD", "/"): RouterApp.root,
    }
)
# Routes whose path carries a parameter: (method, prefix, handler), first match wins.
PREFIX_ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/v1/models/", RouterApp.model),
    ("HEAD", "/v1/models/", RouterApp.model),
]
ROUTES.update(usage_api.ROUTES)
ROUTES.update(reload.ROUTES)
ROUTES.update(dashboard.ROUTES)
# New capabilities register their routes here from their own module (one line each), e.g.
# `ROUTES.update(manage.ROUTES)`; a handler is `async def h(app: RouterApp, scope, receive, send, t0)`
# and reaches the running router through `app.current()`.
ROUTES.update(manage.ROUTES)
PREFIX_ROUTES.extend(manage.PREFIX)  # noqa: E702
ROUTES.update(ollama_status.ROUTES)
ROUTES.update(cache_routes.ROUTES)
ROUTES.update(usage_stream.ROUTES)


def prefix_route(method: str, path: str) -> Handler | None:
    for m, prefix, handler in PREFIX_ROUTES:
        if m == method and path.startswith(prefix) and len(path) > len(prefix):
            return handler
    return None


app = RouterApp()
