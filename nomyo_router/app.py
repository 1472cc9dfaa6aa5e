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

from . import generation
from .api import access, key_admission, listing
from .api.errors import ApiError
from .api.requests import GENERATION_ROUTES
from .config import RouterConfig
from .events import RequestRecord
from .ops.metrics import CONTENT_TYPE as METRICS_TYPE
from .relay.exchange import Exchange
from .runtime import lifespan
from .runtime.handlers import Handlers, Route
from .runtime.router import Router
from .server.asgi import BODY_WRITER, Receive, Scope, Send, header, read_body, send_response, with_headers

log = logging.getLogger("nomyo_router")
PROBE_TYPE = b"text/plain; charset=utf-8"


_request_ids = itertools.count(1)
_id_prefix = f"{os.getpid():x}-"
# A client's X-Request-ID is kept only when it is 1-128 printable ASCII characters without
# spaces: it is echoed in a response header and written in the access log, where spaces,
# control characters or non-ASCII bytes could forge fields or lines. Else one is made up.
_GIVEN_ID = re.compile(rb"[\x21-\x7e]{1,128}")


def next_request_id() -> str:
    """Unique within this process and across workers (the pid is part of it); cheap."""
    return _id_prefix + str(next(_request_ids))


# A route: it answers through the request's Exchange (`ex.send` for routes off the generation path).
Handler = Callable[["RouterApp", Scope, Receive, Exchange, float], Awaitable[None]]


