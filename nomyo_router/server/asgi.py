"""Thin ASGI helpers: read a bounded body, send a whole response. No framework on the hot path."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .body_budget import BodyBudget

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON = b"application/json"
# Set in the scope by nomyo_router.server.protocol (the server the CLI runs): the protocol calls the
# function stored there when the client's connection is lost, so no task per request has
# to sit in `receive()` to notice a disconnect.
DISCONNECT_HOOK = "nomyo.on_disconnect"
# What the protocol leaves under DISCONNECT_HOOK when the client left while no hook was set
# (between two waits of the app): the next `cancel_on_disconnect` does not start its work.
GONE = "gone"
# Set in the scope by nomyo_router.server.protocol: a `body_writer.BodyWriter` that writes a relayed
# stream's pieces straight to the client's transport (relay/sinks.py).
BODY_WRITER = "nomyo.body_writer"
# Set in the scope by an answer that never ends on its own (GET /api/usage-stream): the protocol
# calls it when the server begins to stop, so the answer ends then instead of holding the
# graceful shutdown for all of shutdown_grace.
SHUTDOWN_HOOK = "nomyo.on_shutdown"
# Set in the scope by a route that streams its body through as it arrives (a blob upload, GBs
# long): the protocol's total body deadline (`body_timeout`) then does not apply to it, only
# the idle one (`body_idle_timeout`).
STREAMED_BODY = "nomyo.streamed_body"


class BodyTooLarge(Exception):
    """A body beyond its limit (`limit`: bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds {limit} bytes")
        self.limit = limit


class ClientGone(Exception):
    pass


async def read_body(scope: Scope, receive: Receive, limit: int, budget: BodyBudget | None = None) -> bytes:
    """The whole body, at most `limit` bytes (BodyTooLarge beyond). `budget`: the body is
    charged to it (OverBudget, nothing charged, when it has no room): its declared length
    before it is read, its length once read; the caller gives it back."""
    declared = 0
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                pass
            if declared > limit:
                raise BodyTooLarge(limit)
            break
    if budget is not None and declared > 0:
        budget.take(declared)  # (before the first byte is read)
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(limit)
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
    except BaseException:
        if budget is not None and declared > 0:
            budget.give(declared)
        raise
    if budget is not None and size != declared:  # (no content-length: charged once read)
        if declared > 0:
            budget.give(declared)
        budget.take(size)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_response(
    send: Send, status: int, body: bytes, content_type: bytes = JSON, headers: Headers | None = None
) -> None:
    h: Headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if headers:
        h.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": h})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> bytes | None:
    headers: Headers = scope["headers"]
    for k, v in headers:
        if k == name:
            return v
    return None


def with_headers(scope: Scope, send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """`send` adding `extra` to the response head. The protocol's direct writer (it writes
    around `send`) is taken out of `scope`: this request's answer takes the ASGI path."""
    scope.pop(BODY_WRITER, None)

    async def wrapped(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [*msg.get("headers", []), *extra]}
        await send(msg)

    return wrapped


async def cancel_on_disconnect(work: Awaitable[None], receive: Receive, scope: Scope | None = None) -> bool:
    """Run `work`; if the client disconnects first, cancel it (which frees its slot or queue
    place and closes the upstream request). A disconnect is never a backend failure. Our
    protocol reports the disconnect through the scope's hook; under another server a
    watcher task waits in `receive()` for it. True when the client left before `work` ended."""
    task = asyncio.current_task()
    assert task is not None
    finished = False
    gone = False

    def lost() -> None:
        nonlocal gone
        if not finished:
            gone = True
            task.cancel()

    hooked = scope is not None and DISCONNECT_HOOK in scope
    watcher = None
    if hooked:
        if scope[DISCONNECT_HOOK] is GONE:  # type: ignore[index]  # the client left already
            if asyncio.iscoroutine(work):
                work.close()
            return True
        scope[DISCONNECT_HOOK] = lost  # type: ignore[index]
    else:
        watcher = asyncio.get_running_loop().create_task(_watch(receive, lost))
    try:
        await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
    finally:
        finished = True
        if watcher is not None:
            watcher.cancel()
        elif hooked:
            scope[DISCONNECT_HOOK] = None  # type: ignore[index]
    return gone


async def _watch(receive: Receive, lost: Callable[[], None]) -> None:
    """Under another server: wait in `receive()` for the client's disconnect, then call `lost`."""
    while (await receive())["type"] != "http.disconnect":
        pass
    lost()


class Whole:
    """A `send` that keeps a whole answer (its status and body), for a request the router
    makes itself: an ensemble's step, the semantic cache's embedding."""

    def __init__(self) -> None:
        self.status = 0
        self.chunks: list[bytes] = []

    async def send(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            self.status = msg["status"]
        elif msg["type"] == "http.response.body":
            self.chunks.append(msg.get("body", b""))

    def body(self) -> bytes:
        return b"".join(self.chunks)
