"""An OpenAI-type backend's answer to an Ollama-API request, in the Ollama API's shape.

A stream's SSE events become NDJSON lines as they come (`upstream/translate.SseToNdjson`),
its error record or a cut ends the stream with an error line; a whole answer is translated
at once, and an error answer becomes an Ollama error object.
"""

from __future__ import annotations

import json
import time

from ... import h1
from ...api.errors import ApiError, error_body
from ...api.requests import GenRequest
from ...backends import translate
from ...h1.errors import ErrorRecord
from ...relay.sinks import ndjson_error
from ...server.asgi import Headers
from ..exchange import Exchange

JSON = b"application/json"


async def stream(
    ex: Exchange, req: GenRequest, resp: h1.Response, first: bytes, headers: Headers, record_limit: int
) -> BaseException | bool:
    """Relay `resp` (a 200 SSE stream whose `first` chunk was read) as NDJSON; False when it
    ended well, else what broke it (the client was told). `record_limit`: max_record_bytes."""
    conv = translate.SseToNdjson(req.kind, req.model, req.t0)
    headers.append((b"content-type", b"application/x-ndjson"))
    await ex.start(200, headers)
    try:
        return await _relay(ex, conv, resp, first, record_limit)
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


async def whole(ex: Exchange, req: GenRequest, status: int, data: bytes, headers: Headers) -> None:
    """The whole answer `data` (of `status`) translated."""
    if status != 200:
        await ex.whole(status, error_body("ollama", status, translate.error_message(data)), headers, JSON)
        return
    try:
        out = translate.response_to_ollama(
            req.kind, json.loads(data), req.model, int((time.perf_counter() - req.t0) * 1e9)
        )
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ApiError(502, f"backend sent a response that could not be translated: {e}") from None
    await ex.whole(200, json.dumps(out).encode(), headers, JSON)
