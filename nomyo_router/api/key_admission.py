"""Per-key rate limits and token budgets on the request path: admit or refuse, and tell.

A key with `rpm`, `tpm` or `tokens_per_day` (in `client_keys`) has each generation request
admitted by the state store's one count (state/key_limits.py: in memory, at the shared-state host
with `--workers N`, in Redis across instances). Beyond a limit it is answered 429 in the
caller's API shape — OpenAI code `rate_limit_exceeded` (type `requests` or `tokens`),
`insufficient_quota` for a spent daily budget; Ollama routes `{"error": "..."}` — with
`Retry-After`, and never reaches a backend. Every answer of a limited key carries OpenAI's
`x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`, `x-ratelimit-limit-tokens`,
`x-ratelimit-remaining-tokens` (and `x-ratelimit-reset-*`), counting the request itself; the
token headers show `tpm`, or the daily budget when the key has no `tpm`.

A key with only `rpm` is admitted before its body is read. A key with a token budget is
admitted once its body is parsed, because the admission reserves what the request may spend
(`reservation`: its prompt at 4 characters a token, plus its `max_tokens` /
`max_completion_tokens` / `num_predict`, else `OUTPUT_ESTIMATE`); only a key whose daily
budget is already spent is refused before its body. When the answer ends (the events hub's
record) the reservation is settled to the tokens counted: the backend's, or those the router
counted as it relayed them (`RequestRecord.tokens_from`); a backend's successful answer that
reached the client with no count at all is charged its reservation.

A request is counted once every check that could refuse it has passed (its key, its body,
its model; for model management, the admin key), just before it reaches a backend: a refused
request never spends a key's rpm. While a key's last count refused it, its further generation
requests get the same 429 before their bodies are read (this process remembers until when),
so a flood beyond the limit buffers nothing. Every other route that reaches a backend
(`/api/show`, `/api/status`, `/api/ps`, blobs, model management) counts a limited key's
request too (`count`).

Keys without limits pay one dict lookup; a limited key pays one count (with Redis, one round
trip) per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily

from ..events import Events, RequestRecord
from ..routing.context_windows import output_tokens, prompt_tokens
from ..server.asgi import Headers, Scope, Send, with_headers
from ..state.key_limits import DAY_S, Limits, Verdict
from ..task_stop import end
from .errors import ApiError

if TYPE_CHECKING:
    from ..config import RouterConfig
    from ..state import StateStore
    from .requests import GenRequest

SCOPE_KEY = "nomyo.ratelimit"  # the headers for this request's answer, whatever it is (app.py)
COUNT = "nomyo.count"  # a limited key's request on another route than generation: its count, to await
REFRESH_S = 2.0  # how often /metrics' view of every limited key is read from the count
OUTPUT_ESTIMATE = 1024  # tokens reserved for the answer of a request that does not bound its length
_GENERATES = frozenset(("chat", "generate", "responses"))  # the kinds of request that answer text


def limits_of(config: RouterConfig) -> dict[str, Limits]:
    return {
        c.name: Limits(c.rpm, c.tpm, c.tokens_per_day) for c in config.client_keys if c.rpm or c.tpm or c.tokens_per_day
    }


def reservation(req: GenRequest) -> int:
    """What a request may spend: its prompt (4 characters a token, as context routing counts
    it) and the answer it allows, else OUTPUT_ESTIMATE (a generation) or nothing (embeddings,
    rerank and the rest answer no tokens of text)."""
    allowed = output_tokens(req.api, req.body) or (OUTPUT_ESTIMATE if req.kind in _GENERATES else 0)
    return prompt_tokens(req.body) + allowed


def _answered(rec: RequestRecord) -> bool:
    """Whether a backend's answer (a success) reached the client, whole or in part."""
    return rec.endpoint is not None and rec.ttft_s is not None and 200 <= rec.status < 300


def _seconds(s: float) -> bytes:
    return b"%gs" % round(max(s, 0.0), 3)


