"""An OpenAI-type backend's answer to an Ollama-API request, in the Ollama API's shape: the
way out `Translated`.

A stream's SSE events become NDJSON lines as they come (`backends/translate.SseToNdjson`),
its error record or a cut ends the stream with an error line; a whole answer is translated
at once, and an error answer becomes an Ollama error object.
"""

from __future__ import annotations

import json
import time

from .. import h1
from ..api.errors import ApiError, error_body
from ..backends import translate
from ..backends.health import Health
from ..events import Events
from ..h1.errors import ErrorRecord
from .base import BackendAnswer
from .exchange import Exchange
from .passthrough import to_its_end
from .sinks import ndjson_error

JSON = b"application/json"


class Translated:
    """`record_limit`: max_record_bytes. A stream's break is the backend's (`passthrough.to_its_end`)."""

    name = "translated"

    def __init__(self, health: Health, events: Events, record_limit: int) -> None:
        self.health, self.events, self.record_limit = health, events, record_limit

    async def deliver(self, ex: Exchange, answer: BackendAnswer) -> None:
        if not answer.first:  # a whole answer (`data`), or an error answer of a stream
            await _whole(ex, answer)
            return
        await to_its_end(ex, answer, self._stream(ex, answer), self.health, self.events)

    async def _stream(self, ex: Exchange, answer: BackendAnswer) -> BaseException | bool:
        """Relay a 200 SSE stream whose first chunk was read as NDJSON; False when it ended
        well, else what broke it (the client was told)."""
        req = answer.req
        conv = translate.SseToNdjson(req.kind, req.model, req.t0)
        answer.headers.append((b"content-type", b"application/x-ndjson"))
        await ex.start(200, answer.headers)
        try:
            return await _relay(ex, conv, answer.resp, answer.first, self.record_limit)
        finally:
            ex.relayed(conv.pieces)  # (the backend's own counts, when it sent them, stand)


async def _relay(
    ex: Exchange, conv: translate.SseToNdjson, resp: h1.Response, first: bytes, record_limit: int
) -> BaseException | bool:
    pending = first
    try:
        while True:
            for line in pending.splitlines(keepends=True):
                out = conv.line(line)
                if out:
                    await ex.body(out)
                    if out.startswith(b'{"error"'):  # the backend's error record, translated: the end
                        await ex.end()
                        return ErrorRecord(line)
            if conv.done:
                await resp.hold(record_limit, False)  # drain what follows [DONE]: reused
                break
            pending = await resp.content.readline(record_limit)
            if not pending:
                break
    except (TimeoutError, h1.ClientError) as e:
        await ex.body(ndjson_error(e))
        await ex.end()
        return e
    await ex.end(conv.final() or b"")
    if isinstance(conv.usage, dict):  # the backend's counts (translation asks for them)
        ex.counted(conv.usage.get("prompt_tokens"), conv.usage.get("completion_tokens"))
    return False


async def _whole(ex: Exchange, answer: BackendAnswer) -> None:
    """The whole answer `data` (of `status`) translated."""
    req, resp, headers = answer.req, answer.resp, answer.headers
    data = answer.data or b""
    resp.release()
    status = resp.status
    try:
        await whole_translated(ex, req.kind, req.model, req.t0, status, data, headers)
    finally:  # (accounting once the answer left, or the client did: the backend did the work)
        if status == 200:
            ex.tokens(data)


async def whole_translated(
    ex: Exchange, kind: str, model: str, t0: float, status: int, data: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    if status != 200:
        await ex.whole(status, error_body("ollama", status, translate.error_message(data)), headers, JSON)
        return
    try:
        out = translate.response_to_ollama(kind, json.loads(data), model, int((time.perf_counter() - t0) * 1e9))
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ApiError(502, f"backend sent a response that could not be translated: {e}") from None
    await ex.whole(200, json.dumps(out).encode(), headers, JSON)
