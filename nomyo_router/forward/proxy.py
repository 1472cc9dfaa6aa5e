"""Where a request leaves: take a slot, call the backend, relay the answer, retry if safe.

Pass-through (client API == what the backend speaks) forwards the client's bytes and
relays the backend's bytes untouched. Translation is used only for Ollama-API requests
to OpenAI-type backends. The answer leaves through the request's `Exchange`
(relay/exchange.py), which holds the slot taken here; `_attempt` picks the way out (a
`relay.base.Relay`, made once here) that writes it and hands it the answer (`Exchange.relay`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable

from .. import h1
from ..api import responses, route_types
from ..api.errors import ApiError, error_body
from ..api.requests import GenRequest
from ..backends.health import Health
from ..config import RouterConfig
from ..domain import Endpoint
from ..events import Events, RequestRecord
from ..h1.errors import ErrorRecord
from ..relay import error_record, token_counts, whole, whole_from_stream
from ..relay.assembled import Assembled
from ..relay.base import BackendAnswer, ReadyAnswer
from ..relay.continuation import resumable
from ..relay.deadline import Deadlines
from ..relay.exchange import FAILED, Exchange
from ..relay.passthrough import Passthrough
from ..relay.resumable import Resumer
from ..relay.retry import RETRY_STATUSES, RetryBudget, is_error_chunk
from ..relay.translated import Translated
from ..routing import affinity, prefix_index
from ..routing.policies import RouteContext
from ..routing.scheduler import Scheduler
from ..server.asgi import Headers, Send
from ..state import Lease, NoEndpoint, QueueFull, QueueTimeout, StateStore
from . import sent_body

log = logging.getLogger("nomyo_router.proxy")

# (the names as h1.Headers keeps them, lower-case: looked up with dict.get, no call of its own)
_FORWARDED = (("content-type", b"content-type"), ("content-encoding", b"content-encoding"))
# Errors meaning the backend could not be reached at all: it leaves rotation until a probe succeeds.
UNREACHABLE = h1.Unreachable


class RetryableFailure(Exception):
    """The attempt failed before any byte went to the client."""

    def __init__(
        self,
        reason: str,
        status: int | None = None,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        unreachable: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason, self.status, self.body, self.content_type = reason, status, body, content_type
        self.unreachable = unreachable


class Proxy:
    def __init__(
        self,
        scheduler: Scheduler,
        upstream: h1.Upstream,
        store: StateStore,
        config: RouterConfig,
        events: Events,
        health: Health,
        *,
        rediscover: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.events = events
        self.health = health
        self.budget = RetryBudget(config.retry_budget)
        self.deadlines = Deadlines(config.first_byte_floor, config.first_byte_factor, config.first_byte_timeout)
        # looks for models pulled or copied a moment ago (Discovery.refresh_now) before a 404
        self.rediscover: Callable[[], Awaitable[None]] = rediscover or _nothing
        self.resumer = (
            Resumer(
                scheduler,
                health,
                events,
                self._start_continuation,
                config.max_attempts,
                upstream if config.native_relay else None,
                config.max_record_bytes,
            )
            if config.resume_streams
            else None
        )
        self.upstream = upstream  # the process's one client (discovery and probes use it too)
        self.store = store
        self.config = config
        # Streams may idle for stream_idle_timeout between chunks; nothing of a whole
        # (non-stream) answer arrives before it is complete, so first_byte_timeout bounds it.
        self._stream_timeout = h1.Timeout(sock_connect=config.connect_timeout, sock_read=config.stream_idle_timeout)
        self._whole_timeout = h1.Timeout(sock_connect=config.connect_timeout, sock_read=config.first_byte_timeout)
        self._worker = (b"x-router-worker", str(os.getpid()).encode())
        self._wants_prompt = bool(getattr(scheduler.policy, "wants_prompt", False))
        self._assemble = config.stream_whole_answers  # (relay/assembled.py)
        # the ways out (relay/): one of each, chosen per answer by `_attempt`
        self._whole = whole.Whole()
        self._large = whole.Large(config, health)
        self._assembled = Assembled(self.resumer, (config.max_response_bytes, config.max_record_bytes))
        # (the compiled pump's client: None when off)
        self._passthrough = Passthrough(health, events, upstream if config.native_relay else None)
        self._translated = Translated(health, events, config.max_record_bytes)

    async def handle(self, req: GenRequest, send: Send, rec: RequestRecord) -> None:
        """`forward` for a request the router makes itself (the semantic cache's embedding),
        answered to `send`: its own Exchange, so it is recorded like any (an error too, in
        its API's shape, to `send`)."""
        ex = Exchange(send, rec, req.t0, self.events)
        await ex.run(self.forward(req, ex))

    async def forward(self, req: GenRequest, ex: Exchange) -> None:
        """Answer `req` from a backend through `ex`, which holds the slot taken here until its
        `finish`; an ApiError when no backend answers (the caller sends it: `Exchange.fail`)."""
        if self.health.overloaded():
            self.events.count("overloaded", "", req.key)
            raise ApiError(
                503,
                "the router is overloaded, please try again",
                code="router_overloaded",
                retry_after=self.config.retry_after,
            )
        if not self.scheduler.knows(req.key):
            await self.rediscover()  # pulled or copied a moment ago? look once before 404
            if not self.scheduler.knows(req.key):
                if not any(self.store.is_healthy(ep) for ep in self.scheduler.endpoints):
                    raise ApiError(
                        503,
                        "no healthy endpoint: every backend is down",
                        code="no_healthy_endpoint",
                        retry_after=self.config.retry_after,
                    )
                raise _unknown_model(req)
        self.budget.request()
        ex.prompt_bytes = len(req.raw)
        keys = None
        if self.config.conversation_affinity and req.pinned is None:  # (an ensemble's sample: no affinity)
            keys = affinity.request_keys(req.kind, req.key, req.body, req.session_id, req.client)
        ctx = RouteContext(
            model=req.key, api=req.api, kind=req.kind, keys=keys, too_small=req.too_small, client=req.client
        )
        if self._wants_prompt:
            ctx.prompt = prefix_index.request_prompt(req.kind, req.key, req.body)
        only = route_types.ONLY_ON.get(req.path)  # a route some backend types do not serve: they are never tried
        tried = [] if only is None else route_types.others(self.scheduler.endpoints, only, req.key, req.path, req.model)
        if req.pinned is not None:  # an ensemble's sample goes where it was sent (forward/ensemble.py)
            tried += [ep.name for ep in self.scheduler.endpoints if ep.name not in req.pinned]
        last: RetryableFailure | None = None
        rec = ex.rec
        attempts = min(self.config.max_attempts, self.scheduler.serving(req.key))
        for attempt in range(attempts):
            try:
                lease = await self.scheduler.acquire(ctx, tried)
            except NoEndpoint:
                break
            except QueueFull:
                raise ApiError(
                    503,
                    "server busy, please try again: the router's queue is full",
                    code="queue_full",
                    retry_after=self.config.retry_after,
                ) from None
            except QueueTimeout:
                raise ApiError(
                    503,
                    f"no slot became free within queue_timeout ({self.config.queue_timeout:g}s)",
                    code="queue_timeout",
                    retry_after=self.config.retry_after,
                ) from None
            ex.hold(lease)  # (given back at ex.finish, or below when this attempt fails)
            if attempt:
                if not self.budget.allow():
                    ex.let_go()
                    log.warning("retry budget spent: not retrying %s (%s)", req.key, last and last.reason)
                    break
                rec.retries += 1
                self.events.count("retry", lease.endpoint.name, req.key)
            t_lease = time.perf_counter()
            try:
                await self._attempt(req, lease, ex, ctx, attempt == attempts - 1)
            except RetryableFailure as f:
                ex.let_go()
                log.info("attempt on %s failed before any byte was sent (%s); retrying", lease.endpoint.name, f.reason)
                self.health.failure(lease.endpoint, f.reason, f.unreachable)
                tried.append(lease.endpoint.name)
                last = f
                continue
            if rec.error is None and not rec.resumed:
                self.health.success(lease.endpoint)  # (cut streams were reported as they broke)
                if rec.completion_tokens and req.kind in ("chat", "generate"):  # the time per token, learned
                    after = time.perf_counter() - t_lease - (rec.upstream_first_s or 0.0)
                    self.deadlines.tokens(lease.endpoint.name, req.key, after, rec.completion_tokens)
            self.store.record(lease.endpoint.name, req.key)
            self.scheduler.observe(ctx, lease.endpoint, rec.upstream_first_s, time.perf_counter() - t_lease)
            return
        await self._give_up(req, last, ex)

    async def _give_up(self, req: GenRequest, last: RetryableFailure | None, ex: Exchange) -> None:
        if last is None:
            raise ApiError(
                503,
                f"no healthy endpoint serves model '{req.model}'",
                code="no_healthy_endpoint",
                retry_after=self.config.retry_after,
            )
        if last.status is not None:  # the backend's own answer, passed through
            body = last.body  # (an error object under a 200 is a 502: error_record.py)
            status, code = (502, ErrorRecord.code) if last.status == 200 else (last.status, "upstream_status")
            if req.api == "ollama" and last.content_type.startswith(b"application/json"):
                from ..backends.translate import error_message

                body = error_body("ollama", status, error_message(body))
            ex.note_error(code)
            await ex.relay(FAILED, ReadyAnswer(status, body, [], last.content_type))
            return
        raise ApiError(502, f"every endpoint failed for model '{req.model}': {last.reason}", code="upstream_error")

    async def _attempt(self, req: GenRequest, lease: Lease, ex: Exchange, ctx: RouteContext, last: bool) -> None:
        ep = lease.endpoint
        rec = ex.rec
        # (set here, not by the caller: there mypy would take it for None after the call, and
        # the compiled build checks what mypy infers)
        rec.upstream_first_s = None
        strip = req.stream and self.resumer is not None and sent_body.strips_usage(req)
        # A whole answer is streamed from the backend, unless its length is bounded and a
        # deadline that knows it fits under the gap (relay/assembled.py).
        streamed = req.stream
        whole_by: float | None = None
        if not streamed and self._assemble and (req.api, req.kind) in whole_from_stream.STREAMED and req.ctype is None:
            length = whole_from_stream.length_bound(req.api, req.body)
            whole_by = self.deadlines.whole(ep.name, req.key, len(req.raw), length, self.config.stream_idle_timeout)
            streamed = whole_by is None
        path, body, translating = sent_body.plan(req, ep, strip, streamed and not req.stream)
        t_up = time.perf_counter()
        queued = lease.queued_s
        rec.endpoint, rec.queue_s, rec.affinity = ep.name, queued, lease.affinity
        rec.overhead_s = overhead = t_up - req.t0 - queued
        headers: Headers = [
            self._worker,
            (b"x-request-id", rec.request_id.encode("latin-1")),
            (b"x-router-queue-ms", b"%.3f" % (queued * 1000)),
            (b"x-router-overhead-ms", b"%.3f" % (overhead * 1000)),
        ]
        if ctx.prompt is not None:  # tokens of the prompt believed cached there
            rec.prefix_tokens = ctx.cached_tokens or 0
        if req.routing_headers:  # (not for a tenant's key: they tell of other keys' requests)
            headers.append((b"x-router-endpoint", ep.name.encode()))
            if lease.affinity is not None:
                headers.append((b"x-router-affinity", lease.affinity.encode()))
            if ctx.prompt is not None:  # tokens of the prompt believed cached there / prompt tokens
                headers.append((b"x-router-cache", b"%d/%d" % (rec.prefix_tokens or 0, ctx.prompt.tokens)))
        # A whole answer and a stream's first chunk are bounded by the learned deadline (a hung
        # backend is left in seconds); later chunks of a stream by stream_idle_timeout.
        deadline = whole_by or self.deadlines.deadline(ep.name, req.key, streamed, len(body), last)
        self.health.sending(ep)
        try:
            timeout = self._stream_timeout if streamed else self._whole_timeout
            resp, data, first = await self._call(ep, path, body, timeout, translating, req.ctype, deadline)
        except UNREACHABLE as refused:
            raise RetryableFailure(f"unreachable ({type(refused).__name__})", unreachable=True) from None
        except h1.OutOfDescriptors:  # the router's own shortage: no backend is blamed, none tried
            self.events.count("descriptors_exhausted", ep.name, req.key)
            raise ApiError(
                503,
                "the router is out of file descriptors; please try again",
                code="out_of_descriptors",
                retry_after=self.config.retry_after,
            ) from None
        except TimeoutError:
            what = "whole answer of its bounded length" if whole_by else "first byte"
            raise RetryableFailure(f"no {what} within {deadline:.1f}s (hung?)") from None
        except h1.ClientError as e:  # disconnected or cut before we sent a byte
            raise RetryableFailure(f"{type(e).__name__}: {e}") from None
        now = time.perf_counter()
        took = now - t_up
        if streamed:
            rec.upstream_first_s = took
        rec.ttft_s = now - req.t0  # the first byte goes out next (a whole answer: all of it)
        if resp.status == 200 and whole_by is None:  # (a deadline that knew the length teaches nothing)
            self.deadlines.observe(ep.name, req.key, streamed, len(body), took)

        if not translating:
            for name, key in _FORWARDED:
                value = dict.get(resp.headers, name)
                if value:
                    headers.append((key, value.encode()))
        if req.kind == "responses" and resp.status == 200 and self.config.conversation_affinity:
            await responses.remember_response(self.store, data or first, ep.name)  # for previous_response_id
        # (the status is recorded as the head goes out, after the last wait: a client gone meanwhile got none)
        answer = BackendAnswer(req, ctx, ep, resp, headers, first, data, translating)
        if resp.status == 200 and streamed and not req.stream:
            try:
                return await ex.relay(self._assembled, answer)
            except (TimeoutError, h1.ClientError) as failure:  # (nothing went to the client: retried elsewhere)
                why = (
                    "silent for longer than stream_idle_timeout"
                    if isinstance(failure, TimeoutError)
                    else type(failure).__name__
                )
                raise RetryableFailure(f"the stream of a whole answer broke: {why}") from None
        if not req.stream or resp.status != 200:
            if data is None:  # larger than the router holds (relay/whole.py)
                return await ex.relay(self._large, answer)
            return await ex.relay(self._translated if translating else self._whole, answer)
        if translating:
            return await ex.relay(self._translated, answer)
        resumer = self.resumer
        if resumer is not None and resumable(req.api, req.kind, req.body):
            answer.strip = token_counts.Strip() if strip else None
            return await ex.relay(resumer, answer)
        return await ex.relay(self._passthrough, answer)

    async def _start_continuation(self, ep: Endpoint, path: str, body: bytes) -> tuple[h1.Response, bytes]:
        deadline = self.deadlines.deadline(ep.name, "", True, len(body), False)
        resp, _, first = await self._call(ep, path, body, self._stream_timeout, False, None, deadline)
        if resp.status != 200:
            resp.close()
            raise RetryableFailure(f"HTTP {resp.status}")
        return resp, first

    async def _call(
        self,
        ep: Endpoint,
        path: str,
        body: bytes,
        timeout: h1.Timeout,
        line: bool,
        ctype: str | None = None,
        deadline: float | None = None,
    ) -> tuple[h1.Response, bytes | None, bytes]:
        """Send, and read either the whole body or the first chunk of a 200 stream, all within
        `deadline` seconds (TimeoutError). `ctype`: the body's own content type (multipart
        uploads) instead of JSON."""
        resp = await self.upstream.post(ep, path, body, timeout, ctype, deadline)
        try:
            if resp.status in RETRY_STATUSES:
                raise RetryableFailure(
                    f"HTTP {resp.status}",
                    resp.status,
                    await resp.read(whole.HOLD),
                    resp.headers.get("content-type", "application/json").encode(),
                )
            if timeout is self._whole_timeout or resp.status != 200:  # (data None: larger than `bound`)
                data = await resp.hold(*whole.bound(self.config, line))
                resp.unbound()
                if resp.status == 200 and data and error_record.whole(data):  # a failure, though 200: retried
                    self.events.count(error_record.EVENT, ep.name, "")
                    raise RetryableFailure("an error object in a 200 answer", 200, data)
                return resp, data, b""
            first = await _first_chunk(resp, line and self.config.max_record_bytes)
            if is_error_chunk(first):  # an error before any content: nothing sent yet, retry
                self.events.count(error_record.EVENT, ep.name, "")
                error = first.strip().removeprefix(b"data:").strip()
                raise RetryableFailure("error chunk before content", 502, error)
            resp.unbound()  # the rest of the stream: within stream_idle_timeout per read
            return resp, b"", first
        except BaseException:
            resp.close()
            raise


async def _nothing() -> None:
    return None


async def _first_chunk(resp: h1.Response, line: int) -> bytes:
    """A stream's first piece (`line`: a line, at most that long), read before the client gets a byte."""
    chunk = await (resp.content.readline(line) if line else resp.content.readany())
    if not chunk:
        raise h1.Cut("backend closed the stream before the first chunk")
    return chunk


def _unknown_model(req: GenRequest) -> ApiError:
    if req.api == "openai":
        return ApiError(404, f"The model `{req.model}` does not exist.", param="model", code="model_not_found")
    return ApiError(404, f"model '{req.model}' not found")
