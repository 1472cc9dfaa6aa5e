"""The generation routes' way in, after the door (`app.py`): admission, then the handler chain.

The door made the request's record and Exchange and checked its Host, origin and key; here a
generation request is admitted — its key's cap, rpm and token budgets (`api/key_admission.py`,
a refusal before the body is read where it can be), its body (bounded, charged to the bytes
held while queued) and its parse, the models its key may use, the context window — and
handed to the handler chain: the ensemble or the proxy, wrapped by trim-and-retry and the
response cache. Every refusal is an ApiError, which the Exchange answers in the caller's API
shape and records like any request.
"""

from __future__ import annotations

from typing import NoReturn

from .api.client_caps import ClientLimits
from .api.errors import ApiError
from .api.key_admission import reservation
from .api.requests import parse
from .backends.unload import is_unload, unload
from .cache import hook as response_cache
from .config import RouterConfig
from .forward import ensemble, overflow
from .relay.exchange import Exchange, Handle
from .routing.context_windows import TooLong
from .runtime.router import Router
from .server.asgi import Receive, Scope, cancel_on_disconnect, header, read_body
from .server.body_budget import OverBudget
from .state import QueueFull


async def generate(router: Router, scope: Scope, receive: Receive, ex: Exchange, t0: float) -> None:
    """A generation request after the door: admission (its key's cap and limits, its body and
    its parse, the models the key may use, the context window, the token reservation), then
    the handler chain — the ensemble or the proxy, trim-and-retry, the response cache — through
    its Exchange (which the door finishes)."""
    rec = ex.rec
    client = scope.get("nomyo.client")
    if client is not None and router.client_limits.full(client.name):
        _refuse_full(router.config)  # before its body is read: a flood from one key buffers nothing
    rate_limits = router.rate_limits
    limited = client is not None and client.name in rate_limits.by_client
    if client is not None and limited:  # (while its last count refused it: 429 before its body is read)
        rate_limits.still_refused(client.name)
    try:
        raw = await read_body(scope, receive, router.config.max_body_bytes, router.body_budget)
    except OverBudget:
        _refuse_full(router.config, "the bodies of the requests it holds reached max_queued_body_bytes")
    ex.queued = (router.body_budget, len(raw))  # its charge: given back when it holds a slot, or at its end
    req = parse(scope["path"], raw, t0)
    rec.model, rec.stream = req.model, req.stream
    of_ensemble = req.model.startswith(ensemble.PREFIX)  # NOMYO's moe-<model>: <model>'s best of several answers
    if of_ensemble:
        ensemble.prepare(req)
    if client is not None:
        if not client.may_use(req.key):
            raise ApiError(403, f"this API key may not use model '{req.model}'", code="forbidden_model")
        req.client, req.routing_headers = client.name, client.routing_headers
    if router.windows is not None and req.ctype is None:  # longer than some endpoint's context window?
        try:
            req.too_small = router.windows.check(req, router.endpoints)
        except TooLong as too_long:  # (context_routing: reject, and no endpoint's window fits)
            raise ApiError(400, str(too_long), param="messages", code="context_length_exceeded") from None
    unloading = is_unload(req.kind, req.api, req.body)
    if client is not None and limited:  # counted once nothing above refused it
        tokens = 0 if unloading or not rate_limits.budgeted(client.name) else reservation(req)
        send, rec.reserved = await rate_limits.reserve(client.name, tokens, scope, ex.send)
        ex.through(send)
    if unloading:  # `ollama stop`: every endpoint that has it loaded
        assert router.discovery is not None
        await router.discovery.fresh_ps(max_age=0.0)  # a model loaded a moment ago must be unloaded too
        status, body = await unload(router.upstream, router.endpoints, req.path, req.key, raw)
        await ex.whole(status, body, [], b"application/json")
        return
    sid = header(scope, router.session_header)
    if sid:
        req.session_id = sid.decode("latin-1")
    assert router.proxy is not None
    if router.tracer is not None:
        router.tracer.parsed(rec, req.kind, req.key, req.body)
    handle: Handle = router.ensemble.handle if of_ensemble else router.proxy.forward
    if router.config.context_overflow == "trim" and not of_ensemble:  # a chat too long: its oldest turns go
        bounds = overflow.Bounds(router.config.max_attempts, router.proxy.budget, router.charge)
        handle = overflow.wrap(handle, router.events, bounds)
    if router.cache is not None or "nomyo" in req.body:  # the response cache; NOMYO's body field
        handle = response_cache.handler(router.cache, scope, req, handle)
    router.events.request_started(rec)  # (no listener unless /api/usage-stream is read)
    limits = router.client_limits
    held: list[str] = []  # the client whose permit this request holds, once it has one
    try:
        if limits.capped(req.client) and not of_ensemble:  # (an ensemble's steps each take a permit)
            await cancel_on_disconnect(_enter(limits, req.client, router.config, held), receive, scope)
            if not held:
                return  # the client left while waiting for its permit
        if await cancel_on_disconnect(handle(req, ex), receive, scope):
            ex.client_left()
    finally:  # (the exchange is finished by its `run`, at the door, after this)
        if held:
            limits.leave(held[0])


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


def _refuse_full(config: RouterConfig, why: str = "the router's queue is full") -> NoReturn:
    raise ApiError(
        503,
        f"server busy, please try again: {why}",
        code="queue_full",
        retry_after=config.retry_after,
    )
