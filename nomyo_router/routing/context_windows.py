"""Context-length-aware routing: a request longer than an endpoint's context window goes to
an endpoint whose window fits (`context_routing: route`), or is refused when none fits
(`reject`: 400 `context_length_exceeded`).

Each endpoint's window per model is configured (`endpoints[].context_length`, for all its
models) or learned with discovery (before the router serves, after each discovery round, and
by a reload before the endpoints it adds take traffic): the loaded `num_ctx` from Ollama's
`/api/ps` (`context_length`), else its `/api/show` (the Modelfile's `num_ctx` parameter,
else `model_info.*.context_length`),
vLLM's `max_model_len` in `/v1/models`. An unknown window counts as fitting. A request's
size is its prompt text at about 4 characters a token (images and other binary parts left
out) plus the output it asks for (`max_tokens`, `max_completion_tokens`,
`max_output_tokens`, Ollama's `num_predict`).

Cost: a request that cannot exceed the smallest known window (its whole body, at 4 bytes a
token, plus its output, is below it) pays a length, a few dict lookups and a comparison;
only a long one has its text measured and each serving endpoint's window looked at. The
excluded endpoints travel in the route context (`RouteContext.too_small`), so the scheduler
leaves them out before affinity and load are considered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..domain import Endpoint, model_key

log = logging.getLogger("nomyo_router.context")

CHARS_PER_TOKEN = 4
_BINARY = frozenset(("images", "image", "image_url", "input_image", "audio", "input_audio", "file", "files"))
_OUTPUT = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def output_tokens(api: str, body: dict[str, Any]) -> int:
    """The output a request asks for at most (0: not said)."""
    n = None
    if api == "ollama":
        options = body.get("options")
        if isinstance(options, dict):
            n = options.get("num_predict")
    else:
        for k in _OUTPUT:  # (a loop, not next() over a generator: 0.2 µs less per request)
            n = body.get(k)
            if isinstance(n, int):
                break
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def text_chars(value: object) -> int:
    """Characters of text in a request body: every string but the model's name, binary
    parts (images, audio, files) and data: URLs."""
    if isinstance(value, str):
        return 0 if value.startswith("data:") else len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for k, v in value.items() if k not in _BINARY and k != "model")
    if isinstance(value, list):
        return sum(text_chars(v) for v in value)
    return 0


def prompt_tokens(body: dict[str, Any]) -> int:
    return math.ceil(text_chars(body) / CHARS_PER_TOKEN)


def _show_window(data: object) -> int | None:
    """An Ollama /api/show answer's window: the Modelfile's num_ctx, else the model's own."""
    if not isinstance(data, dict):
        return None
    for line in str(data.get("parameters") or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "num_ctx" and parts[1].isdigit():
            return int(parts[1])
    info = data.get("model_info")
    if isinstance(info, dict):
        for key, value in info.items():
            if key.endswith(".context_length") and isinstance(value, int) and value > 0:
                return value
    return None


class Sized(Protocol):
    """What the check reads of a request (api/requests.py's GenRequest)."""

    @property
    def api(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def raw(self) -> bytes: ...
    @property
    def body(self) -> dict[str, Any]: ...


class Fetcher(Protocol):
    """The upstream client's `fetch` (h1/pool.py): a whole answer within `total` seconds."""

    async def fetch(
        self, ep: Endpoint, path: str, body: bytes | None = None, *, total: float | None
    ) -> tuple[int, object, bytes]: ...


class TooLong(Exception):
    """No endpoint serving the model has a window the request fits (`reject` mode); the
    message is OpenAI's wording, which the API layer answers as context_length_exceeded."""


class Windows:
    """Every endpoint's window per model, and the check of one request against them."""

    def __init__(
        self, mode: str, upstream: Fetcher, endpoints: Callable[[], Sequence[Endpoint]], timeout: float = 5.0
    ) -> None:
        """`endpoints()`: the router's endpoints now (a reload replaces them)."""
        self.mode = mode  # route | reject
        self.upstream = upstream
        self.endpoints = endpoints
        self.timeout = timeout
        self._show: dict[tuple[str, str, str], int | None] = {}  # (endpoint, model, digest) -> window
        self._asking: dict[tuple[str, str, str], asyncio.Future[None]] = {}  # /api/show calls in flight
        self._learned: dict[str, dict[str, int]] = {}  # endpoint name -> model key -> window
        self.floor = math.inf  # the smallest known window: a request below it fits everywhere

    # ---- the request path ------------------------------------------------------------------
    def window(self, ep: Endpoint, key: str) -> int | None:
        if ep.context_length is not None:
            return ep.context_length
        learned = self._learned.get(ep.name)
        return learned.get(key) if learned is not None else None

    def check(self, req: Sized, endpoints: Sequence[Endpoint]) -> frozenset[str] | None:
        """The endpoints `req` does not fit (None: it fits every one, or, with `route`, none:
        then it is sent as if unchecked). With `reject`, none fitting is a 400."""
        if self.floor == math.inf:  # no window known (yet): everything fits
            return None
        out = output_tokens(req.api, req.body)
        if len(req.raw) / CHARS_PER_TOKEN + 1 + out <= self.floor:
            return None
        need = prompt_tokens(req.body) + out
        serving = [ep for ep in endpoints if ep.serves(req.key)]
        small = [ep for ep in serving if (w := self.window(ep, req.key)) is not None and need > w]
        if not small:
            return None
        if len(small) < len(serving):
            return frozenset(ep.name for ep in small)
        if self.mode == "reject":
            largest = max(self.window(ep, req.key) or 0 for ep in small)
            prompt = need - out
            raise TooLong(
                f"This model's maximum context length is {largest} tokens. However, you requested "
                f"about {need} tokens ({prompt} in the messages, {out} in the completion). Please "
                f"reduce the length of the messages or completion."
            )
        return None

    # ---- learning ------------------------------------------------------------------------------
    async def learn(self) -> None:
        """Gather every endpoint's windows from what discovery keeps (/api/ps, /v1/models),
        asking Ollama's /api/show once per model version it has not seen."""
        eps = list(self.endpoints())
        await self.fetch(eps)
        self.compute(eps)

    async def fetch(self, eps: Sequence[Endpoint]) -> None:
        """Ask the Ollama endpoints among `eps` for the windows of the model versions not
        seen yet (/api/show): the one step of learning that waits on a backend."""
        await asyncio.gather(*(self._ask_show(ep) for ep in eps if ep.type == "ollama"), return_exceptions=True)

    def compute(self, eps: Sequence[Endpoint]) -> None:
        """Every window of `eps` (the router's endpoints now, or those a reload is about to
        put in force) from what discovery and `fetch` found; no I/O."""
        learned: dict[str, dict[str, int]] = {}
        floor = math.inf
        for ep in eps:
            windows: dict[str, int] = {}
            for m in ep.openai_models:  # vLLM
                if isinstance(m.get("max_model_len"), int) and m["max_model_len"] > 0:
                    windows[model_key(str(m.get("id", "")))] = m["max_model_len"]
            for m in ep.tags:
                name = m.get("model") or m.get("name") or ""
                w = self._show.get((ep.name, name, str(m.get("digest", ""))))
                if w:
                    windows[model_key(name)] = w
            for m in ep.ps:  # loaded: the num_ctx it runs with
                if isinstance(m.get("context_length"), int) and m["context_length"] > 0:
                    windows[model_key(m.get("model") or m.get("name") or "")] = m["context_length"]
            learned[ep.name] = windows
            if ep.context_length is not None:
                served: list[int | None] = [ep.context_length] if ep.models else []
            else:
                served = [windows.get(key) for key in ep.models]
            floor = min([floor, *(w for w in served if w is not None)])
        self._learned, self.floor = learned, floor

    async def _ask_show(self, ep: Endpoint) -> None:
        """Every model version of `ep` not seen yet, asked at once; a version another learning
        is asking about now is waited for, not asked again."""
        asks = []
        for m in list(ep.tags):
            name = m.get("model") or m.get("name") or ""
            key = (ep.name, name, str(m.get("digest", "")))
            if not name or key in self._show:
                continue
            task = self._asking.get(key)
            if task is None:
                task = self._asking[key] = asyncio.ensure_future(self._show_one(ep, name, key))
            asks.append(task)
        if asks:  # (shielded: a learning that is cancelled leaves the answer to the others)
            await asyncio.gather(*(asyncio.shield(t) for t in asks))

    async def _show_one(self, ep: Endpoint, name: str, key: tuple[str, str, str]) -> None:
        try:
            status, _, body = await self.upstream.fetch(
                ep, "/api/show", json.dumps({"model": name}).encode(), total=self.timeout
            )
            self._show[key] = _show_window(json.loads(body)) if status == 200 else None
        except Exception as e:  # (asked again at the next learning)
            log.debug("endpoint %s: /api/show %s failed (%s)", ep.name, name, e)
        finally:
            self._asking.pop(key, None)

    def close(self) -> None:
        """Stop asking (shutdown)."""
        for task in list(self._asking.values()):
            task.cancel()
