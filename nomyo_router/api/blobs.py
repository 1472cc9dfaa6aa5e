"""Blobs for model management (`HEAD` and `POST /api/blobs/sha256:…`), to every Ollama endpoint
the call targets (`manage.py`: who may, which endpoints, how many calls at once).

An upload streams the request body to each target that lacks the blob, as it arrives, with
backpressure: each piece is held once (shared by the per-endpoint queues, at most `_QUEUE`
pieces ahead of the slowest endpoint), never the whole blob. `max_body_bytes` (a bound on JSON
bodies the router reads into memory) does not apply: a multi-GB GGUF must pass.
`body_idle_timeout` still closes a stalled upload; `body_timeout` (a whole body's time) does
not apply to it. `HEAD` is model management too: the same keys, the same `manage_concurrency`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

from ..backends.progress import describe
from ..backends.translate import error_message
from ..domain import Endpoint
from ..server.asgi import STREAMED_BODY, ClientGone, Receive, Scope, Send, header, send_response
from .errors import ApiError
from .key_admission import count
from .manage import Manager, why

_QUEUE = 8  # body pieces queued per endpoint ahead of its upload
_DIGEST = re.compile(r"^sha256[:-][0-9a-f]{64}$")


class Blobs:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager

    async def head(self, scope: Scope, receive: Receive, send: Send) -> None:
        """200 only when every target has the blob (so a client uploads it when one lacks it)."""
        manager = self.manager
        manager.authorize(scope)  # (which blobs the backends hold is model management's to know)
        digest = _digest(scope)
        eps = manager.targets(scope)
        await count(scope)
        async with manager.permits:
            statuses = await self._heads(eps, digest)
        await send_response(send, 200 if all(s == 200 for s in statuses) else 404, b"")

    async def post(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self.manager
        manager.authorize(scope)
        digest = _digest(scope)
        eps = manager.targets(scope)
        await count(scope)
        scope[STREAMED_BODY] = True  # (a GGUF may take hours to arrive: only body_idle_timeout bounds it)
        async with manager.permits:
            statuses = await self._heads(eps, digest)
            need = [ep for ep, s in zip(eps, statuses, strict=True) if s != 200]
            if not need:  # every target has it already: like Ollama, 200 without reading the body
                await send_response(send, 200, b"")
                return
            results = await self._upload(scope, receive, need, digest)
        await send_response(send, *_blob_answer(eps, need, results))

    async def _heads(self, eps: list[Endpoint], digest: str) -> list[int]:
        import aiohttp

        cfg = self.manager.config()
        timeout = aiohttp.ClientTimeout(total=cfg.connect_timeout + cfg.health_timeout)
        session = self.manager.session

        async def one(ep: Endpoint) -> int:
            try:
                async with session.get().head(
                    ep.url + "/api/blobs/" + digest, headers=ep.headers, timeout=timeout
                ) as r:
                    status: int = r.status
                    return status
            except (aiohttp.ClientError, TimeoutError):
                return 502

        return list(await asyncio.gather(*(one(ep) for ep in eps)))

    async def _upload(self, scope: Scope, receive: Receive, need: list[Endpoint], digest: str) -> list[tuple[int, str]]:
        """Stream the request body to every endpoint in `need` at once (see the module doc)."""
        import aiohttp

        cfg = self.manager.config()
        session = self.manager.session
        length = header(scope, b"content-length")
        queues = [asyncio.Queue[bytes | None](_QUEUE) for _ in need]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.first_byte_timeout)

        async def pieces(q: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
            while (piece := await q.get()) is not None:
                yield piece

        async def one(ep: Endpoint, q: asyncio.Queue[bytes | None]) -> tuple[int, str]:
            headers = {**ep.headers, "Content-Type": "application/octet-stream"}
            if length is not None:
                headers["Content-Length"] = length.decode("latin-1")
            try:
                async with session.get().post(
                    ep.url + "/api/blobs/" + digest, data=pieces(q), headers=headers, timeout=timeout
                ) as r:
                    body = await r.read()
                    return r.status, "" if r.status < 300 else f"HTTP {r.status}: {error_message(body)}"
            except (aiohttp.ClientError, TimeoutError) as e:
                return 502, why(e)

        tasks = [asyncio.create_task(one(ep, q)) for ep, q in zip(need, queues, strict=True)]
        try:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise ClientGone
                piece = msg.get("body", b"")
                more = msg.get("more_body", False)
                for q, t in zip(queues, tasks, strict=True):
                    if piece and not t.done():
                        await _put(q, piece, t)
                if not more:
                    for q, t in zip(queues, tasks, strict=True):
                        if not t.done():
                            await _put(q, None, t)
                    break
            return list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()


def _digest(scope: Scope) -> str:
    digest: str = scope["path"][len("/api/blobs/") :]
    if not _DIGEST.match(digest):
        raise ApiError(400, f"invalid digest {digest[:80]!r}: expected sha256:<64 hex digits>")
    return digest


def _blob_answer(eps: list[Endpoint], need: list[Endpoint], results: list[tuple[int, str]]) -> tuple[int, bytes]:
    failures = {ep.name: reason for ep, (s, reason) in zip(need, results, strict=True) if s >= 300}
    if not failures:
        return 201, b""
    statuses = {s for s, _ in results if s >= 300}
    status = statuses.pop() if len(statuses) == 1 and len(failures) == len(eps) else 502
    return status, json.dumps({"error": describe("blob upload", [ep.name for ep in eps], failures)}).encode()


async def _put(q: asyncio.Queue[bytes | None], piece: bytes | None, task: asyncio.Task[tuple[int, str]]) -> None:
    """Queue a piece for one endpoint, unless its upload ends first (then it needs no more)."""
    put = asyncio.ensure_future(q.put(piece))
    done, _ = await asyncio.wait({put, task}, return_when=asyncio.FIRST_COMPLETED)
    if put not in done:
        put.cancel()
