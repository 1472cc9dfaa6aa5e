"""Model management fanned out to every Ollama endpoint: pull, push, create, copy, delete, blobs.

An operator of several Ollama boxes wants `ollama pull|cp|rm|create` through the router to
change every box. Each call goes to every Ollama-type endpoint (or only those named in an
`X-Router-Endpoints: a,b` header), concurrently:

- pull, create: every target; push, copy, delete: the targets that have the model (after
  one re-discovery if none seems to);
- streamed progress is merged into one NDJSON stream (`backends/progress.py`); `stream:
  false` answers one merged JSON; a final success only when every endpoint succeeded,
  otherwise an error naming the endpoints that failed and why;
- blob uploads (`POST /api/blobs/sha256:…`): `blobs.py`.

With `admin_key` configured these calls need it (403 otherwise); a client key limited to
some models may never make them (`HEAD /api/blobs` included); a key with `rpm` spends one
request per call. They take no generation slot; at most `manage_concurrency` run at once per router
process (more wait). When one finishes, the concerned endpoints' model lists are refreshed,
and every other worker process has applied them (`backends/model_sync.py`), before the
answer goes out: a pulled or copied model is listed and served at once, a deleted one is
gone, whichever worker the next request reaches.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..backends import stream_lines
from ..backends.discovery import Discovery
from ..backends.management_session import ManageSession
from ..backends.progress import ProgressMerge, final
from ..backends.translate import error_message
from ..config import RouterConfig
from ..domain import Endpoint, model_key
from ..server.asgi import Receive, Scope, Send, cancel_on_disconnect, header, read_body, send_response
from .errors import ApiError
from .key_admission import count
from .requests import load_json

if TYPE_CHECKING:  # aiohttp is imported when model management is first used (backends/management_session.py)
    import aiohttp

NDJSON = b"application/x-ndjson"
_MODEL_OPS = {"/api/push": "push", "/api/copy": "copy", "/api/delete": "delete"}  # need the model


class Manager:
    """Model management over the process's Ollama endpoints. `endpoints()` and `config()` are
    read at each call (a reload replaces them); `discovery` refreshes model lists after a
    change; `session` is the aiohttp session these calls use."""

    def __init__(
        self,
        endpoints: Callable[[], Sequence[Endpoint]],
        config: Callable[[], RouterConfig],
        discovery: Discovery | None,
        session: ManageSession,
    ) -> None:
        self.endpoints, self.config, self.discovery, self.session = endpoints, config, discovery, session
        self.permits = asyncio.Semaphore(config().manage_concurrency)  # calls at once, this process

    def authorize(self, scope: Scope) -> None:
        """Changing every backend's models is an operator's act: with `admin_key` set it needs
        that key; a client key limited to some models never may."""
        client = scope.get("nomyo.client")
        if self.config().admin_key is not None:
            if client is None or client.name != "admin":
                raise ApiError(403, "model management needs the admin key (admin_key is set)")
        elif client is not None and client.models is not None:
            raise ApiError(403, "this API key is limited to some models and may not manage models")

    def targets(self, scope: Scope) -> list[Endpoint]:
        """The Ollama endpoints this call goes to: all, or those the header names."""
        endpoints = self.endpoints()
        ollama = [ep for ep in endpoints if ep.type == "ollama"]
        raw = header(scope, b"x-router-endpoints")
        if raw is None:
            if not ollama:
                raise ApiError(
                    501,
                    "model management needs an Ollama-type endpoint; none is configured (or none has answered yet)",
                )
            return ollama
        names = [n.strip() for n in raw.decode("latin-1").split(",") if n.strip()]
        by_name = {ep.name: ep for ep in endpoints}
        unknown = [n for n in names if n not in by_name]
        if unknown or not names:
            raise ApiError(
                400,
                f"X-Router-Endpoints: unknown endpoint(s) {unknown or names!r}; "
                f"known Ollama endpoints: {', '.join(ep.name for ep in ollama) or 'none'}",
            )
        foreign = [n for n in names if by_name[n].type != "ollama"]
        if foreign:
            raise ApiError(
                400,
                f"X-Router-Endpoints: {', '.join(foreign)} not an Ollama-type endpoint; "
                "model management is Ollama's API",
            )
        return [by_name[n] for n in dict.fromkeys(names)]

    async def refresh(self, eps: Sequence[Endpoint]) -> None:
        if self.discovery is not None:
            await self.discovery.refresh(eps)

    async def _having(self, eps: list[Endpoint], model: str, explicit: bool) -> list[Endpoint]:
        """The targets that have `model`; one re-discovery when none seems to."""
        if explicit:
            return eps
        key = model_key(model)
        having = [ep for ep in eps if ep.serves(key)]
        if not having and self.discovery is not None:
            await self.discovery.refresh_now()
            having = [ep for ep in eps if ep.serves(key)]
        if not having:
            raise ApiError(404, f"model '{model}' not found")
        return having

    # ---- JSON routes -------------------------------------------------------------------------
    async def manage(self, scope: Scope, receive: Receive, send: Send) -> None:
        """pull, push, create, copy, delete."""
        self.authorize(scope)
        path, method = scope["path"], scope["method"]
        raw = await read_body(scope, receive, self.config().max_body_bytes)
        body = _body(raw)
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise ApiError(400, "stream must be a boolean")
        eps = self.targets(scope)
        op = path.rsplit("/", 1)[1]
        if path == "/api/copy":
            model = _model(body, "source")
            _model(body, "destination")
        else:
            model = _model(body, "model", "name")
        if path in _MODEL_OPS:
            eps = await self._having(eps, model, header(scope, b"x-router-endpoints") is not None)
        await count(scope)  # (a limited key's rpm, once nothing refused it)
        async with self.permits:
            streamed = stream and op in ("pull", "push", "create")
            work = (
                self._stream(eps, method, path, raw, op, send)
                if streamed
                else self._whole(eps, method, path, raw, op, send)
            )
            await cancel_on_disconnect(work, receive)

    def _timeout(self, streamed: bool) -> aiohttp.ClientTimeout:
        """Lines of progress come often; a whole answer (a non-stream pull) may take hours."""
        import aiohttp

        cfg = self.config()
        return aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.stream_idle_timeout if streamed else None
        )

    async def _whole(self, eps: list[Endpoint], method: str, path: str, raw: bytes, op: str, send: Send) -> None:
        timeout = self._timeout(False)

        async def one(ep: Endpoint) -> tuple[int, bytes, bytes]:
            try:
                async with self.session.get().request(
                    method, ep.url + path, data=raw, headers=ep.headers, timeout=timeout
                ) as r:
                    return r.status, await r.read(), r.headers.get("Content-Type", "").encode()
            except Exception as e:  # one endpoint's failure is reported, never the whole call's
                return 502, json.dumps({"error": why(e)}).encode(), b"application/json"

        results = await asyncio.gather(*(one(ep) for ep in eps))
        await self.refresh(eps)
        names = [ep.name for ep in eps]
        ok = [r for r in results if r[0] < 300]
        failures = {
            ep.name: f"HTTP {s}: {error_message(b)}" for ep, (s, b, _) in zip(eps, results, strict=True) if s >= 300
        }
        if op == "delete" and ok:  # gone there already (our list was stale): nothing left to delete
            failures = {n: w for n, w in failures.items() if not w.startswith("HTTP 404")}
        if not failures:
            status, data, ctype = ok[0]
            await send_response(send, status, data, ctype or b"application/json")
            return
        statuses = {r[0] for r in results if r[0] >= 300}
        status = statuses.pop() if len(statuses) == 1 and not ok else 502
        await send_response(send, status, json.dumps(final(op, names, failures)).encode())

    async def _stream(self, eps: list[Endpoint], method: str, path: str, raw: bytes, op: str, send: Send) -> None:
        merge = ProgressMerge(op, [ep.name for ep in eps])
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()  # progress, or ("fail", why, status) / ("ok",)
        timeout = self._timeout(True)

        async def one(ep: Endpoint) -> None:
            try:
                async with self.session.get().request(
                    method, ep.url + path, data=raw, headers=ep.headers, timeout=timeout
                ) as r:
                    if r.status != 200:
                        await queue.put(
                            (ep.name, ("fail", f"HTTP {r.status}: {error_message(await r.read())}", r.status))
                        )
                        return
                    last = ""
                    async for line in r.content:
                        obj = stream_lines.parse(line)
                        if obj is None:
                            continue
                        if obj.get("error"):
                            await queue.put((ep.name, ("fail", str(obj["error"]), 200)))
                            return
                        last = str(obj.get("status", ""))
                        await queue.put((ep.name, obj))
                    if last != "success":
                        await queue.put((ep.name, ("fail", "the stream ended before success", 200)))
                        return
            except Exception as e:  # whatever it was, this endpoint's part ends (the merge waits for it)
                await queue.put((ep.name, ("fail", why(e), 502)))
                return
            await queue.put((ep.name, ("ok",)))

        tasks = [asyncio.create_task(one(ep)) for ep in eps]
        started = False
        pending: list[bytes] = []  # lines before the stream starts (it starts with the first progress)
        early: list[int] = []  # statuses of failures before any progress
        try:
            for _ in range(len(eps)):
                while True:
                    name, item = await queue.get()
                    if isinstance(item, tuple):
                        break
                    out = merge.line(name, item)
                    if not started:
                        started = True
                        await send(
                            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", NDJSON)]}
                        )
                        for p in pending:
                            await send({"type": "http.response.body", "body": p, "more_body": True})
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                if item[0] == "fail":
                    out = merge.failed(name, item[1])
                    early.append(item[2])
                    if started:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    else:
                        pending.append(out)
            await self.refresh(eps)  # before the last line: a pulled model is served at once
        finally:
            for t in tasks:
                t.cancel()
        result = merge.final()
        if not started:  # every endpoint failed before any progress: an HTTP error like Ollama's
            status = early[0] if len(set(early)) == 1 and early[0] != 200 else 500
            await send_response(send, status, json.dumps(result).encode())
            return
        await send({"type": "http.response.body", "body": json.dumps(result).encode() + b"\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _body(raw: bytes) -> dict[str, Any]:
    body = load_json(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _model(body: dict[str, Any], *fields: str) -> str:
    """The first non-empty of `fields` (the CLI sends `"model": ""` beside the old `name`)."""
    for f in fields:
        v = body.get(f)
        if v is not None and not isinstance(v, str):
            raise ApiError(400, f"{f} must be a string")
        if v and v.strip():
            return v
    raise ApiError(400, f"{fields[0]} is required")


def why(e: BaseException) -> str:
    import aiohttp

    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, aiohttp.ClientConnectorError):
        return "unreachable"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
