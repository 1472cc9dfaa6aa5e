"""What is sent to a backend for a request: the client's bytes as they came where they can
be, else the body rewritten — translated to the OpenAI API, the backend's own model name,
usage asked for on the client's behalf, or a stream asked for in place of a whole answer."""

from __future__ import annotations

import json

from ..api.requests import GenRequest
from ..domain import Endpoint
from ..relay import token_counts, whole_from_stream
from ..relay.continuation import resumable


def plan(req: GenRequest, ep: Endpoint, strip: bool, streamed: bool) -> tuple[str, bytes, bool]:
    """(path, body, translate) for sending `req` to `ep`; `strip`: ask for usage (see
    `strips_usage`); `streamed`: ask for a stream of a whole answer (relay/assembled.py)."""
    if ep.type == "openai" and req.api == "ollama":
        # (imported by the first request that needs it; names, not the module: a compiled
        # function's `from package import module` does not see the module)
        from ..backends.translate import OPENAI_PATH, request_to_openai

        body = request_to_openai(req.kind, req.body, ep.models[req.key], req.stream or streamed)
        return OPENAI_PATH[req.kind], body, True
    if streamed:
        model = ep.models[req.key] if ep.type == "openai" else None
        return req.path, json.dumps(whole_from_stream.stream_body(req.api, req.body, model)).encode(), False
    raw = req.raw
    if ep.type == "openai" and req.model != ep.models[req.key] and req.ctype is None:
        raw = json.dumps({**req.body, "model": ep.models[req.key]}).encode()
    if strip:
        raw = token_counts.ask(raw, req.body)  # counted, then stripped again (relay/resumable.py)
    return req.path, raw, False


def strips_usage(req: GenRequest) -> bool:
    """An OpenAI stream whose client did not ask for usage: ask for it anyway and take it out
    of what the client gets (only on the record-wise relay, i.e. with resume_streams: the
    caller says whether it is on)."""
    return (
        req.api == "openai"
        and req.stream
        and resumable(req.api, req.kind, req.body)
        and not token_counts.wants(req.body)
    )
