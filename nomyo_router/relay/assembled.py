"""A whole answer the backend streamed: collected, then sent in one write (the way out
`Assembled`).

A client that wants a whole answer of chat or completion (`"stream": false`) gets its
backend's stream assembled into one (`relay/whole_from_stream.py`), unless the request bounds its
own length so that a deadline knowing that length fits under `stream_idle_timeout`
(`deadline.Deadlines.whole`; then the backend is asked for a whole answer, as the
client did, the cheapest way). Streamed, the backend is judged as a stream is: by its first
token (the learned first-byte deadline) and then by the silence between two chunks
(`stream_idle_timeout`), never by a guess at how long the whole answer takes — so a long
answer is never cut as hung, and a wedged backend is found within the gap.

Nothing reaches the client until the stream ended. It is collected through the Exchange
(its `send` replaced for the while, the direct writer off), bounded by `max_response_bytes`;
a stream that can be resumed (`continuation.resumable`, resume_streams on) is continued on another
endpoint when the backend cuts it or goes silent, as a client's stream is (resumable.py);
one that cannot is retried elsewhere from the start (nothing was sent yet). When it is cut
on the last endpoint, the client gets a 502 in its API's shape saying why.
"""

from __future__ import annotations

import time
from typing import Any

from .. import h1
from ..api.errors import ApiError
from ..api.requests import GenRequest
from ..backends.translate import error_message
from . import whole_from_stream
from .base import BackendAnswer
from .continuation import Sent, record_end, resumable
from .exchange import Exchange
from .resumable import Resumer
from .sinks import relay_records
from .translated import whole_translated

JSON = b"application/json"


def streamed(req: GenRequest) -> GenRequest:
    """`req` as the stream the router asks for in its place (a continuation is asked the same)."""
    body = whole_from_stream.stream_body(req.api, req.body)
    out = GenRequest(req.api, req.kind, req.path, req.model, True, body, req.raw, req.t0)
    out.session_id, out.client, out.pinned, out.too_small = req.session_id, req.client, req.pinned, req.too_small
    return out


class _Collect:
    """The Exchange's `send` while an answer is assembled: the stream's bytes, up to `limit`."""

    __slots__ = ("parts", "size", "limit")

    def __init__(self, limit: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.limit = limit

    async def __call__(self, message: dict[str, Any]) -> None:
        data = message.get("body")
        if not data:
            return
        self.size += len(data)
        if self.size > self.limit:
            raise ApiError(
                502,
                f"the backend's answer is larger than max_response_bytes ({self.limit} bytes)",
                code="response_too_large",
            )
        self.parts.append(data)


class Assembled:
    """`resumer`: continues a resumable stream elsewhere (None: resume_streams off).
    `limits`: (max_response_bytes, max_record_bytes)."""

    name = "assembled"

    def __init__(self, resumer: Resumer | None, limits: tuple[int, int]) -> None:
        self.resumer, self.limits = resumer, limits

    async def deliver(self, ex: Exchange, answer: BackendAnswer) -> None:
        """Collect a 200 stream whose first chunk was read, then answer the client with the
        whole answer. Raises what broke a stream that could not be resumed (the caller retries
        elsewhere), or an ApiError when it broke on the last endpoint that could continue it."""
        req, resp, translating, limits = answer.req, answer.resp, answer.translating, self.limits
        collect = _Collect(limits[0])
        send, writer = ex.send, ex.writer
        ex.send, ex.writer = collect, None
        rec = ex.rec
        error = rec.error
        try:
            resumer = self.resumer
            if resumer is not None and not translating and resumable(req.api, req.kind, req.body):
                # (its `deliver` directly, not through `Exchange.relay`: the record keeps "assembled")
                again = BackendAnswer(streamed(req), answer.ctx, answer.ep, resp, [], answer.first, b"", False)
                await resumer.deliver(ex, again)
            else:
                await _plain(ex, resp, answer.first, record_end(translating or req.api == "openai"), limits[1])
        finally:
            ex.send, ex.writer = send, writer
        data = b"".join(collect.parts)
        whole_already = dict.get(resp.headers, "content-type", "").startswith("application/json")
        if rec.error != error:  # cut where no other endpoint continued it: its last record says why
            rec.prompt_tokens = rec.completion_tokens = rec.tokens_from = None  # (none reached the client)
            last = data.rstrip().rsplit(b"\n", 1)[-1].removeprefix(b"data:").strip()
            raise ApiError(502, error_message(last), code=rec.error or "upstream_error")
        try:  # (a backend that answered whole though asked for a stream: its answer as it is)
            body = (
                data
                if whole_already
                else whole_from_stream.whole("openai" if translating else req.api, req.kind, data, translating)
            )
        except ValueError as e:
            raise ApiError(
                502, f"backend sent a stream that could not be assembled: {e}", code="upstream_error"
            ) from None
        if whole_already:
            ex.tokens(data)
        out = [h for h in answer.headers if h[0] != b"content-type"]
        rec.ttft_s = time.perf_counter() - req.t0  # (a whole answer's first byte is all of it)
        if translating:
            await whole_translated(ex, req.kind, req.model, req.t0, 200, body, out)
        elif not ex.written(200, body, out, JSON):
            await ex.whole_asgi(200, body, out)


async def _plain(ex: Exchange, resp: h1.Response, first: bytes, sep: bytes, record_limit: int) -> None:
    """Collect the stream as it is; what breaks it is raised (nothing went to the client)."""
    sent = Sent(False, sep)
    try:
        broke = await relay_records(resp, first, sep, None, sent, ex.body, None, None, None, record_limit)
        if broke is not None:
            raise broke
    except BaseException:
        resp.close()  # the client left, or the backend broke: the connection is not reused
        raise
    resp.release()
    ex.tokens(sent.last())
    ex.relayed(sent.records)  # (the backend's own counts, when it sent them, stand)
