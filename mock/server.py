"""The mock backend: Ollama and OpenAI routes on a small httptools server (mock.http).

One `MockBackend` is one simulated GPU server: its slots, its KV prefix cache,
its fault dice and its counters. It knows nothing about routers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
import uuid
from collections import Counter
from typing import Any

from . import fidelity, formats
from . import http as web  # Request, Response, StreamResponse
from .capacity import QueueFull, Slots
from .config import MockConfig
from .generation import BadRequest, Generation, _parse_generation, read_json
from .http import Handler, Reply
from .knobs import Knobs
from .kvcache import PrefixCache
from .manage import BadInput, Manage
from .metadata import Metadata
from .newer_routes import NewerRoutes
from .route_group import Routes
from .text import count_tokens, embedding, output_tokens
from .ticker import Ticker

OLLAMA_BUSY = "server busy, please try again.  maximum pending requests exceeded"
JSON = "application/json"


class MockBackend:
    def __init__(self, config: MockConfig) -> None:
        config.validate()
        self.config = config
        self.slots = Slots(config.parallel, config.max_queue)
        self.kv = PrefixCache(config.kv_cache_tokens, config.kv_block_tokens)
        self.kv_events = None
        if config.kv_events:
            from .kv_events import KVEventPublisher

            self.kv_events = self.kv.events = KVEventPublisher(config.kv_events, config.kv_block_tokens)
        self.rng = random.Random(config.seed)
        self.rid_prefix = uuid.uuid4().hex[:12]
        self.rid_counter = itertools.count()
        self.started = time.time()
        self.ticker: Ticker | None = None  # made on the first stream that uses one
        self.reset_stats()
        self.routes: Routes = {
            ("POST", "/api/chat"): self._gen("ollama", "chat"),
            ("POST", "/api/generate"): self._gen("ollama", "generate"),
            ("POST", "/api/embed"): self._gen("ollama", "embed"),
            ("POST", "/api/embeddings"): self._gen("ollama", "embeddings"),
            ("POST", "/v1/chat/completions"): self._gen("openai", "chat"),
            ("POST", "/v1/completions"): self._gen("openai", "generate"),
            ("POST", "/v1/embeddings"): self._gen("openai", "embed"),
        }
        self.routes.update(Metadata(self).routes)
        self.routes.update(Knobs(self).routes)
        self.manage = Manage(self)
        self.routes.update(self.manage.routes)
        self.routes.update(NewerRoutes(self).routes)
        self._paths = {path for _, path in self.routes}

    # ---- knobs and counters -------------------------------------------------
    def reset_stats(self) -> None:
        self.requests: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()
        self.errors_injected: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.kv_hits = 0
        self.kv_misses = 0
        self.kv_hit_tokens = 0
        self.kv_miss_tokens = 0
        self.slots.max_active = self.slots.active

    def update(self, **changes: Any) -> MockConfig:
        new = self.config.updated(changes)
        if new.seed != self.config.seed:
            self.rng = random.Random(new.seed)
        if (new.kv_cache_tokens, new.kv_block_tokens) != (self.config.kv_cache_tokens, self.config.kv_block_tokens):
            self.kv.clear()  # subscribers hear AllBlocksCleared
            self.kv = PrefixCache(new.kv_cache_tokens, new.kv_block_tokens)
            self.kv.events = self.kv_events
        self.slots.parallel, self.slots.max_queue = new.parallel, new.max_queue
        self.config = new
        self.slots.wake()
        return new

    def stats(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "completed": dict(self.completed),
            "requests_total": sum(self.requests.values()),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "active": self.slots.active,
            "max_active": self.slots.max_active,
            "queue_length": self.slots.queued,
            "kv_cache": {
                "hits": self.kv_hits,
                "misses": self.kv_misses,
                "hit_tokens": self.kv_hit_tokens,
                "miss_tokens": self.kv_miss_tokens,
                "cached_tokens": self.kv.cached_tokens,
            },
            "errors_injected": dict(self.errors_injected),
        }

    # ---- HTTP entry -----------------------------------------------------------
    async def handle(self, request: web.Request) -> Reply:
        handler = self.routes.get((request.method, request.path))
        if handler is None and request.path.startswith("/api/blobs/") and request.method in ("HEAD", "POST"):
            handler = self.manage.blob
        if handler is not None:
            try:
                return await handler(request)
            except (BadRequest, BadInput) as e:
                return self._error(request.path, e.status, e.message)
        if request.path in self._paths:
            return self._error(request.path, 405, f"method {request.method} not allowed")
        return self._error(request.path, 404, f"no route for {request.method} {request.path}")

    @staticmethod
    def _error(path: str, status: int, message: str, headers: dict | None = None) -> web.Response:
        if path.startswith("/v1/"):
            kind = "server_error" if status >= 500 else "invalid_request_error"
            body: dict[str, Any] = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        else:
            body = {"error": message}
        return web.Response(status, json.dumps(body).encode(), JSON, headers)

    def check_model(self, model: str) -> None:
        """404 unless the mock serves `model` (`name` and `name:latest` are one model)."""
        if model in self.config.models:
            return
        if ":" not in model and model + ":latest" in self.config.models:
            return
        if model.endswith(":latest") and model[: -len(":latest")] in self.config.models:
            return
        raise BadRequest(404, f"model '{model}' not found")

    # ---- generation -----------------------------------------------------------
    def _gen(self, api: str, kind: str) -> Handler:
        async def handler(request: web.Request) -> Reply:
            route = request.path
            self.requests[route] += 1
            gen = _parse_generation(api, kind, await read_json(request))
            self.check_model(gen.model)
            return await self._serve(request, gen, route)

        return handler

    def _dice(self) -> str | None:
        """One roll per fault, in a fixed order, so a seed replays the same faults."""
        c, rng = self.config, self.rng
        if not (c.hang_rate or c.fail_rate or c.busy_rate or c.drop_rate or c.error_rate or c.wedge_rate):
            return None
        rolls = (("hang", c.hang_rate), ("fail", c.fail_rate), ("busy", c.busy_rate), ("drop", c.drop_rate))
        if c.error_rate:  # (rolled only when set: a seed replays the faults it did before)
            rolls += (("error", c.error_rate),)
        if c.wedge_rate:  # (the same)
            rolls += (("wedge", c.wedge_rate),)
        fault = None
        for name, rate in rolls:
            if rng.random() < rate and fault is None:
                fault = name
        return fault

    def _jitter(self) -> float:
        c = self.config
        if c.jitter <= 0 or c.jitter_dist == "none":
            return 1.0
        if c.jitter_dist == "normal":
            f = self.rng.gauss(1.0, c.jitter)
        elif c.jitter_dist == "uniform":
            f = self.rng.uniform(1.0 - c.jitter, 1.0 + c.jitter)
        else:  # exponential: a long right tail with mean 1 + jitter
            f = 1.0 + self.rng.expovariate(1.0 / c.jitter)
        return max(f, 0.0)

    async def _serve(self, request: web.Request, gen: Generation, route: str) -> Reply:
        fault = self._dice()
        jitter = self._jitter()
        if fault is not None:
            self.errors_injected[fault] += 1
        if fault == "hang":
            await asyncio.Event().wait()  # until the client leaves and the handler is cancelled
        if fault == "fail":
            return self._error(request.path, 500, "injected failure")
        if fault == "busy":
            return self._busy(request.path, gen.api)

        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        try:
            try:
                await self.slots.acquire()
            except QueueFull:
                self.errors_injected["queue_full"] += 1
                return self._busy(request.path, gen.api)
            try:
                response = await self._generate(
                    request, gen, jitter, fault == "drop", fault == "error", fault == "wedge"
                )
                self.completed[route] += 1
                return response
            finally:
                self.slots.release()
        finally:
            self.in_flight -= 1

    def _busy(self, path: str, api: str) -> web.Response:
        if api == "ollama":
            return self._error(path, 503, OLLAMA_BUSY)
        return self._error(path, self.config.openai_busy_status, "server busy, please try again", {"Retry-After": "1"})

    async def _generate(
        self, request: web.Request, gen: Generation, jitter: float, drop: bool, error: bool = False, wedge: bool = False
    ) -> Reply:
        loop = asyncio.get_running_loop()
        c = self.config
        t0 = loop.time()
        prompt_tokens = count_tokens(gen.prompt_text)
        cached = self.kv.lookup(gen.prompt_text) if prompt_tokens else 0
        cached = min(cached, prompt_tokens)
        if cached:
            self.kv_hits += 1
        else:
            self.kv_misses += 1
        self.kv_hit_tokens += cached
        self.kv_miss_tokens += prompt_tokens - cached
        prefill_s = (prompt_tokens - cached) * c.prefill_ms_per_1k_tokens / 1e6
        ttft_s = c.ttft_ms * jitter / 1000 + prefill_s
        tok_s = c.tok_ms * jitter / 1000
        first_byte_s = c.first_byte_delay_ms / 1000

        if gen.kind in ("embed", "embeddings"):
            await _sleep_until(loop, t0 + max(ttft_s, first_byte_s))
            if drop:
                _cut(request)
            out = formats.embedding_body(gen, [embedding(t, c.embed_dim) for t in gen.inputs], prompt_tokens)
            if gen.b64:
                for item in out["data"]:
                    item["embedding"] = fidelity.b64_embedding(item["embedding"])
            return web.json_response(out)

        rest = c.tokens - gen.offset
        limit = rest if gen.max_tokens is None or gen.max_tokens < 0 else min(rest, gen.max_tokens)
        tokens = output_tokens(gen.offset + limit)[gen.offset :]
        done_reason = "length" if gen.max_tokens is not None and 0 <= gen.max_tokens < rest else "stop"
        ex = gen.extras
        if ex is not None and (ex.json_text is not None or ex.tool is not None):
            tokens, done_reason = [ex.json_text or ""], "stop"
        timing = formats.Timing(prompt_tokens, len(tokens), ttft_s, tok_s, cached, c.eval_count_uncached)
        if gen.kind == "chat":
            self.kv.insert(gen.prompt_text + f"<assistant>{''.join(tokens)}\n")
        else:
            self.kv.insert(gen.prompt_text + "".join(tokens))
        rid = f"{self.rid_prefix}{next(self.rid_counter):012x}"

        if not gen.stream:
            if ttft_s or tok_s or first_byte_s:
                await _sleep_until(loop, t0 + max(ttft_s, first_byte_s) + tok_s * len(tokens) * self._slowdown())
            if drop:
                _cut(request)
            if wedge:
                await asyncio.Event().wait()  # silent, the connection open, until the client leaves
            if error:
                return web.json_response(_runner_error(gen.api))
            body = formats.complete_body(gen, tokens, done_reason, timing, rid)
            return web.json_response(body if ex is None else fidelity.whole(body, gen.api, ex, rid))

        await _sleep_until(loop, t0 + first_byte_s)
        resp = web.StreamResponse(headers={"Content-Type": formats.stream_content_type(gen.api)})
        await resp.prepare(request)
        chunker = formats.Chunker(gen, rid)
        n = 1 if ex is None else ex.n
        head = chunker.head()
        if head:
            await resp.write(fidelity.fan(head, n))
        deadline = t0 + ttft_s
        cut_at = len(tokens) // 2 if drop or error or wedge else -1
        if ex is not None and ex.tool is not None:  # the call instead of text
            tokens = []
            for piece in fidelity.tool_chunks(gen.api, ex, gen.model, rid, chunker.created, formats.now_iso()):
                await resp.write(piece)
        if c.stream_tick_ms > 0 and ex is None and cut_at < 0:  # thousands of slow streams
            await self._ticker().stream(
                resp, chunker.token, tokens, deadline, tok_s, lambda: chunker.tail(done_reason, timing)
            )
            return resp
        for i, tok in enumerate(tokens):
            if i == cut_at:
                if wedge:  # silent from here on, the connection open, until the client leaves
                    await asyncio.Event().wait()
                if not error:
                    _cut(request)
                await resp.write(_error_record(gen.api))
                await resp.write_eof()
                return resp
            await _sleep_until(loop, deadline)
            await resp.write(chunker.token(tok) if n == 1 else fidelity.fan(chunker.token(tok), n))
            deadline += tok_s * self._slowdown()
        await _sleep_until(loop, deadline)
        tail = chunker.tail(done_reason, timing)
        if ex is not None:
            if ex.tool is not None and gen.api == "openai":
                tail = tail.replace(b'"finish_reason": "stop"', b'"finish_reason": "tool_calls"', 1)
            tail = fidelity.fan_tail(tail, n)
        await resp.write(tail)
        await resp.write_eof()
        return resp

    def _ticker(self) -> Ticker:
        """The stream wheel at the current `stream_tick_ms` (a new one when the knob changed)."""
        tick = self.config.stream_tick_ms / 1000
        if self.ticker is None or self.ticker.tick != tick:
            self.ticker = Ticker(tick, self._slowdown)
        return self.ticker

    def _slowdown(self) -> float:
        c = self.config
        if c.batch_slowdown <= 0:
            return 1.0
        return 1.0 + c.batch_slowdown * max(self.slots.active - 1, 0)


RUNNER_CRASH = "llama runner process has terminated: signal: killed"


def _runner_error(api: str) -> dict[str, Any]:
    """What Ollama says when its model runner dies (`{"error": "..."}`), in the API's shape."""
    if api == "ollama":
        return {"error": RUNNER_CRASH}
    return {"error": {"message": RUNNER_CRASH, "type": "InternalServerError", "param": None, "code": 500}}


def _error_record(api: str) -> bytes:
    """The error record a stream ends with when the runner dies mid-way: Ollama's NDJSON line
    (and the stream's end), or vLLM's SSE event followed by its `[DONE]`."""
    if api == "ollama":
        return json.dumps(_runner_error(api), separators=(",", ":")).encode() + b"\n"
    return b"data: " + json.dumps(_runner_error(api)).encode() + b"\n\ndata: [DONE]\n\n"


def _cut(request: web.Request) -> None:
    """Simulate a crashed backend: the connection ends without a complete response."""
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError


async def _sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
