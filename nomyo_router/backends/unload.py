"""Unloading a model everywhere: `keep_alive: 0` with nothing to generate.

What `ollama stop MODEL` and Open WebUI send is a chat or generate request with no messages
(or an empty prompt) and `keep_alive: 0`. Sent to one backend, it would unload the model
there only; the router sends it to every Ollama endpoint that has the model loaded
(fresh `/api/ps`, at most 1 s old), concurrently, without taking a generation slot, and
answers with the first backend's answer (or, when none had it loaded, as Ollama does for
a model that is not loaded: one endpoint serving it answers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .. import h1
from ..domain import Endpoint, model_key

TIMEOUT = 30.0


def is_unload(kind: str, api: str, body: dict[str, Any]) -> bool:
    if api != "ollama" or kind not in ("chat", "generate"):
        return False
    if body.get("keep_alive") not in (0, "0", "0s", "0m"):
        return False
    return not body.get("messages") and not body.get("prompt")


async def unload(
    upstream: h1.Upstream, endpoints: Sequence[Endpoint], path: str, key: str, raw: bytes
) -> tuple[int, bytes]:
    loaded = [ep for ep in endpoints if ep.type == "ollama" and key in ep.loaded]
    targets = loaded or [ep for ep in endpoints if ep.type == "ollama" and ep.serves(key)][:1]

    async def one(ep: Endpoint) -> tuple[int, bytes]:
        status, _, body = await upstream.fetch(ep, path, raw, total=TIMEOUT)
        if status == 200:  # what /api/ps shows changes with it, without waiting for a refresh
            ep.loaded = ep.loaded - {key}
            ep.ps = [m for m in ep.ps if model_key(str(m.get("model") or m.get("name") or "")) != key]
        return status, body

    results = await asyncio.gather(*(one(ep) for ep in targets), return_exceptions=True)
    answers = [r for r in results if isinstance(r, tuple)]
    ok = [a for a in answers if a[0] == 200]
    if ok:
        return ok[0]
    if answers:
        return answers[0]
    return 502, b'{"error":"no endpoint could unload the model"}'
