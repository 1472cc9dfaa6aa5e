"""The `moe-` ensemble (NOMYO's "multiple opinions"): a request for `moe-<model>` is answered
by `<model>` after it has seen several answers of its own and reviewed them.

Three steps, each a request admitted like any other (a slot, the queue, the client key's cap):

1. `moe.samples` answers to the request as it is (whole, not streamed), asked at once of
   distinct endpoints serving `<model>` when there are enough (else some endpoint several
   times), without conversation affinity (a sample goes where it is sent) and without the
   request's `seed` (so the samples differ);
2. one review: the model is shown the request and the answers, and asked what each gets right
   and wrong and which is best;
3. the final answer: the request's own history and system prompt, its last user turn replaced
   by the request, the answers and the review, with the instruction to write the best answer
   alone. This step is relayed to the client in its API's shape, streamed if it asked for a
   stream, with `X-Router-Moe: <answers used>`.

Samples that fail or answer no text (a tool call) are left out; when none is left, step 3 is
the request itself. An ensemble makes at most `samples` + 2 backend requests (each with the
failover of any request, up to `max_attempts` tries); the samples and the review each count
one request against the client key's rpm and budgets (a step they refuse is left out), the
final step is the request's own. Trim-and-retry does not re-run an ensemble. Each step's
tokens are accounted (usage, metrics, the access log) as a request of its own,
`<request id>.s1`, `.s2`, …, `.review`; the final step is the request. Chat and completion
routes of both APIs; `moe-` models are never cached.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, Protocol

from ..api.client_caps import ClientLimits
from ..api.errors import ApiError
from ..api.requests import GenRequest
from ..cache.answer import of_whole
from ..config import RouterConfig
from ..domain import model_key
from ..events import Events, RequestRecord
from ..relay.exchange import Exchange
from ..routing.scheduler import Scheduler
from ..server.asgi import Send, Whole
from ..state import QueueFull, StateStore
from .extra_calls import Charge

if TYPE_CHECKING:
    from .proxy import Proxy

PREFIX = "moe-"
HEADER = b"x-router-moe"
ROUTES = frozenset(("/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions"))
PROSE_DROPS = frozenset(("tools", "tool_choice", "format", "response_format"))

REVIEW = """Several assistants answered the same request. For each answer, say briefly what it gets right \
and what it gets wrong or leaves out. Then say which answer is best, and why.

<request>
{question}
</request>

{answers}"""

FINAL = """Write the best possible answer to the request below. Start from the best of the candidate \
answers, correct what the review found wrong and add what it found missing. Reply with the answer \
alone, in the language of the request, without mentioning candidates, reviews or these instructions.

<request>
{question}
</request>

{answers}

