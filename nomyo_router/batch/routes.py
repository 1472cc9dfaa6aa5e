"""The Batch API's routes, as the `openai` SDK calls them: `/v1/files` and `/v1/batches`.

Files and batches belong to the client key that made them: another key gets 404 as if they
did not exist; the admin key sees all. An open router (no keys) has one owner, "".
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from ..api.errors import ApiError
from ..server.asgi import BodyTooLarge, Receive, Scope, Send, header, read_body, send_response
from . import objects
from .intake import ENDPOINTS, read_lines, upload
from .service import Batches

_UPLOAD_SLACK = 64 * 1024  # the multipart framing around a file of max_file_bytes
MAX_BODY = 64 * 1024  # a batch's create body: ids and metadata


def _who(scope: Scope) -> tuple[str, bool]:
    """(the caller's key's name, whether it sees every owner's)."""
    client = scope.get("nomyo.client")
    if client is None:
        return "", False
    return client.name, client.role == "admin"


def _query(scope: Scope) -> dict[str, str]:
    qs = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return {k: v[-1] for k, v in qs.items()}


def _limit(q: dict[str, str], default: int) -> int:
    try:
        n = int(q.get("limit", default))
    except ValueError:
        raise ApiError(400, "limit must be an integer", param="limit") from None
    if not 1 <= n <= 10_000:
        raise ApiError(400, "limit must be between 1 and 10000", param="limit")
    return n


def _tail(path: str, prefix: str) -> list[str]:
    return path[len(prefix) :].split("/")


Handler = Callable[["BatchRoutes", Scope, Receive, Send], Awaitable[None]]


def guarded(fn: Handler) -> Handler:
    """The store away (Redis down, a file locked past its timeout): 503 in OpenAI's shape,
    not a 500 and a traceback per request."""

    @functools.wraps(fn)
    async def handler(self: BatchRoutes, scope: Scope, receive: Receive, send: Send) -> None:
        errors = self.b.store.errors if self.b is not None else ()
        try:
            await fn(self, scope, receive, send)
        except errors as e:
            raise ApiError(
                503, f"the batch store is unavailable ({type(e).__name__}); try again", code="batch_store_unavailable"
            ) from None

    return handler


async def _json(send: Send, obj: Any, status: int = 200) -> None:
    await send_response(send, status, json.dumps(obj).encode())


class BatchRoutes:
    def __init__(self, batches: Batches | None) -> None:
        self.b = batches

    def _on(self) -> Batches:
        if self.b is None:
            raise ApiError(404, "the Batch API is off: set batch: {enabled: true} in the config")
        return self.b

    # ---- files ---------------------------------------------------------------------------------
    @guarded
    async def file_create(self, scope: Scope, receive: Receive, send: Send) -> None:
        b = self._on()
        limit = b.settings.max_file_bytes
        try:
            raw = await read_body(scope, receive, limit + _UPLOAD_SLACK)
        except BodyTooLarge:
            raise ApiError(413, f"the file exceeds batch.max_file_bytes ({limit} bytes)") from None
        fields, content, filename = upload(header(scope, b"content-type"), raw)
        if len(content) > limit:
            raise ApiError(413, f"the file exceeds batch.max_file_bytes ({limit} bytes)")
        if fields.get("purpose") != "batch":
            raise ApiError(400, "purpose must be 'batch' (this router keeps batch files only)", param="purpose")
        obj = objects.file_object(filename, "batch", len(content), time.time(), b.settings.retention)
        await b.store.put_file(obj, _who(scope)[0], content)
        await _json(send, obj)

    @guarded
    async def file_list(self, scope: Scope, receive: Receive, send: Send) -> None:
        b = self._on()
        owner, admin = _who(scope)
        q = _query(scope)
        limit = _limit(q, 10_000)
        rows = await b.store.list_files(
            None if admin else owner,
            q.get("purpose"),
            q.get("after"),
            limit + 1,
            q.get("order") != "asc",
        )
        await _json(send, objects.listing(rows[:limit], len(rows) > limit))

    async def _file(self, scope: Scope, file_id: str) -> dict[str, Any]:
        b = self._on()
        found = await b.store.get_file(file_id)
        owner, admin = _who(scope)
        if found is None or not (admin or found[1] == owner):
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return found[0]

    @guarded
    async def file_get(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = _tail(scope["path"], "/v1/files/")
        if len(parts) == 1:
            await _json(send, await self._file(scope, parts[0]))
        elif len(parts) == 2 and parts[1] == "content":
            await self._file(scope, parts[0])
            b = self._on()
            content = await b.store.content(parts[0])
            if content is None:
                raise ApiError(404, f"No such File object: {parts[0]}", param="id")
            await send_response(send, 200, content, b"application/octet-stream")
        else:
            raise ApiError(404, f"no route for GET {scope['path']}")

    @guarded
    async def file_delete(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = _tail(scope["path"], "/v1/files/")
        if len(parts) != 1:
            raise ApiError(404, f"no route for DELETE {scope['path']}")
        await self._file(scope, parts[0])
        b = self._on()
        await b.store.delete_file(parts[0])
        await _json(send, {"id": parts[0], "object": "file", "deleted": True})

    # ---- batches -------------------------------------------------------------------------------
    @guarded
    async def batch_create(self, scope: Scope, receive: Receive, send: Send) -> None:
        b = self._on()
        try:
            raw = await read_body(scope, receive, MAX_BODY)
        except BodyTooLarge:
            raise ApiError(413, f"the body exceeds {MAX_BODY} bytes") from None
        try:
            body = json.loads(raw)
        except ValueError:
            raise ApiError(400, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        endpoint, window, meta = body.get("endpoint"), body.get("completion_window"), body.get("metadata")
        if endpoint not in ENDPOINTS:
            raise ApiError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
        if window != "24h":
            raise ApiError(400, "completion_window must be '24h'", param="completion_window")
        if meta is not None and not (
            isinstance(meta, dict)
            and len(meta) <= 16
            and all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in meta.items()
            )
        ):
            raise ApiError(400, "metadata: at most 16 string keys (64 characters) and values (512)", param="metadata")
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str):
            raise ApiError(400, "input_file_id must be a file's id", param="input_file_id")
        f = await self._file(scope, file_id)
        if f["purpose"] != "batch":
            raise ApiError(400, f"file {file_id} has purpose {f['purpose']!r}, not 'batch'", param="input_file_id")
        content = await b.store.content(file_id) or b""
        lines, errors = await asyncio.to_thread(read_lines, content, endpoint, b.settings.max_lines)
        now = time.time()
        obj = objects.batch_object(file_id, endpoint, window, meta, now)
        if errors:
            obj.update(status="failed", failed_at=int(now), errors={"object": "list", "data": errors})
            lines = []
        else:
            failed = sum(1 for line in lines if line[4] is not None)
            obj.update(status="in_progress", in_progress_at=int(now))
            obj["request_counts"] = {"total": len(lines), "completed": 0, "failed": failed}
        await b.store.create_batch(obj, _who(scope)[0], lines)
        b.runner.poke()
        await _json(send, obj)

    async def _batch(self, scope: Scope, batch_id: str) -> dict[str, Any]:
        b = self._on()
        found = await b.store.get_batch(batch_id)
        owner, admin = _who(scope)
        if found is None or not (admin or found[1] == owner):
            raise ApiError(404, f"No such Batch object: {batch_id}", param="id")
        return await self._current(found[0])

    async def _current(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A running batch's counts as they are now."""
        b = self._on()
        if obj["status"] in ("in_progress", "cancelling", "finalizing"):
            obj["request_counts"] = objects.request_counts(await b.store.counts(obj["id"]))
        return obj

    @guarded
    async def batch_list(self, scope: Scope, receive: Receive, send: Send) -> None:
        b = self._on()
        owner, admin = _who(scope)
        q = _query(scope)
        limit = _limit(q, 20)
        rows = await b.store.list_batches(None if admin else owner, q.get("after"), limit + 1)
        data = [await self._current(o) for o in rows[:limit]]
        await _json(send, objects.listing(data, len(rows) > limit))

    @guarded
    async def batch_get(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = _tail(scope["path"], "/v1/batches/")
        if len(parts) != 1:
            raise ApiError(404, f"no route for GET {scope['path']}")
        await _json(send, await self._batch(scope, parts[0]))

    @guarded
    async def batch_cancel(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = _tail(scope["path"], "/v1/batches/")
        if len(parts) != 2 or parts[1] != "cancel":
            raise ApiError(404, f"no route for POST {scope['path']}")
        b = self._on()
        obj = await self._batch(scope, parts[0])
        if obj["status"] in ("validating", "in_progress"):
            obj.update(status="cancelling", cancelling_at=int(time.time()))
            if not await b.store.save_batch(obj, ("validating", "in_progress")):
                obj = await self._batch(scope, parts[0])  # (it ended meanwhile)
            b.runner.poke()
        elif obj["status"] != "cancelling":
            raise ApiError(409, f"Cannot cancel a batch with status {obj['status']}", param="id")
        await _json(send, obj)