def headers_of(limits: Limits, v: Verdict) -> Headers:
    """OpenAI's x-ratelimit-* headers for a verdict (the request itself counted)."""
    h: Headers = []
    if limits.rpm is not None:
        h += [
            (b"x-ratelimit-limit-requests", b"%d" % limits.rpm),
            (b"x-ratelimit-remaining-requests", b"%d" % max(limits.rpm - v.requests, 0)),
            (b"x-ratelimit-reset-requests", _seconds(v.reset_requests)),
        ]
    if limits.tpm is not None:
        h += [
            (b"x-ratelimit-limit-tokens", b"%d" % limits.tpm),
            (b"x-ratelimit-remaining-tokens", b"%d" % max(limits.tpm - v.tokens - v.held, 0)),
            (b"x-ratelimit-reset-tokens", _seconds(v.reset_tokens)),
        ]
    elif limits.tokens_per_day is not None:
        h += [
            (b"x-ratelimit-limit-tokens", b"%d" % limits.tokens_per_day),
            (b"x-ratelimit-remaining-tokens", b"%d" % max(limits.tokens_per_day - v.day_tokens - v.held, 0)),
        ]
    return h


def refusal(limits: Limits, v: Verdict, headers: Headers) -> ApiError:
    wait = max(1, math.ceil(v.retry_after))
    if v.refused == "tokens_per_day" and limits.tokens_per_day is not None and v.day_tokens < limits.tokens_per_day:
        return ApiError(
            429,
            f"this API key's daily token budget ({limits.tokens_per_day} tokens per UTC day) is held by its "
            f"requests in progress ({v.held} tokens reserved); try again in {wait}s",
            code="rate_limit_exceeded",
            kind="tokens",
            retry_after=wait,
            headers=headers,
        )
    if v.refused == "tokens_per_day":
        return ApiError(
            429,
            f"this API key's daily token budget ({limits.tokens_per_day} tokens per UTC day) is "
            f"spent; it renews at midnight UTC, in {wait}s",
            code="insufficient_quota",
            kind="insufficient_quota",
            retry_after=wait,
            headers=headers,
        )
    if v.refused == "rpm":
        what, kind = f"{limits.rpm} requests per minute", "requests"
    else:
        what, kind = f"{limits.tpm} tokens per minute", "tokens"
    return ApiError(
        429,
        f"rate limit reached for this API key: {what}; try again in {wait}s",
        code="rate_limit_exceeded",
        kind=kind,
        retry_after=wait,
        headers=headers,
    )


