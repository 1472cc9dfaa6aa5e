"""Model management fanned out to every Ollama endpoint: pull, push, create, copy, delete, blobs.

An operator of several Ollama boxes wants `ollama pull|cp|rm|create` through the router to
change every box. Each call goes to every Ollama-type endpoint (or only those named in an
`X-Router-Endpoints: a,b` header), concurrently:

- pull, create: every target; push, copy, delete: the targets that have the model (after
  one re-discovery if none seems to);
- streamed progress is merged into one NDJSON stream (`upstream/progress.py`); `stream:
  false` answers one merged JSON; a final success only when every endpoint succeeded,
  otherwise an error naming the endpoints that failed and why;
- blob uploads (`POST /api/blobs/sha256:…`) stream the request body to each target that
  lacks the blob, as it arrives, with backpressure: each piece is held once (shared by the
  per-endpoint queues, at most `_QUEUE` pieces ahead of the slowest endpoint), never the
  whole blob. `max_body_bytes` (a bound on JSON bodies the router reads into memory) does
  not apply: a multi-GB GGUF must pass. `body_idle_timeout` still closes a stalled upload.

With `admin_key` configured these calls need it (403 otherwise); a client key limited to
some models may never make them. They take no generation slot; at most `manage_concurrency` run at once per router
process (more wait). When one finishes, the concerned endpoints' model lists are refreshed,
and every other worker process has applied them (`upstream/model_sync.py`), before the
answer goes out: a pulled or copied model is listed and served at once, a deleted one is
gone, whichever worker the next request reaches.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from ..domain import Endpoint, model_key
from ..upstream import records
from ..upstream.progress import ProgressMerge, describe, final
from ..upstream.translate import error_message
from .asgi import ClientGone, Receive, Scope, Send, cancel_on_disconnect, header, read_body, send_response
from .errors import ApiError
from .requests import load_json

if TYPE_CHECKING:  # aiohttp is imported when model management is first used (upstream/session.py)
    import aiohttp

NDJSON = b"application/x-ndjson"
_QUEUE = 8  # body pieces queued per endpoint ahead of its upload
_DIGEST = re.compile(r"^sha256[:-][0-9a-f]{64}$")
_MODEL_OPS = {"/api/push": "push", "/api/copy": "copy", "/api/delete": "delete"}  # need the model


def _permits(router: Any) -> asyncio.Semaphore:
    sem = getattr(router, "_manage_permits", None)
    if sem is None:
        sem = router._manage_permits = asyncio.Semaphore(router.config.manage_concurrency)
    return sem


def authorize(router: Any, scope: Scope) -> None:
    """Changing every backend's models is an operator's act: with `admin_key` set it needs
    that key; a client key limited to some models never may."""
    client = scope.get("nomyo.client")
    if router.config.admin_key is not None:
        if client is None or client.name != "admin":
            raise ApiError(403, "model management needs the admin key (admin_key is set)")
    elif client is not None and client.models is not None:
        raise ApiError(403, "this API key is limited to some models and may not manage models")


def targets(router: Any, scope: Scope) -> list[Endpoint]:
    """The Ollama endpoints this call goes to: all, or those the header names."""
    ollama = [ep for ep in router.endpoints if ep.type == "ollama"]
    raw = header(scope, b"x-router-endpoints")
    if raw is None:
        if not ollama:
            raise ApiError(
                501, "model management needs an Ollama-type endpoint; none is configured (or none has answered yet)"
            )
        return ollama
    names = [n.strip() for n in raw.decode("latin-1").split(",") if n.strip()]
    by_name = {ep.name: ep for ep in router.endpoints}
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
            f"X-Router-Endpoints: {', '.join(foreign)} not an Ollama-type endpoint; model management is Ollama's API",
        )
    return [by_name[n] for n in dict.fromkeys(names)]


async def _having(router: Any, eps: list[Endpoint], model: str, explicit: bool) -> list[Endpoint]:
    """The targets that have `model`; one re-discovery when none seems to."""
    if explicit:
        return eps
    key = model_key(model)
    having = [ep for ep in eps if ep.serves(key)]
    if not having and router.discovery is not None:
        await router.discovery.refresh_now()
        having = [ep for ep in eps if ep.serves(key)]
    if not having:
        raise ApiError(404, f"model '{model}' not found")
    return having


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


# ---- JSON routes -----------------------------------------------------------------------------
async def manage(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    router = app.current()
    authorize(router, scope)
    path, method = scope["path"], scope["method"]
    raw = await read_body(scope, receive, router.config.max_body_bytes)
    body = _body(raw)
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be a boolean")
    eps = targets(router, scope)
    op = path.rsplit("/", 1)[1]
    if path == "/api/copy":
        model = _model(body, "source")
        _model(body, "destination")
    else:
        model = _model(body, "model", "name")
    if path in _MODEL_OPS:
        eps = await _having(router, eps, model, header(scope, b"x-router-endpoints") is not None)
    async with _permits(router):
        streamed = stream and op in ("pull", "push", "create")
        work = (
            _stream(router, eps, method, path, raw, op, send)
            if streamed
            else _whole(router, eps, method, path, raw, op, send)
        )
        await cancel_on_disconnect(work, receive)


def _timeout(router: Any, streamed: bool) -> aiohttp.ClientTimeout:
    """Lines of progress come often; a whole answer (a non-stream pull) may take hours."""
    import aiohttp

    cfg = router.config
    return aiohttp.ClientTimeout(
        total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.stream_idle_timeout if streamed else None
    )


async def _refresh(router: Any, eps: Sequence[Endpoint]) -> None:
    if router.discovery is not None:
        await router.discovery.refresh(eps)


async def _whole(router: Any, eps: list[Endpoint], method: str, path: str, raw: bytes, op: str, send: Send) -> None:
    timeout = _timeout(router, False)

    async def one(ep: Endpoint) -> tuple[int, bytes, bytes]:
        try:
            async with router.manage_session.get().request(
                method, ep.url + path, data=raw, headers=ep.headers, timeout=timeout
            ) as r:
                return r.status, await r.read(), r.headers.get("Content-Type", "").encode()
        except Exception as e:  # one endpoint's failure is reported, never the whole call's
            return 502, json.dumps({"error": _why(e)}).encode(), b"application/json"

    results = await asyncio.gather(*(one(ep) for ep in eps))
    await _refresh(router, eps)
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


async def _stream(router: Any, eps: list[Endpoint], method: str, path: str, raw: bytes, op: str, send: Send) -> None:
    merge = ProgressMerge(op, [ep.name for ep in eps])
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    timeout = _timeout(router, True)

    async def one(ep: Endpoint) -> None:
        try:
            async with router.manage_session.get().request(
                method, ep.url + path, data=raw, headers=ep.headers, timeout=timeout
            ) as r:
                if r.status != 200:
                    await queue.put((ep.name, ("fail", f"HTTP {r.status}: {error_message(await r.read())}", r.status)))
                    return
                last = ""
                async for line in r.content:
                    obj = records.parse(line)
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
            await queue.put((ep.name, ("fail", _why(e), 502)))
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
                    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", NDJSON)]})
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
        await _refresh(router, eps)  # before the last line: a pulled model is served at once
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


def _why(e: BaseException) -> str:
    import aiohttp

    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, aiohttp.ClientConnectorError):
        return "unreachable"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# ---- blobs ---------------------------------------------------------------------------------
def _digest(scope: Scope) -> str:
    digest: str = scope["path"][len("/api/blobs/") :]
    if not _DIGEST.match(digest):
        raise ApiError(400, f"invalid digest {digest[:80]!r}: expected sha256:<64 hex digits>")
    return digest


async def _heads(router: Any, eps: list[Endpoint], digest: str) -> list[int]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=router.config.connect_timeout + router.config.health_timeout)

    async def one(ep: Endpoint) -> int:
        try:
            async with router.manage_session.get().head(
                ep.url + "/api/blobs/" + digest, headers=ep.headers, timeout=timeout
            ) as r:
                status: int = r.status
                return status
        except (aiohttp.ClientError, TimeoutError):
            return 502

    return list(await asyncio.gather(*(one(ep) for ep in eps)))


async def blob_head(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    """200 only when every target has the blob (so a client uploads it when one lacks it)."""
    router = app.current()
    digest = _digest(scope)
    statuses = await _heads(router, targets(router, scope), digest)
    await send_response(send, 200 if all(s == 200 for s in statuses) else 404, b"")


async def blob_post(app: Any, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
    router = app.current()
    authorize(router, scope)
    digest = _digest(scope)
    eps = targets(router, scope)
    async with _permits(router):
        statuses = await _heads(router, eps, digest)
        need = [ep for ep, s in zip(eps, statuses, strict=True) if s != 200]
        if not need:  # every target has it already: like Ollama, 200 without reading the body
            await send_response(send, 200, b"")
            return
        results = await _upload(router, scope, receive, need, digest)
    await send_response(send, *_blob_answer(eps, need, results))


def _blob_answer(eps: list[Endpoint], need: list[Endpoint], results: list[tuple[int, str]]) -> tuple[int, bytes]:
    failures = {ep.name: why for ep, (s, why) in zip(need, results, strict=True) if s >= 300}
    if not failures:
        return 201, b""
    statuses = {s for s, _ in results if s >= 300}
    status = statuses.pop() if len(statuses) == 1 and len(failures) == len(eps) else 502
    return status, json.dumps({"error": describe("blob upload", [ep.name for ep in eps], failures)}).encode()


async def _upload(
    router: Any, scope: Scope, receive: Receive, need: list[Endpoint], digest: str
) -> list[tuple[int, str]]:
    """Stream the request body to every endpoint in `need` at once (see the module doc)."""
    import aiohttp

    length = header(scope, b"content-length")
    queues = [asyncio.Queue[bytes | None](_QUEUE) for _ in need]
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=router.config.connect_timeout, sock_read=router.config.first_byte_timeout
    )

    async def pieces(q: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
        while (piece := await q.get()) is not None:
            yield piece

    async def one(ep: Endpoint, q: asyncio.Queue[bytes | None]) -> tuple[int, str]:
        headers = {**ep.headers, "Content-Type": "application/octet-stream"}
        if length is not None:
            headers["Content-Length"] = length.decode("latin-1")
        try:
            async with router.manage_session.get().post(
                ep.url + "/api/blobs/" + digest, data=pieces(q), headers=headers, timeout=timeout
            ) as r:
                body = await r.read()
                return r.status, "" if r.status < 300 else f"HTTP {r.status}: {error_message(body)}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return 502, _why(e)

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


async def _put(q: asyncio.Queue[bytes | None], piece: bytes | None, task: asyncio.Task[tuple[int, str]]) -> None:
    """Queue a piece for one endpoint, unless its upload ends first (then it needs no more)."""
    put = asyncio.ensure_future(q.put(piece))
    done, _ = await asyncio.wait({put, task}, return_when=asyncio.FIRST_COMPLETED)
    if put not in done:
        put.cancel()


ROUTES = {
    ("POST", "/api/pull"): manage,
    ("POST", "/api/push"): manage,
    ("POST", "/api/create"): manage,
    ("POST", "/api/copy"): manage,
    ("DELETE", "/api/delete"): manage,
}
PREFIX = [("HEAD", "/api/blobs/", blob_head), ("POST", "/api/blobs/", blob_post)]