class RouterApp:
    def __init__(self, config: RouterConfig | None = None) -> None:
        self._config = config
        self.router: Router | None = None
        self.running: lifespan.Running | None = None  # the router with its reloads and operator routes

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
                self.running, self.router = started, started.router
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await lifespan.shutdown(self.running)
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ---- HTTP ---------------------------------------------------------------
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every request: its record and its Exchange are made here, as it is read, and the
        Exchange's `run` finishes it once, whatever answers it (a refusal at the door, a route,
        an error, a client that left)."""
        t0 = time.perf_counter()
        path: str = scope["path"]
        api = ("anthropic" if path.startswith("/v1/messages") else "openai") if path.startswith("/v1/") else "ollama"
        method = scope["method"]
        handler = ROUTES.get((method, path))
        route = path
        if handler is None:
            handler, route = prefix_route(method, path)
        router = self.router
        given = header(scope, b"x-request-id")
        rid = given.decode("ascii") if given is not None and _GIVEN_ID.fullmatch(given) else next_request_id()
        rec = RequestRecord(rid, api, route, "", False)
        # (the writer is popped from the scope: no reference cycle through it)
        ex = Exchange(send, rec, t0, router.events if router is not None else None, scope.pop(BODY_WRITER, None))
        if handler is not RouterApp.generate:
            ex.quiet = True  # (recorded only when refused)
        elif router is not None and router.tracer is not None:  # (a refusal at the door has its span too)
            router.tracer.begin(rec, scope, GENERATION_ROUTES[path][1], "", t0)
        await ex.run(self._serve(scope, receive, ex, handler, t0))

    async def _serve(self, scope: Scope, receive: Receive, ex: Exchange, handler: Handler | None, t0: float) -> None:
        """Admission at the door (Host, origin, key), then the route."""
        router = self.router
        if router is not None:
            send, preflight = self._admit(scope, ex.send)
            if send is not ex.send:
                ex.through(send)
            if preflight is not None:
                await send_response(ex.send, 204, b"", headers=access.preflight_headers(preflight))
                return
            client = scope.get("nomyo.client")
            if client is not None:
                ex.rec.client = client.name
                if handler is not RouterApp.generate:
                    rate_limits = router.rate_limits
                    if client.name in rate_limits.by_client:  # counted when it reaches a backend, if it does
                        scope[key_admission.COUNT] = rate_limits.counter(client.name, scope)
                        ex.through(key_admission.answered_with_headers(scope, ex.send))
        if handler is None:
            path = scope["path"]
            if any(p == path for _, p in ROUTES) or any(path.startswith(p) for _, p, _ in PREFIX_ROUTES):
                raise ApiError(405, f"method {scope['method']} not allowed on {path}")
            raise ApiError(404, f"no route for {scope['method']} {path}")
        await handler(self, scope, receive, ex, t0)

    def _admit(self, scope: Scope, send: Send) -> tuple[Send, bytes | None]:
        """Origin and client key, before any route runs. Returns the `send` to use (with CORS
        headers for an allowed browser origin), and the origin when this is a CORS preflight."""
        router = self.router
        assert router is not None
        keys = router.keys
        if keys is None or not keys.required:  # an open router: only Host names a local client uses
            host = header(scope, b"host")
            if host is not None and not router.hosts.allowed(host):
                raise ApiError(
                    421,
                    f"this router does not answer for Host {host[:256].decode('latin-1')!r}; "
                    "add the name to allowed_hosts, or configure client keys",
                )
        origin, key = access.inspect(scope["headers"])
        if origin is not None:
            if not router.origins.allowed(origin.decode("latin-1")):
                raise ApiError(403, f"origin {origin.decode('latin-1')!r} is not allowed; add it to allowed_origins")
            if scope["method"] == "OPTIONS":
                return send, origin
            send = with_headers(scope, send, access.cors_headers(origin))
        path = scope["path"]
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

    async def generate(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        """The generation routes (`generation.py`); 503 while starting."""
        await generation.generate(self.router or self.current(), scope, receive, ex, t0)

    async def show(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        router = self._router()
        raw = await read_body(scope, receive, router.config.max_body_bytes)
        status, body = await listing.show(
            raw,
            router.endpoints,
            router.store,
            router.upstream,
            listing.visible_to(scope.get("nomyo.client")),
            lambda: key_admission.count(scope),
        )
        await send_response(ex.send, status, body)

    async def listing(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        router = self._router()
        eps = router.endpoints
        if scope["path"] == "/api/ps" and router.discovery is not None:
            await key_admission.count(scope)  # (it asks the backends: a limited key's rpm)
            await router.discovery.fresh_ps()  # what is loaded changes by the second
        if scope["path"] == "/api/version":
            body = listing.version(eps)
        else:  # a key limited to some models sees only those
            body = {"/api/tags": listing.tags, "/api/ps": listing.ps, "/v1/models": listing.openai_models}[
                scope["path"]
            ](eps, listing.visible_to(scope.get("nomyo.client")))
        await send_response(ex.send, 200, body)

    async def health(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
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
        await send_response(ex.send, status, body)

    async def livez(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        """The process answers: a liveness probe (also while the router starts)."""
        await send_response(ex.send, 200, b"ok\n", PROBE_TYPE)

    async def readyz(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        """Started and at least one backend healthy: a readiness probe. Nothing else is shown."""
        router = self.router
        ok = router is not None and listing.ready(router.endpoints, router.store)
        await send_response(ex.send, 200 if ok else 503, b"ok\n" if ok else b"not ready\n", PROBE_TYPE)

    async def model(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        status, body = listing.openai_model(
            self._router().endpoints, scope["path"][len("/v1/models/") :], listing.visible_to(scope.get("nomyo.client"))
        )
        await send_response(ex.send, status, body)

    async def metrics(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        await send_response(ex.send, 200, self._router().metrics.render(), METRICS_TYPE)

    async def root(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        await send_response(ex.send, 200, b"Ollama is running", b"text/plain; charset=utf-8")

    async def favicon(self, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        """No icon: a browser's automatic ask (the dashboard's) is answered, not a 404 to count."""
        await send_response(ex.send, 204, b"", b"image/x-icon")

    def _router(self) -> Router:
        return self.current()

    def handlers(self) -> Handlers:
        """The operator routes' handlers; 503 while starting."""
        if self.running is None:
            raise ApiError(503, "router is starting")
        return self.running.handlers

    def current(self) -> Router:
        """The running router; 503 while starting."""
        if self.router is None:
            raise ApiError(503, "router is starting")
        return self.router


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
        ("GET", "/livez"): RouterApp.livez,
        ("HEAD", "/livez"): RouterApp.livez,
        ("GET", "/readyz"): RouterApp.readyz,
        ("HEAD", "/readyz"): RouterApp.readyz,
        ("GET", "/metrics"): RouterApp.metrics,
        ("GET", "/"): RouterApp.root,
        ("GET", "/favicon.ico"): RouterApp.favicon,
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

    async def handler(app: RouterApp, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
        await pick(app.handlers())(scope, receive, ex.send)

    return handler


async def dashboard_page(app: RouterApp, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
    """The dashboard's page is static and open: served while the router starts too."""
    from .ops.dashboard import dashboard

    await dashboard(scope, receive, ex.send)


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


def prefix_route(method: str, path: str) -> tuple[Handler | None, str]:
    """The route for a path with a parameter, and its prefix (what records name it by: never
    the client's path, which is any string); (None, "") when none matches."""
    for m, prefix, handler in PREFIX_ROUTES:
        if m == method and path.startswith(prefix) and len(path) > len(prefix):
            return handler, prefix
    return None, ""


app = RouterApp()