<review>
{review}
</review>"""


def prepare(req: GenRequest) -> None:
    """A `moe-<model>` request is about `<model>`: its key (routing, a client key's models)."""
    req.key = model_key(req.model[len(PREFIX) :])


class RunningRouter(Protocol):
    """What an ensemble uses of the running router (its proxy is made at start-up, after it)."""

    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def store(self) -> StateStore: ...
    @property
    def config(self) -> RouterConfig: ...
    @property
    def events(self) -> Events: ...
    @property
    def client_limits(self) -> ClientLimits: ...
    @property
    def proxy(self) -> Proxy | None: ...
    @property
    def charge(self) -> Charge: ...


class Ensemble:
    def __init__(self, router: RunningRouter) -> None:
        self.router = router

    def _proxy(self) -> Proxy:
        proxy = self.router.proxy
        assert proxy is not None  # (requests come after start-up)
        return proxy

    async def handle(self, req: GenRequest, ex: Exchange) -> None:
        router = self.router
        rec = ex.rec
        inner = req.model[len(PREFIX) :]
        if req.path not in ROUTES:
            raise ApiError(400, f"a {PREFIX} ensemble answers chat and completion routes, not {req.path}")
        scheduler = router.scheduler
        if not scheduler.knows(req.key):
            await self._proxy().rediscover()
            if not scheduler.knows(req.key):
                raise _unknown(req, inner)
        serving = [ep for ep in scheduler.endpoints if ep.serves(req.key)]
        healthy = [ep for ep in serving if router.store.is_healthy(ep)] or serving
        n = router.config.moe.samples
        asked = [
            self._ask(req, rec, _sample_body(req.body, inner), f"s{i + 1}", (healthy[i % len(healthy)].name,))
            for i in range(n)
        ]
        answers = [a for a in await asyncio.gather(*asked, return_exceptions=True) if isinstance(a, str) and a.strip()]
        body = {**req.body, "model": inner, "stream": req.stream}
        if answers:
            question = _question(req)
            listed = "\n\n".join(f"<answer_{i}>\n{a}\n</answer_{i}>" for i, a in enumerate(answers, 1))
            review_body = _rewritten(req, inner, REVIEW.format(question=question, answers=listed), prose=True)
            review = await self._ask(req, rec, review_body, "review", None)
            prompt = FINAL.format(question=question, answers=listed, review=review or "(no review)")
            body = {**_rewritten(req, inner, prompt), "stream": req.stream}
            if req.stream and "stream_options" in req.body:
                body["stream_options"] = req.body["stream_options"]
        final = _request(req, inner, body)
        # (the head gets a header: the body takes the same path)
        await self._proxy().forward(final, ex.via(_with_header(ex.send, len(answers))))

    async def _ask(
        self, req: GenRequest, rec: RequestRecord, body: dict[str, Any], tag: str, pinned: tuple[str, ...] | None
    ) -> str | None:
        """One step's text (None when it failed), accounted as a request of its own."""
        router = self.router
        sub = _request(req, body["model"], body)
        sub.pinned = pinned
        step = RequestRecord(f"{rec.request_id}.{tag}", req.api, req.path, body["model"], False, req.client)
        got = Whole()
        ex = Exchange(got.send, step, sub.t0, router.events)  # the step's own way out and completion
        await ex.run(self._step(req, sub, ex))
        if got.status != 200:
            return None
        answer = of_whole(req.api, req.kind, got.body())
        return answer.choices[0].text if answer is not None and answer.choices else None

    async def _step(self, req: GenRequest, sub: GenRequest, ex: Exchange) -> None:
        """One step's call: on its key's rpm, within one of its client's permits."""
        router = self.router
        limits, held = router.client_limits, None
        try:
            await router.charge(req.client)  # one more request of its key's rpm (429: left out)
            if limits.capped(req.client):  # each step waits for one of its client's permits
                await limits.enter(req.client, router.config.queue_timeout)
                held = req.client
            await self._proxy().forward(sub, ex)
        except (TimeoutError, QueueFull):  # no permit of its client's in time: this step is left out
            ex.rec.status, ex.rec.error = 503, "queue_timeout"
        finally:
            if held is not None:
                limits.leave(held)


def _request(req: GenRequest, inner: str, body: dict[str, Any]) -> GenRequest:
    sub = GenRequest(
        req.api,
        req.kind,
        req.path,
        inner,
        bool(body.get("stream")),
        body,
        json.dumps(body).encode(),
        time.perf_counter(),
    )
    sub.client, sub.routing_headers = req.client, req.routing_headers
    return sub


def _sample_body(body: dict[str, Any], inner: str) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if k not in ("seed", "stream_options")}
    options = out.get("options")
    if isinstance(options, dict) and "seed" in options:
        out["options"] = {k: v for k, v in options.items() if k != "seed"}
    return {**out, "model": inner, "stream": False}


def _question(req: GenRequest) -> str:
    """The request's last user turn (chat) or its prompt, as text."""
    if req.kind != "chat":
        prompt = req.body.get("prompt", "")
        return prompt if isinstance(prompt, str) else json.dumps(prompt)
    for m in reversed(req.body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):  # OpenAI's content parts: their text
                return "\n".join(t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str))
            return content if isinstance(content, str) else ""
    return ""


def _rewritten(req: GenRequest, inner: str, prompt: str, prose: bool = False) -> dict[str, Any]:
    """The request with its last user turn (or its prompt) replaced by `prompt`, not streamed;
    `prose`: without the request's tools and output format (the review is written for the model)."""
    body = {k: v for k, v in req.body.items() if k != "stream_options" and not (prose and k in PROSE_DROPS)}
    body.update(model=inner, stream=False)
    if req.kind != "chat":
        body["prompt"] = prompt
        return body
    messages = list(body.get("messages") or [])
    last = max(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=len(messages)
    )
    body["messages"] = [*messages[:last], {"role": "user", "content": prompt}]
    return body


def _with_header(send: Send, used: int) -> Send:
    async def wrapped(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [*msg.get("headers", ()), (HEADER, b"%d" % used)]}
        await send(msg)

    return wrapped


def _unknown(req: GenRequest, inner: str) -> ApiError:
    if req.api == "openai":
        return ApiError(404, f"The model `{inner}` does not exist.", param="model", code="model_not_found")
    return ApiError(404, f"model '{inner}' not found")