class RateLimits:
    """The router's limited keys. Built always; empty when no key has limits."""

    def __init__(self, config: RouterConfig, store: StateStore, events: Events) -> None:
        self.store = store
        self.by_client: dict[str, Limits] = limits_of(config)
        self.last: dict[str, Verdict] = {}  # each key's count as last read (for /metrics, the dashboard)
        self._day_end: dict[str, float] = {}  # when the UTC day of each `last` ends
        self.refused_until: dict[str, float] = {}  # a key its last count refused: until when (monotonic)
        self._task: asyncio.Task[None] | None = None
        events.on_request_done(self.done)

    def apply(self, config: RouterConfig) -> None:
        """A reload: limits change at once; a removed key's counts are forgotten."""
        self.by_client = limits_of(config)
        self.refused_until.clear()
        for client in [c for c in self.last if c not in self.by_client]:
            del self.last[client]
            self._day_end.pop(client, None)
        self.store.limiter().forget(set(self.by_client))

    def budgeted(self, client: str) -> bool:
        """Whether the key has a token budget (admitted after its body is parsed: `reserve`)."""
        limits = self.by_client.get(client)
        return limits is not None and (limits.tpm is not None or limits.tokens_per_day is not None)

    async def reserve(self, client: str, tokens: int, scope: Scope, send: Send) -> tuple[Send, tuple[int, int] | None]:
        """Admit one request of a limited `client`, reserving `tokens` of its budgets (429 if a
        limit refuses it): the `send` that adds the x-ratelimit-* headers, and the
        reservation (its number and tokens, for the request's record) when one was made."""
        limits = self.by_client[client]
        v = await self.store.admit(client, limits, reserve=tokens)
        self._saw(client, v)
        headers = headers_of(limits, v)
        if v.refused is not None:
            self.refused_until[client] = time.monotonic() + v.retry_after
            raise refusal(limits, v, headers)
        scope[SCOPE_KEY] = headers  # (an error answered later carries them too)
        return with_headers(scope, send, headers), ((v.hold, tokens) if v.hold else None)

    def _saw(self, client: str, v: Verdict) -> None:
        self.last[client] = v
        self._day_end[client] = (time.time() // DAY_S + 1) * DAY_S

    def _spent(self, client: str, limits: Limits) -> Verdict | None:
        """The key's daily budget as last seen, if it was spent then (until that day ends)."""
        v, now = self.last.get(client), time.time()
        if v is None or limits.tokens_per_day is None or v.day_tokens < limits.tokens_per_day:
            return None
        end_of_day = self._day_end.get(client, 0.0)
        return v._replace(refused="tokens_per_day", retry_after=end_of_day - now) if now < end_of_day else None

    def still_refused(self, client: str) -> None:
        """Before its body is read: the 429 its last count gave a limited `client`, while it
        lasts, or its daily budget when it was spent (nothing counted)."""
        limits = self.by_client.get(client)
        if limits is None:
            return
        until = self.refused_until.get(client)
        if until is not None:
            left, v = until - time.monotonic(), self.last.get(client)
            if left > 0 and v is not None:
                v = v._replace(retry_after=left)
                raise refusal(limits, v, headers_of(limits, v))
            del self.refused_until[client]
        spent = self._spent(client, limits) if self.budgeted(client) else None
        if spent is not None:
            raise refusal(limits, spent, headers_of(limits, spent))

    def counter(self, client: str, scope: Scope) -> Callable[[], Awaitable[object]]:
        """What `count` awaits for a limited `client`'s request on another route than generation."""
        return lambda: self.reserve(client, 0, scope, _no_send)

    def done(self, rec: RequestRecord) -> None:
        """The answer ended: settle its reservation to the tokens it used (an answer that
        reached the client uncounted is charged what it reserved)."""
        client, held = rec.client, rec.reserved
        limits = self.by_client.get(client) if client is not None else None
        if client is None or (limits is None and held is None):
            return
        p, c = rec.prompt_tokens, rec.completion_tokens
        tokens = (p or 0) + (c or 0)
        if held is not None:
            if p is None and c is None and _answered(rec):
                tokens = held[1]
            self.store.spend(client, tokens, limits or Limits(), held[0], held[1])
        elif limits is not None and tokens > 0 and (limits.tpm is not None or limits.tokens_per_day is not None):
            self.store.spend(client, tokens, limits)

    # ---- what operators see ------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await end(task)  # (one cancel is not always enough: task_stop.py)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            with contextlib.suppress(Exception):  # (an outage is the store's to report)
                await self.refresh()

    async def refresh(self) -> None:
        """Read every limited key's count now, counting nothing."""
        for client, limits in list(self.by_client.items()):
            self._saw(client, await self.store.admit(client, limits, count=False))

    def describe(self) -> dict[str, dict[str, Any]]:
        """Each limited key's use against its limits, for the dashboard."""
        out = {}
        for client, limits in self.by_client.items():
            v = self.last.get(client)
            row: dict[str, Any] = {}
            for name, limit, used in (
                ("rpm", limits.rpm, v.requests if v else 0),
                ("tpm", limits.tpm, v.tokens if v else 0),
                ("tokens_per_day", limits.tokens_per_day, v.day_tokens if v else 0),
            ):
                if limit is not None:
                    row[name] = {"limit": limit, "used": used}
            out[client] = row
        return out

    def gauges(self) -> Iterable[GaugeMetricFamily]:
        """nomyo_router_client_limit and nomyo_router_client_used, by client and limit."""
        if not self.by_client:
            return []
        limit = GaugeMetricFamily(
            "nomyo_router_client_limit", "a client key's rate limit or token budget", labels=["client", "limit"]
        )
        used = GaugeMetricFamily(
            "nomyo_router_client_used",
            "a client key's use of it: requests or tokens in the last 60 s, tokens today (UTC)",
            labels=["client", "limit"],
        )
        for client, row in self.describe().items():
            for name, value in row.items():
                limit.add_metric([client, name], value["limit"])
                used.add_metric([client, name], value["used"])
        return [limit, used]


async def _no_send(msg: dict[str, Any]) -> None:  # (`count` keeps only the headers admit leaves in the scope)
    raise AssertionError("never sent through")


def answered_with_headers(scope: Scope, send: Send) -> Send:
    """`send` adding the x-ratelimit-* headers a `count` left in the scope, if any, to the answer."""

    async def wrapped(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            extra = scope.pop(SCOPE_KEY, None)
            if extra:
                msg = {**msg, "headers": [*msg.get("headers", []), *extra]}
        await send(msg)

    return wrapped


async def count(scope: Scope) -> None:
    """This request is about to reach a backend: count it against its key's rpm now (429
    beyond), after the checks that could refuse it. Nothing for a key without limits."""
    admit = scope.pop(COUNT, None)
    if admit is not None:
        await admit()
