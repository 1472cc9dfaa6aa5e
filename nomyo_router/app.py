"""The ASGI application: where a request enters.

`uvicorn nomyo_router.app:app` serves it; the config path comes from
NOMYO_ROUTER_CONFIG (default ./config.yaml). Everything long-lived (config, upstream client,
state store, scheduler, discovery) is built in the lifespan and held by `Router`
(`runtime/`); the routes off the request path reach only what their handler objects were
given (`runtime/handlers.py`), built and imported on first use.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn

from .api import access, listing
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
from .api.ratelimits import reservation
from .api.requests import GENERATION_ROUTES, parse
from .cache import hook as response_cache
from .config import RouterConfig
from .events import RequestRecord
from .forward import moe, overflow
from .forward.exchange import Exchange, Handle
from .ops.metrics import CONTENT_TYPE as METRICS_TYPE
from .routing.context import TooLong
from .runtime import lifespan
from .runtime.handlers import Handlers, Route
from .runtime.router import Router
from .state import QueueFull
from .upstream.unload import is_unload, unload

log = logging.getLogger("nomyo_router")


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
                started = await lifespan.startup(self._config)
                if isinstance(started, str):
                    await send({"type": "lifespan.startup.failed", "message": started})
                    return
                self.router = started
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await lifespan.shutdown(self.router)
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
        router = self.router or self.current()  # (503 while starting)
        client = scope.get("nomyo.client")
        if client is not None and router.client_limits.full(client.name):
            _refuse_full(router.config)  # before its body is read: a flood from one key buffers nothing
        rate_limits = router.rate_limits
        if client is not None and client.name in rate_limits.by_client:  # (429 before its body is read)
            send = await rate_limits.admit(client.name, scope, send)
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
            except TooLong as too_long:  # (context_routing: reject, and no endpoint's window fits)
                raise ApiError(400, str(too_long), param="messages", code="context_length_exceeded") from None
        unloading = is_unload(req.kind, req.api, req.body)
        reserved = None  # a token budget's reservation: what this request may spend (settled at its end)
        if client is not None and rate_limits.budgeted(client.name):
            send, reserved = await rate_limits.reserve(client.name, 0 if unloading else reservation(req), scope, send)
        if unloading:  # `ollama stop`: every endpoint that has it loaded
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
        rec.reserved = reserved
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
        except BaseException:  # a bug, or the server cancelling the task: a 500 if nothing was sent
            ex.finish(failed=True)
            raise
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
        """The running router; 503 while starting."""
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


def operator(pick: Callable[[Handlers], Route]) -> Handler:
    """A route off the request path: its handler object is built, and its module imported,
    the first time the route is asked (`runtime/handlers.py`)."""

    async def handler(app: RouterApp, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        await pick(app.current().handlers)(scope, receive, send)

    return handler


async def dashboard_page(app: RouterApp, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    """The dashboard's page is static and open: served while the router starts too."""
    from .ops.dashboard import dashboard

    await dashboard(scope, receive, send)


_manage = operator(lambda h: h.manager.manage)
ROUTES.update(
    {
        ("GET", "/dashboard"): dashboard_page,
        ("GET", "/dashboard/data"): operator(lambda h: h.dashboard.data),
        ("GET", "/api/usage"): operator(lambda h: h.usage.usage_report),
        ("GET", "/api/usage-stream"): operator(lambda h: h.usage_stream.route),
        ("POST", "/admin/reload"): operator(lambda h: h.reload.admin_reload),
        ("GET", "/api/cache/stats"): operator(lambda h: h.cache.stats),
        ("POST", "/api/cache/clear"): operator(lambda h: h.cache.clear),
        ("GET", "/api/status"): operator(lambda h: h.status.status),
        ("POST", "/api/pull"): _manage,
        ("POST", "/api/push"): _manage,
        ("POST", "/api/create"): _manage,
        ("POST", "/api/copy"): _manage,
        ("DELETE", "/api/delete"): _manage,
        ("POST", "/v1/files"): operator(lambda h: h.batch.file_create),
        ("GET", "/v1/files"): operator(lambda h: h.batch.file_list),
        ("POST", "/v1/batches"): operator(lambda h: h.batch.batch_create),
        ("GET", "/v1/batches"): operator(lambda h: h.batch.batch_list),
    }
)
PREFIX_ROUTES.extend(
    [
        ("HEAD", "/api/blobs/", operator(lambda h: h.blobs.head)),
        ("POST", "/api/blobs/", operator(lambda h: h.blobs.post)),
        ("GET", "/v1/files/", operator(lambda h: h.batch.file_get)),
        ("DELETE", "/v1/files/", operator(lambda h: h.batch.file_delete)),
        ("GET", "/v1/batches/", operator(lambda h: h.batch.batch_get)),
        ("POST", "/v1/batches/", operator(lambda h: h.batch.batch_cancel)),
    ]
)


def prefix_route(method: str, path: str) -> Handler | None:
    for m, prefix, handler in PREFIX_ROUTES:
        if m == method and path.startswith(prefix) and len(path) > len(prefix):
            return handler
    return None


app = RouterApp()
